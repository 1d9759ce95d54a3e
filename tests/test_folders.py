"""whiflash.folders: every folder a tool writes has a kind, old folders are recognised, and no tool writes into
another tool's folder (the testbed build here; datagen, train and eval in their own tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from whiflash.folders import (
    DATAGEN, EVAL, ROUTER_DATASET, TESTBED, TRAIN, FolderKindError, check_folder, folder_kind, require_kind,
)


def _folder(root: Path, name: str, **files: dict) -> Path:
    path = root / name
    path.mkdir()
    for file, obj in files.items():
        (path / f"{file}.json").write_text(json.dumps(obj))
    return path


def test_kinds_and_folders_from_before_the_kind_field(tmp_path: Path) -> None:
    legacy = {  # what this repo wrote before folders carried a kind
        TESTBED: {"manifest": {"format_version": 1, "stages": {}, "log": []}},
        DATAGEN: {"datagen_args": {"max_new_tokens": 8}, "manifest": {"kind": ROUTER_DATASET, "shards": []}},
        ROUTER_DATASET: {"manifest": {"schema_version": 1, "shards": []}},
        TRAIN: {"manifest": {"tool": "whiflash-train", "argv": []}},
        EVAL: {"manifest": {"tool": "whiflash-eval bench", "argv": []}},
    }
    for kind, files in legacy.items():
        assert folder_kind(_folder(tmp_path, f"old-{kind}", **files)) == kind
        assert folder_kind(_folder(tmp_path, f"new-{kind}", manifest={"kind": kind})) == kind
    assert folder_kind(tmp_path / "missing") is None
    assert folder_kind(_folder(tmp_path, "other", manifest={"name": "someone else's"})) is None
    (tmp_path / "garbled").mkdir()
    (tmp_path / "garbled" / "manifest.json").write_text("{not json")
    assert folder_kind(tmp_path / "garbled") is None


def test_check_folder_refuses_other_kinds_and_foreign_files(tmp_path: Path) -> None:
    testbed = _folder(tmp_path, "tb", manifest={"stages": {}})
    assert check_folder(testbed, TESTBED, "--out") is True  # a build to resume
    assert check_folder(tmp_path / "new", DATAGEN, "--out") is False
    with pytest.raises(FolderKindError, match=rf"--out {testbed}: is a testbed build .*kind 'whiflash.testbed'; "
                                              r"expected a new or empty folder, or a whiflash-datagen output"):
        check_folder(testbed, DATAGEN, "--out")
    foreign = _folder(tmp_path, "notes")
    (foreign / "notes.txt").write_text("mine")
    (foreign / ".tmp-corpus").mkdir()  # dot files (a killed run's temporaries) do not count
    with pytest.raises(FolderKindError, match=r"holds files \(notes.txt\) but no whiflash record"):
        check_folder(foreign, TESTBED, "--out")
    (foreign / "notes.txt").unlink()
    assert check_folder(foreign, TESTBED, "--out") is False
    # a folder of runs (runs/train) may hold anything but must not itself be a run folder
    assert check_folder(tmp_path, None, "--trainer.default_root_dir") is False
    with pytest.raises(FolderKindError, match="expected a folder to hold run folders"):
        check_folder(testbed, None, "--trainer.default_root_dir")
    with pytest.raises(FolderKindError, match=rf"--testbed {tmp_path / 'nope'}: no such folder; expected a testbed"):
        require_kind(tmp_path / "nope", TESTBED, "--testbed")
    with pytest.raises(FolderKindError, match=r"--testbed .*: holds no whiflash record; expected a testbed"):
        require_kind(foreign, TESTBED, "--testbed")


def test_testbed_build_refuses_another_tools_folder_and_keeps_its_manifest(tmp_path: Path) -> None:
    from whiflash.testbed.build import build
    from whiflash.testbed.manifest import Manifest
    from whiflash.testbed.presets import get_preset

    data = _folder(tmp_path, "data", datagen_args={"kind": DATAGEN}, manifest={"kind": ROUTER_DATASET, "shards": []})
    before = {p.name: p.read_bytes() for p in data.iterdir()}
    with pytest.raises(FolderKindError, match=rf"testbed --out {data}: is a whiflash-datagen output"):
        build(data, get_preset("micro"))
    assert {p.name: p.read_bytes() for p in data.iterdir()} == before  # nothing overwritten, nothing added
    old = _folder(tmp_path, "old", manifest={"format_version": 1, "stages": {}, "log": [], "config": {}})
    Manifest(old, {"x": 1}).save()  # a build from before the kind field resumes and gains it
    assert json.loads((old / "manifest.json").read_text())["kind"] == TESTBED
