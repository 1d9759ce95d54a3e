"""Atomic file writes (a reader sees the old file or the new one, never half of one) and checkpoint stamps.

Every writer in the toolkit (dataset shards and manifests, router exports, testbed manifests)
goes through here, so a killed run never leaves a truncated file under its final name, and a
resumed run can trust the files it finds (docs/design.md, "The router dataset").
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["append_text", "atomic_path", "atomic_write_bytes", "atomic_write_json", "atomic_write_text",
           "checkpoint_stamp", "naming_the_file"]


@contextmanager
def naming_the_file(path: str | Path) -> Iterator[None]:
    """Give an ``OSError`` raised inside the block without a file name (a full disk: ``[Errno 28] No space left
    on device``) the name of ``path``, so the message says which write failed."""
    try:
        yield
    except OSError as err:
        if err.filename is not None:
            raise
        if err.errno is None:  # pyarrow's own IO errors carry no errno
            raise OSError(f"{path}: {err}") from err
        # OSError(errno, ...) gives back the subclass of that errno (FileNotFoundError, PermissionError, ...);
        # with the file name its message reads `[Errno 28] No space left on device: 'PATH'`
        raise OSError(err.errno, err.strerror or str(err), str(path)) from err


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield an unused temporary path next to ``path``; once the block has written it, it is synced and
    renamed over ``path``. On an exception the temporary file is removed and ``path`` is left as it was.

    For libraries that write to a path themselves (Parquet, safetensors). The temporary file sits in the
    same folder because ``os.replace`` is atomic only within one file system; its name starts with a dot
    and ends with ``.tmp`` so that globs for the real files never match it.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        with naming_the_file(path):
            yield tmp
            # fsync before the rename: otherwise a crash can leave the new name pointing at unwritten blocks
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def append_text(path: str | Path, text: str) -> None:
    """Append ``text`` (UTF-8) to ``path`` and flush it (logs of rows that a resumed run reads back)."""
    with naming_the_file(path), open(path, "a", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns ``path``."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns ``path``."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any, *, sort_keys: bool = False) -> Path:
    """Write ``obj`` as indented JSON with a final newline to ``path`` atomically; returns ``path``."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=sort_keys) + "\n")


def checkpoint_stamp(name: str | Path | None) -> str | None:
    """What a local checkpoint holds now, cheaply: a hash of every file's relative name, size and modification
    time (a Hub id or None is returned as is). Resumable jobs pin it beside the path, so a checkpoint retrained
    or replaced in the same folder is not mixed into rows made with the old one; reading the bytes of an 8B
    model on every start would cost more than the check is worth."""
    path = Path(name) if name is not None else None
    if path is None or not path.exists():
        return None if name is None else str(name)
    files = sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file())
    digest = hashlib.sha256()
    for f in files:
        st = f.stat()
        digest.update(f"{f.relative_to(path) if f != path else f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]
