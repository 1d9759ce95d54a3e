"""The one place the toolkit reads its ``WHIFLASH_*`` environment variables, each only as a default.

A variable never switches anything by itself: the tools turn these values into the defaults of their
flags (and `EngineOptions.from_environment` into the defaults of an engine), and a flag given on the
command line, in a ``--config`` file or in Python wins. Only the standard library is imported here, so
every layer of the package may read its defaults from this module.

=============================  =========================================================  ==========
variable                       what it sets the default of                                default
=============================  =========================================================  ==========
``WHIFLASH_DECODE_ATTENTION``  the split-K attention kernel of fixed-shape passes (0: off)  on
``WHIFLASH_GEMV``              the few-row product kernel (0: off, every product cuBLAS)    on
``WHIFLASH_GEMV_CONFIGS``      a ``scripts/bench_gemv.py --json`` settings table to add     none
``WHIFLASH_TREE_KERNEL``       DDTree's tree kernel (0: the sort-based tensor ops)          on
``WHIFLASH_CHECK_TREES``       check every verified tree's shape (1: on)                    off
``WHIFLASH_DEBUG``             tracebacks with the error line (``--debug``)                 off
``WHIFLASH_DIST_TIMEOUT``      seconds a torchrun rank waits at a barrier                    86400
``WHIFLASH_CHECKPOINTS``       the checkpoint registry folder of ``whiflash-eval``         the repo's
``WHIFLASH_TESTBED_DIR``       the folder testbeds are built into when none is given        ~/.cache
=============================  =========================================================  ==========
"""
from __future__ import annotations

import os
from typing import Any

__all__ = ["CHECKPOINTS", "DEBUG", "DIST_TIMEOUT", "ENGINE_VARIABLES", "TESTBED_DIR", "checkpoints_dir", "debug",
           "dist_timeout", "engine_defaults", "testbed_dir"]

DEBUG = "WHIFLASH_DEBUG"
DIST_TIMEOUT = "WHIFLASH_DIST_TIMEOUT"
CHECKPOINTS = "WHIFLASH_CHECKPOINTS"
TESTBED_DIR = "WHIFLASH_TESTBED_DIR"

ENGINE_VARIABLES = {
    "attention_kernel": "WHIFLASH_DECODE_ATTENTION",
    "gemv": "WHIFLASH_GEMV",
    "gemv_configs": "WHIFLASH_GEMV_CONFIGS",
    "tree_kernel": "WHIFLASH_TREE_KERNEL",
    "check_trees": "WHIFLASH_CHECK_TREES",
}
"""`EngineOptions` field -> the variable that sets its default."""

_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")


def _switch(name: str, default: bool) -> bool:
    """A yes/no variable: unset or empty keeps `default`; anything else is a clear error."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _ON:
        return True
    if raw in _OFF:
        return False
    raise ValueError(f"environment variable {name}={raw!r}: expected one of 1/0, true/false, yes/no, on/off")


def engine_defaults() -> dict[str, Any]:
    """The engine fields the environment sets (only those whose variable is set), as `EngineOptions` keywords."""
    values: dict[str, Any] = {}
    for field in ("attention_kernel", "gemv", "tree_kernel"):
        if os.environ.get(ENGINE_VARIABLES[field], "").strip():
            values[field] = _switch(ENGINE_VARIABLES[field], True)
    if os.environ.get(ENGINE_VARIABLES["check_trees"], "").strip():
        values["check_trees"] = _switch(ENGINE_VARIABLES["check_trees"], False)
    configs = os.environ.get(ENGINE_VARIABLES["gemv_configs"], "").strip()
    if configs:
        values["gemv_configs"] = configs
    return values


def debug() -> bool:
    """True when ``WHIFLASH_DEBUG`` asks for tracebacks (1/true/yes/on)."""
    return os.environ.get(DEBUG, "").strip().lower() in _ON


def dist_timeout(default: float) -> float:
    """Seconds a torchrun rank waits at a barrier (``WHIFLASH_DIST_TIMEOUT``, else `default`)."""
    raw = os.environ.get(DIST_TIMEOUT, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"environment variable {DIST_TIMEOUT}={raw!r}: expected a number of seconds") from None


def checkpoints_dir() -> str | None:
    """The checkpoint registry folder ``WHIFLASH_CHECKPOINTS`` names, or None when unset."""
    return os.environ.get(CHECKPOINTS) or None


def testbed_dir() -> str | None:
    """The folder ``WHIFLASH_TESTBED_DIR`` names for testbeds built without a folder, or None when unset."""
    return os.environ.get(TESTBED_DIR) or None
