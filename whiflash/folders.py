"""Folders own their kind: no tool writes into a folder that another tool (or no tool) wrote.

Every folder the toolkit writes carries a JSON record whose ``kind`` field names what wrote it:

==========================  ======================  ==================================================
kind                        record                  written by
==========================  ======================  ==================================================
``whiflash.testbed``        ``manifest.json``       ``python -m whiflash.testbed build``
``whiflash.datagen``        ``datagen_args.json``   ``whiflash-datagen`` (its ``manifest.json`` is the
                                                    router dataset's, kind ``whiflash-router-dataset``)
``whiflash-router-dataset`` ``manifest.json``       other router dataset writers (the synthetic one)
``whiflash.train``          ``manifest.json``       ``whiflash-train`` (one run folder per run)
``whiflash.eval``           ``manifest.json``       ``whiflash-eval bench`` and ``calibrate``
==========================  ======================  ==================================================

Folders written before the field existed are still recognised by what their record holds (a testbed
manifest has ``stages``, a router dataset manifest ``shards``; train and eval manifests name their
``tool``; any ``datagen_args.json`` is datagen's). Only the standard library is imported here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = [
    "DATAGEN", "DATAGEN_RECORD", "EVAL", "KINDS", "MANIFEST", "ROUTER_DATASET", "TESTBED", "TRAIN",
    "FolderKindError", "check_folder", "folder_kind", "require_kind",
]

TESTBED = "whiflash.testbed"
DATAGEN = "whiflash.datagen"
ROUTER_DATASET = "whiflash-router-dataset"
TRAIN = "whiflash.train"
EVAL = "whiflash.eval"
KINDS: dict[str, str] = {
    TESTBED: "a testbed build (python -m whiflash.testbed build)",
    DATAGEN: "a whiflash-datagen output",
    ROUTER_DATASET: "a router dataset not written by whiflash-datagen",
    TRAIN: "a whiflash-train run",
    EVAL: "a whiflash-eval run",
}
"""Every kind and how messages describe it."""

MANIFEST = "manifest.json"
DATAGEN_RECORD = "datagen_args.json"
"""datagen's record: its pinned arguments, written before its first shard (the manifest comes last)."""


class FolderKindError(ValueError):
    """A folder belongs to another kind than the tool that was pointed at it; the message names flag and folder."""


def _read_record(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # not a record any whiflash tool wrote


def folder_kind(path: str | Path) -> str | None:
    """The kind of the folder ``path`` (one of :data:`KINDS`, or another tool's ``kind`` string), or None when
    it holds no whiflash record (missing, empty, or someone else's files)."""
    path = Path(path)
    if (path / DATAGEN_RECORD).is_file():  # checked first: a finished datagen folder also holds a dataset manifest
        return DATAGEN
    record = _read_record(path / MANIFEST) if (path / MANIFEST).is_file() else None
    if not isinstance(record, dict):
        return None
    if isinstance(record.get("kind"), str):
        return record["kind"]
    # records written before the kind field existed
    tool = str(record.get("tool", ""))
    if "stages" in record:
        return TESTBED
    if "shards" in record:
        return ROUTER_DATASET
    if tool == "whiflash-train":
        return TRAIN
    if tool.startswith("whiflash-eval"):
        return EVAL
    return None


def _describe(kind: str) -> str:
    return f"{KINDS.get(kind, 'a folder')}, kind {kind!r}"


def check_folder(path: str | Path, kind: str | None, flag: str) -> bool:
    """Check that ``path`` may be written by a tool of ``kind`` before anything is written; returns whether it
    already is a folder of ``kind`` (a run to resume).

    ``kind=None`` is for a folder that holds run folders (``runs/train``): it must not itself be a run
    folder of any kind. Otherwise ``path`` must be missing, empty (dot files aside: temporary files of a
    killed run) or of ``kind``. ``flag`` names where the folder came from in the message (``--out``).
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FolderKindError(f"{flag} {path}: is a file, expected a folder")
    found = folder_kind(path)
    if found is not None and found != kind:
        expected = "a folder to hold run folders" if kind is None else f"a new or empty folder, or {_describe(kind)}"
        raise FolderKindError(f"{flag} {path}: is {_describe(found)}; expected {expected}. Choose another {flag} "
                              "(a tool never writes into another tool's folder)")
    if kind is None:
        return False
    if found == kind:
        return True
    if path.is_dir():
        files = sorted(p.name for p in path.iterdir() if not p.name.startswith("."))
        if files:
            shown = ", ".join(files[:5]) + (", ..." if len(files) > 5 else "")
            raise FolderKindError(f"{flag} {path}: holds files ({shown}) but no whiflash record; expected a new or "
                                  f"empty folder, or {_describe(kind)}")
    return False


def require_kind(path: str | Path, kind: str, flag: str) -> Path:
    """Check that the input folder ``path`` (e.g. ``--testbed``) is of ``kind``; returns it as a ``Path``."""
    path = Path(path)
    found = folder_kind(path)
    if found != kind:
        what = ("no such folder" if not path.exists() else f"is {_describe(found)}" if found
                else "holds no whiflash record")
        raise FolderKindError(f"{flag} {path}: {what}; expected {_describe(kind)}")
    return path
