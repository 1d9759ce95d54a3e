"""One writer per output folder: an exclusive OS file lock, held from the check of a folder to its last write.

Every tool that writes a folder (``whiflash-datagen --out``, the run folders of ``whiflash-eval`` and
``whiflash-train``, a testbed build, a report) claims it first with :func:`claim`. The claim is an
``flock`` on ``FOLDER/.whiflash.lock``, a file that also records the holder's pid, command and start time,
so a second writer is refused (:class:`FolderBusyError`) with a message naming them. The kernel drops the
lock when its process exits, however it exits: a run killed with SIGKILL leaves a lock file that the next
run simply takes over (dot files are ignored by every folder check).

Claims live in a scope (:func:`owning_folders`, a context manager and a decorator): leaving the scope
releases every folder claimed inside it, and when the scope ends in an error, a folder the scope created
that holds nothing but the scaffolding a refused run writes (its config and manifest) is removed again, so
a refused run leaves no empty run folder behind. A process may claim a folder it already holds (a nested
call); the claim then ends with the outermost one. Only the standard library is imported here.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: msvcrt's byte-range lock does the same job
    fcntl = None  # type: ignore[assignment]
    import msvcrt

__all__ = ["LOCK_FILE", "SCAFFOLDING", "FolderBusyError", "FolderLock", "claim", "holder", "owning_folders"]

LOCK_FILE = ".whiflash.lock"
"""The lock file inside a claimed folder (a dot file: folder checks and globs for real files skip it)."""
SCAFFOLDING = frozenset({"config.json", "config.yaml", "manifest.json", "datagen_args.json"})
"""What a run writes before its first result: a folder of only these is removed when its run is refused."""

class FolderBusyError(RuntimeError):
    """Another process holds the folder; the message names the folder, the holder's pid and its command."""

    exit_status = 2  # a refusal before anything ran (whiflash.errors): choose another folder or wait


def _try_lock(fd: int) -> bool:
    """Take the exclusive lock of ``fd`` without waiting; False when another process holds it."""
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:  # pragma: no cover
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except OSError:  # BlockingIOError (EWOULDBLOCK) on POSIX, PermissionError (EACCES) on Windows
        return False
    return True


def holder(folder: str | Path) -> dict[str, Any] | None:
    """What the lock file of ``folder`` says about its last holder (pid, command, started), or None."""
    try:
        record = json.loads((Path(folder) / LOCK_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _describe_holder(record: dict[str, Any] | None) -> str:
    if not record:  # it has taken the lock but not yet written its record
        return "another process"
    command = record.get("command") or "?"
    return f"pid {record.get('pid', '?')} ({command}, since {record.get('started', '?')})"


@dataclass
class FolderLock:
    """The exclusive lock of one folder, held by this process through an open file descriptor."""

    folder: Path
    flag: str
    """How the folder was given (``--out``), for messages."""
    created: list[Path]
    """The folders this claim created, the claimed one first and then its missing parents (a refused run
    removes them again)."""
    scaffolding: Collection[str] = SCAFFOLDING
    fd: int = -1
    depth: int = 0
    """Claims of this folder open in this process (nested calls share the lock)."""

    @property
    def path(self) -> Path:
        return self.folder / LOCK_FILE

    def acquire(self) -> None:
        """Take the lock or raise :class:`FolderBusyError`; then record this process in the lock file."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            if not _try_lock(fd):
                os.close(fd)
                raise FolderBusyError(
                    f"{self.flag} {self.folder}: is being written by {_describe_holder(holder(self.folder))}; "
                    f"expected a folder no other run writes. Wait for that run to end, or choose another {self.flag}")
            # a holder that released the lock unlinks the file first: had we opened that old file, the lock
            # would guard nothing, so take it again on the file that is there now
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        record = {"pid": os.getpid(), "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:500],
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(record) + "\n").encode())
        self.fd = fd

    def release(self, failed: bool = False) -> None:
        """Give the lock up (unlinking its file first, see :meth:`acquire`); after a failure, remove the folder
        when this claim created it and it holds only scaffolding."""
        if self.fd < 0:
            return
        self.path.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = -1
        if failed and self.created and self.folder.is_dir():
            names = [p.name for p in self.folder.iterdir()]
            # dot files are temporaries of the failed run (atomic writes, a killed stage)
            if all(n.startswith(".") or n in self.scaffolding for n in names):
                shutil.rmtree(self.folder, ignore_errors=True)
                _remove_empty(self.created[1:])


def _remove_empty(folders: list[Path]) -> None:
    """Remove each of ``folders`` (deepest first) that is empty; stop at the first that is not."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty (another run put something there), or gone
            return


_HELD: dict[Path, FolderLock] = {}
"""Folders this process holds, by resolved path."""
_SCOPES: list[list[FolderLock]] = []
"""The open scopes (innermost last), each with the claims made inside it."""


def claim(folder: str | Path, flag: str, *, scaffolding: Collection[str] = SCAFFOLDING) -> FolderLock:
    """Claim ``folder`` for writing (creating it, and its parents, when missing) in the innermost
    :func:`owning_folders` scope; raises :class:`FolderBusyError` when another process holds it.

    Without an open scope the claim lasts until the process exits. ``scaffolding`` names the files a run may
    have written before its first result (see :data:`SCAFFOLDING`).
    """
    folder = Path(folder)
    key = folder.resolve()
    lock = _HELD.get(key)
    if lock is None:
        created = [p for p in (folder, *folder.parents) if not p.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        lock = FolderLock(folder, flag, created, scaffolding)
        try:
            lock.acquire()
        except BaseException:
            _remove_empty(created)
            raise
        _HELD[key] = lock
    lock.depth += 1
    if _SCOPES:
        _SCOPES[-1].append(lock)
    return lock


@contextmanager
def owning_folders() -> Iterator[None]:
    """A scope for :func:`claim`, as a context manager (``with owning_folders():``) or a decorator
    (``@owning_folders()``, a fresh scope per call). Leaving it releases the claims made inside; leaving it by
    an error also removes the folders it created that hold only scaffolding."""
    claims: list[FolderLock] = []
    _SCOPES.append(claims)
    failed = True
    try:
        yield
        failed = False
    finally:
        _SCOPES.remove(claims)
        for lock in reversed(claims):
            lock.depth -= 1
            if lock.depth == 0:
                _HELD.pop(lock.folder.resolve(), None)
                lock.release(failed)
