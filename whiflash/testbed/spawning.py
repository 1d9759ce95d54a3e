"""Processes a build spawns, started whatever ran the build."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def spawnable_main() -> Iterator[None]:
    """While open, a spawned process starts even when the build runs from a script on stdin.

    A spawned child re-runs the parent's main module from ``__main__.__file__``. A build started from a script on
    stdin (``python3 - <<EOF``, as the GPU scripts do) has ``__file__ == "<stdin>"``, which names no file: the child
    would die on it before its target runs. Such a main is hidden from the spawn while this is open (targets live in
    modules, not in ``__main__``), and ``__file__`` is restored after."""
    main = sys.modules["__main__"]
    path = getattr(main, "__file__", None)
    hide = path is not None and getattr(main.__spec__, "name", None) is None and not os.path.isfile(path)
    if hide:
        del main.__file__
    try:
        yield
    finally:
        if hide:
            main.__file__ = path
