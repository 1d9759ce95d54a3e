"""Shared fixtures: tiny upstream-format checkpoints written once per test session."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

# Under pytest-xdist (`-n 2`, the README's command) each worker takes its share of the cores: two workers
# with a thread per core each oversubscribe a 2-core machine (the suite: 537 s, against 384 s with one
# thread each and 478 s without workers). Set before torch (and numpy's BLAS) start their thread pools;
# the subprocesses the tests start (torchrun, the Triton interpreter) inherit it.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ["OMP_NUM_THREADS"] = str(max(1, _cores // _WORKERS))

import torch  # noqa: E402

if _WORKERS > 1:  # in case a plugin imported torch before this file
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# every tree the suite verifies is checked for prefix-closure (one extra host read per round): targets take
# their default engine options from the environment (subprocesses the tests start inherit it)
os.environ.setdefault("WHIFLASH_CHECK_TREES", "1")

import whiflash  # noqa: E402
from whiflash.testing import make_dflash, make_eagle3, make_target  # noqa: E402

EAGLE_TAPS = [0, 1, 2]
DFLASH_TAPS = [0, 1, 3]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _WORKERS > 1:
        _build_micro_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _build_micro_first(items: list[pytest.Item]) -> None:
    """Order the tests so that one worker builds the ``micro`` testbed (about a minute) while the others run tests
    that need none: its cheapest test first, every other test of it last (xdist hands the list out in this order,
    in chunks; in collection order every worker soon reaches one of micro's tests and waits on the build's lock)."""
    uses = [item for item in items if "micro" in getattr(item, "fixturenames", ())]
    first = [item for item in uses if item.name == "test_manifest_records_every_stage"][:1] or uses[:1]
    rest = [item for item in items if item not in uses]
    items[:] = first + rest + [item for item in uses if item not in first]


_cuda_poisoned_by: list[str] = []
"""The GPU test whose device-side assert left the process's CUDA context unusable (every later CUDA call
fails with it, so later GPU tests are skipped instead of failing as noise)."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    report = yield
    if report.failed and call.excinfo is not None and "device-side assert" in str(call.excinfo.value):
        _cuda_poisoned_by.append(item.nodeid)
    return report


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _cuda_poisoned_by and "gpu" in item.keywords:
        pytest.skip(f"CUDA context unusable: {_cuda_poisoned_by[0]} hit a device-side assert (its failure is the finding)")


class World:
    """A target folder plus its drafter folders, loaded on demand."""

    def __init__(self, root: Path, family: str, crafted: bool, mix: float, seed: int) -> None:
        self.target_dir = make_target(root / "target", family, crafted=crafted, mix=mix, seed=seed)
        self.target_cfg = json.loads((self.target_dir / "config.json").read_text())
        self.eagle_dir = make_eagle3(root / "eagle3", self.target_cfg, EAGLE_TAPS, draft_vocab=24, crafted=crafted)
        self.dflash_dir = make_dflash(root / "dflash", self.target_cfg, DFLASH_TAPS, block_size=8, crafted=crafted)

    def load(self, device: str = "cpu", dtype: torch.dtype = torch.float32):
        target = whiflash.load_target(self.target_dir, device=device, dtype=dtype)
        drafters = {
            "eagle3": whiflash.load_drafter("eagle3", self.eagle_dir, target, num_steps=4),
            "dflash": whiflash.load_drafter("dflash", self.dflash_dir, target),
            "ddtree": whiflash.load_drafter("ddtree", self.dflash_dir, target, tree_budget=12),
        }
        return target, drafters


WORLDS = {
    "qwen3-random": ("qwen3", False, 0.0, 0),
    "llama-random": ("llama", False, 0.0, 1),
    "qwen3-crafted": ("qwen3", True, 0.0, 2),
    "llama-crafted": ("llama", True, 0.0, 3),
    "qwen3-mixed": ("qwen3", True, 0.1, 4),
    "llama-mixed": ("llama", True, 0.1, 5),
}


@pytest.fixture(scope="session")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, World]:
    root = tmp_path_factory.mktemp("worlds")
    return {name: World(root / name, *spec) for name, spec in WORLDS.items()}


@pytest.fixture(scope="session")
def micro(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The ``micro`` testbed, built once per session (shared by the testbed and eval tests).

    Under xdist the first worker to need it builds it (about a minute on a 2-core machine) in the run's shared
    temporary folder, under a file lock; every worker then tests its own copy, so a test that rebuilds stages in
    place touches only its worker's testbed, as without workers."""
    import shutil

    from filelock import FileLock

    from whiflash.testbed.build import build
    from whiflash.testbed.presets import get_preset

    out = tmp_path_factory.mktemp("testbed") / "micro"
    if worker_id == "master":  # no xdist: one process, nothing to share
        build(out, get_preset("micro"))
        return out
    shared = tmp_path_factory.getbasetemp().parent / "micro-shared"
    with FileLock(str(shared) + ".lock"):
        if not (shared / ".complete").exists():  # a worker that failed mid-build left no marker: build again
            build(shared / "micro", get_preset("micro"))
            (shared / ".complete").touch()
    shutil.copytree(shared / "micro", out)  # copy2: the files keep their modification times
    return out


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module: its models are tiny, and on a shared 2-core machine two threads contend."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class FakeHfApi:
    """Records calls; ``upload_folder`` copies the folder to ``root/<repo_id>[@revision]``."""

    root: Path
    calls: list

    def __init__(self, token: str | None = None) -> None:
        self.token = token

    def whoami(self) -> dict:
        FakeHfApi.calls.append(("whoami",))
        return {"name": "alice"}

    def create_repo(self, repo_id: str, repo_type: str, private: bool, exist_ok: bool):
        FakeHfApi.calls.append(("create_repo", repo_id, private, exist_ok))
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def create_branch(self, repo_id: str, branch: str, exist_ok: bool) -> None:
        FakeHfApi.calls.append(("create_branch", repo_id, branch))

    def upload_folder(self, repo_id: str, repo_type: str, folder_path: str, commit_message: str, revision: str | None,
                      allow_patterns: list[str]):
        FakeHfApi.calls.append(("upload_folder", repo_id, revision, commit_message))
        dest = FakeHfApi.root / (repo_id + (f"@{revision}" if revision else ""))
        shutil.copytree(folder_path, dest, ignore=lambda d, names: [n for n in names if n not in allow_patterns])
        return type("CommitInfo", (), {"commit_url": f"https://hf.co/{repo_id}/commit/1"})()


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> type[FakeHfApi]:
    """A fake Hub for ``whiflash-train push``: the FakeHfApi class, with ``root`` and ``calls`` reset."""
    FakeHfApi.root, FakeHfApi.calls = tmp_path / "hub", []
    monkeypatch.setattr("whiflash.train.push.HfApi", FakeHfApi)
    return FakeHfApi
