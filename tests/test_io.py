"""whiflash.io: atomic writes leave the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from whiflash.io import atomic_path, atomic_write_json


def test_atomic_write_syncs_and_leaves_no_temp_file(tmp_path: Path, monkeypatch) -> None:
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    path = atomic_write_json(tmp_path / "m.json", {"b": 1, "a": [1, 2]}, sort_keys=True)
    assert json.loads(path.read_text()) == {"a": [1, 2], "b": 1} and path.read_text().endswith("\n")
    assert synced and os.listdir(tmp_path) == ["m.json"]


def test_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    path = atomic_write_json(tmp_path / "m.json", {"v": 1})
    with pytest.raises(RuntimeError, match="killed"):
        with atomic_path(path) as tmp:
            tmp.write_text('{"v": 2, "half')
            raise RuntimeError("killed")
    assert json.loads(path.read_text()) == {"v": 1} and os.listdir(tmp_path) == ["m.json"]
