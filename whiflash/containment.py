"""Paths made from user text or from files we read stay inside the folder they belong to.

A run name becomes one folder name under ``--out``; a dataset manifest's shard names and a sharded
checkpoint's index entries name files inside their own folder. Each is checked here before it is joined
to its folder: a value that is absolute or climbs out with ``..`` is refused with a message naming the
value and where it came from. The check is on the name, not on where symbolic links inside the folder
lead: the Hugging Face cache links every file of a snapshot to a blob outside it, and a link is put there
by whoever owns the folder, while the names checked here come from text anyone may have written. Only the
standard library is imported here.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path, PurePosixPath, PureWindowsPath

__all__ = ["ContainmentError", "inside", "plain_name", "unique"]

MAX_NAME = 120
"""Longest run name: with the timestamp prefix a folder name stays well under the common 255-byte limit."""


class ContainmentError(ValueError):
    """A path from user text or a file resolves outside its folder; the message names the value and its source."""


def plain_name(value: str, what: str) -> str:
    """``value`` if it can be one folder name (no separator, not ``.`` or ``..``, no NUL, at most
    :data:`MAX_NAME` characters); ``what`` names the flag in the message (``--name``)."""
    problem = None
    if not isinstance(value, str) or not value.strip():
        problem = "it is empty"
    elif "/" in value or "\\" in value:
        problem = "it holds a path separator"
    elif value in (".", ".."):
        problem = "it names a folder's own entry"
    elif "\0" in value:
        problem = "it holds a NUL character"
    elif len(value) > MAX_NAME:
        problem = f"it is {len(value)} characters long"
    if problem:
        raise ContainmentError(f"{what} {value!r}: {problem}; expected a plain name of at most {MAX_NAME} "
                               "characters (letters, digits, '-', '_', '.'), which becomes one folder name")
    return value


def inside(folder: str | Path, name: str, what: str) -> Path:
    """``folder / name``, refused unless ``name`` is a relative path without ``..`` (so it stays inside
    ``folder``); ``what`` says where ``name`` came from (``DIR/manifest.json: shards[2].file``)."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise ContainmentError(f"{what} {name!r}: expected a file name relative to {folder}")
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if (PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute() or PureWindowsPath(name).drive
            or ".." in parts):
        raise ContainmentError(f"{what} {name!r}: points outside {folder}; expected a file name relative to "
                               "that folder (no absolute path, no '..')")
    return Path(folder) / name


def unique(values: Iterable[str], what: str) -> None:
    """Refuse a value listed twice in ``values``; ``what`` names the list (``DIR/manifest.json: shards``)."""
    seen: dict[str, int] = {}
    for i, value in enumerate(values):
        if value in seen:
            raise ContainmentError(f"{what}: {value!r} is listed twice (entries {seen[value]} and {i}); expected "
                                   "each once")
        seen[value] = i
