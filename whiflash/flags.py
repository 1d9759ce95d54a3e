"""Range checks of command-line values, each refusal naming the flag as the user spells it.

The tools check every flag with these before anything is pinned, loaded or created, so a value out of
range is reported as ``--warmup-tokens: expected an integer >= 0, got -1``, not by the library function
that would have failed on it later under another name. Only the standard library is imported here.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

from whiflash.errors import UsageError

__all__ = ["check_choice", "check_int", "check_number"]


def check_int(value: Any, flag: str, minimum: int = 1, *, maximum: int | None = None, optional: bool = False) -> None:
    """Refuse ``value`` unless it is an integer in ``[minimum, maximum]`` (or None, when ``optional``)."""
    if value is None and optional:
        return
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    if ok and maximum is not None:
        ok = value <= maximum
    if not ok:
        span = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        unset = " (or unset)" if optional else ""
        raise UsageError(f"{flag}: expected an integer {span}{unset}, got {value!r}")


def check_number(value: Any, flag: str, minimum: float | None = None, *, above: bool = False,
                 optional: bool = False, what: str = "") -> None:
    """Refuse ``value`` unless it is a finite number ``>= minimum`` (``> minimum`` when ``above``; any, when
    ``minimum`` is None); ``what`` adds the unit or a reason."""
    if value is None and optional:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and minimum is not None:
        ok = value > minimum if above else value >= minimum
    if not ok:
        span = "a finite number" + (f" {'>' if above else '>='} {minimum:g}" if minimum is not None else "")
        raise UsageError(f"{flag}: expected {span}{what}{' (or unset)' if optional else ''}, got {value!r}")


def check_choice(value: Any, flag: str, choices: Collection[str]) -> None:
    """Refuse ``value`` unless it is one of ``choices``."""
    if value not in choices:
        raise UsageError(f"{flag}: expected one of {', '.join(choices)}, got {value!r}")
