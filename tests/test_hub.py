"""whiflash.hub: one rule for local path or Hub repo id, checked without the network."""

from __future__ import annotations

from pathlib import Path

import pytest

from whiflash.hub import is_hub_id, local_or_hub
from whiflash.router import load_router
from whiflash.runtime.weights import resolve_checkpoint


@pytest.fixture
def no_hub(monkeypatch) -> list[str]:
    """Any Hub download fails the test (and records what was asked for)."""
    asked: list[str] = []

    def refuse(repo_id: str, *args, **kwargs):
        asked.append(repo_id)
        raise AssertionError(f"tried the Hub for {repo_id!r}")

    monkeypatch.setattr("huggingface_hub.snapshot_download", refuse)
    monkeypatch.setattr("whiflash.router.hf_hub_download", refuse)
    return asked


@pytest.mark.parametrize("name, thing", [
    ("runs/nonexistent", "folder"),  # `runs` is a folder here: a typo in a run folder, not a Hub organisation
    ("./target", "folder"), ("/no/such/target", "folder"), ("~/no-such-target", "folder"),
    ("runs/train/router", "folder"), ("router", "folder"), ("org/router.safetensors", "file"),
    ("org/config.json", "file"), ("org name/model", "folder"), ("org/model..v2", "folder"),
])
def test_missing_local_path_fails_at_once_without_the_hub(tmp_path: Path, monkeypatch, no_hub, name, thing) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for load in (lambda: resolve_checkpoint(name, "target"), lambda: load_router(name)):
        with pytest.raises(FileNotFoundError, match=f"no such {thing}: {name}"):
            load()
    assert not is_hub_id(name) and no_hub == []


def test_existing_path_is_local_and_valid_ids_go_to_the_hub(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Qwen" / "Qwen3-8B").mkdir(parents=True)  # a downloaded copy under the repo's own name
    assert local_or_hub("Qwen/Qwen3-8B") == Path("Qwen/Qwen3-8B")
    fetched = []
    monkeypatch.setattr("huggingface_hub.snapshot_download",
                        lambda repo_id, **kw: fetched.append(repo_id) or str(tmp_path / "Qwen" / "Qwen3-8B"))
    assert resolve_checkpoint("z-lab/Qwen3-8B-DFlash-b16", "dflash drafter") == tmp_path / "Qwen" / "Qwen3-8B"
    assert fetched == ["z-lab/Qwen3-8B-DFlash-b16"] and is_hub_id("z-lab/Qwen3-8B-DFlash-b16")


def test_hub_failure_names_the_repo(monkeypatch) -> None:
    def offline(repo_id: str, **kw):
        raise OSError("offline")

    monkeypatch.setattr("huggingface_hub.snapshot_download", offline)
    with pytest.raises(FileNotFoundError, match="target 'org/model': not a local folder and the Hub download failed"):
        resolve_checkpoint("org/model", "target")
