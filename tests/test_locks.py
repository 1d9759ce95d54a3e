"""One writer per output folder (whiflash/locks.py): a second writer is refused naming the holder, the lock goes
with its process however it ends, and a refused run leaves no folder behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "whiflash" / "locks.py"

# the holder loads whiflash/locks.py by its path (standard library only), so it starts in a fraction of a second
HOLDER = textwrap.dedent("""
    import importlib.util, pathlib, sys, time
    spec = importlib.util.spec_from_file_location("locks", sys.argv[1])
    locks = sys.modules["locks"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(locks)
    folder = pathlib.Path(sys.argv[2])
    sys.argv = sys.argv[3:]  # the command the lock file records
    locks.claim(folder, "--out")
    print("held", flush=True)
    time.sleep(120)
""")


class Holder:
    """A process that claims `folder` (recording `command`) until it is stopped."""

    def __init__(self, folder: Path, *command: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(LOCKS), str(folder), *command],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.strip() == "held", self.proc.stderr.read()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)  # a crash: no cleanup code runs
        self.proc.wait(timeout=30)

    def __enter__(self) -> Holder:
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.kill()


def test_second_writer_is_refused_naming_the_holder_and_a_killed_holder_frees_the_folder(tmp_path: Path) -> None:
    from whiflash.errors import exit_status
    from whiflash.locks import LOCK_FILE, FolderBusyError, claim, owning_folders

    out = tmp_path / "data"
    with Holder(out, "whiflash-datagen", "--out", str(out), "--max_new_tokens", "30") as holder:
        with pytest.raises(FolderBusyError, match=rf"--out {out}: is being written by pid {holder.proc.pid} "
                                                  r"\(whiflash-datagen --out .* --max_new_tokens 30, since ") as err:
            with owning_folders():
                claim(out, "--out")
        assert exit_status(err.value) == 2
        holder.kill()  # SIGKILL: the kernel drops the lock, its file stays behind
        assert (out / LOCK_FILE).is_file()
        with owning_folders():
            claim(out, "--out")
            assert json.loads((out / LOCK_FILE).read_text())["pid"] == os.getpid()
        assert not (out / LOCK_FILE).exists() and out.is_dir()  # released; the folder existed before, so it stays


def test_claims_nest_and_a_refused_run_removes_only_what_it_created(tmp_path: Path) -> None:
    from whiflash.locks import LOCK_FILE, claim, owning_folders

    run = tmp_path / "runs" / "eval" / "r1"
    with pytest.raises(RuntimeError, match="refused"):
        with owning_folders():
            claim(run, "--out")
            with owning_folders():  # a nested call on the same folder shares the lock
                claim(run, "--out")
            assert (run / LOCK_FILE).is_file()
            (run / "config.json").write_text("{}")  # scaffolding only
            raise RuntimeError("refused")
    assert not (tmp_path / "runs").exists()  # the run folder and the parents the claim made are gone
    kept = tmp_path / "kept"
    with pytest.raises(RuntimeError):
        with owning_folders():
            claim(kept, "--out")
            (kept / "samples.jsonl").write_text("{}\n")  # a result: a resumable run keeps it
            raise RuntimeError("failed")
    assert sorted(p.name for p in kept.iterdir()) == ["samples.jsonl"]


def test_datagen_on_a_folder_another_run_writes_is_refused_before_anything_is_written(worlds, tmp_path: Path) -> None:
    from whiflash.datagen.cli import datagen

    world = worlds["qwen3-mixed"]
    prompts = tmp_path / "ids.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "input_ids": [3 + i, 4, 5]}) + "\n" for i in range(2)))
    out = tmp_path / "data"
    run = lambda: datagen(out=out, prompts=[str(prompts)], target=str(world.target_dir),  # noqa: E731
                          eagle3=str(world.eagle_dir), dflash=str(world.dflash_dir), max_new_tokens=6,
                          shard_size=1, device="cpu")
    with Holder(out, "whiflash-datagen", "--max_new_tokens", "30") as holder:
        with pytest.raises(RuntimeError, match=rf"--out {out}: is being written by pid {holder.proc.pid} "
                                               r"\(whiflash-datagen --max_new_tokens 30"):
            run()
        assert [p.name for p in out.iterdir()] == [".whiflash.lock"]  # no record, no shard of this run


def test_bench_run_folder_testbed_build_and_train_run_are_locked(tmp_path: Path, monkeypatch) -> None:
    from whiflash.eval.outputs import prepare_run_dir
    from whiflash.testbed.build import build
    from whiflash.testbed.presets import get_preset
    from whiflash.train.cli import run as train

    config = {"dataset": "a.jsonl", "inputs": {"--dataset a.jsonl": "3f"}}
    old = tmp_path / "eval" / "20260101-000000_r"
    old.mkdir(parents=True)
    (old / "config.json").write_text(json.dumps(config))
    with Holder(old, "whiflash-eval", "bench", "--name", "r"):
        with pytest.raises(RuntimeError, match=rf"run folder \(--out/--name\) {old}: is being written by pid .*"
                                               r"whiflash-eval bench --name r"):
            prepare_run_dir(tmp_path / "eval", "r", config)  # the resume it would pick is being written
    testbed = tmp_path / "testbed"
    with Holder(testbed, "python", "-m", "whiflash.testbed", "build"):
        with pytest.raises(RuntimeError, match=rf"testbed --out {testbed}: is being written by pid .*whiflash.testbed"):
            build(testbed, get_preset("micro"))  # refused before any stage runs
    assert [p.name for p in testbed.iterdir()] == [".whiflash.lock"]
    from whiflash.train.synthetic import write_synthetic_dataset

    data = tmp_path / "syn"
    write_synthetic_dataset(data, num_prompts=8, rounds_per_prompt=4, hidden_size=8, progress=False)
    monkeypatch.setattr("whiflash.train.cli._fresh_version", lambda root, name, sub: "20260101-000000_router")
    monkeypatch.setattr("sys.argv", ["whiflash-train"])
    run_dir = tmp_path / "train" / "20260101-000000_router"
    with Holder(run_dir, "whiflash-train", "fit"):
        with pytest.raises(RuntimeError, match=rf"{run_dir}: is being written by pid .*whiflash-train fit"):
            train(["fit", "--data.path", str(data), "--trainer.default_root_dir", str(tmp_path / "train"),
                   "--trainer.max_epochs", "1", "--data.cache_dir", str(tmp_path / "cache")])
