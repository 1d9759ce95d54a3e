"""Range checks of command-line values, each refusal naming the flag as the user spells it.

The tools check every flag with these before anything is pinned, loaded or created, so a value out of
range is reported as ``--warmup-tokens: expected an integer >= 0, got -1``, not by the library function
that would have failed on it later under another name. `dashed_argv` gives a function's command line the
toolkit's one flag dialect (kebab-case, yes/no options as ``--x`` / ``--no-x`` switches). Only the standard
library is imported here.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from whiflash.errors import UsageError

__all__ = ["check_choice", "check_int", "check_number", "dashed_argv", "dashed_help", "kebab"]


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


def kebab(name: str) -> str:
    """A parameter's flag as the tools spell it: ``max_new_tokens`` -> ``--max-new-tokens``."""
    return "--" + name.replace("_", "-")


def dashed_argv(argv: Sequence[str], params: Mapping[str, bool], tool: str) -> list[str]:
    """``argv`` in the kebab-case dialect turned into the underscore spelling a function's jsonargparse CLI parses.

    ``params`` maps each parameter name to whether it is a yes/no option. ``--max-new-tokens 30`` becomes
    ``--max_new_tokens 30``; a yes/no option is a switch, ``--cuda-graphs`` / ``--no-cuda-graphs`` (its value
    ``true``/``false`` for the parser). The old spellings (``--max_new_tokens``, ``--cuda_graphs false``) are
    still accepted, each with a one-line deprecation warning naming the new one; anything else passes as is.
    """
    by_flag = {kebab(p): p for p in params}
    out: list[str] = []
    warned: set[str] = set()
    argv = list(argv)
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        head, eq, value = arg.partition("=")
        if not head.startswith("--") or head == "--":
            out.append(arg)
            continue
        if head in by_flag:
            name = by_flag[head]
            if params[name] and not eq:
                # a switch; an explicit value after it (`--cuda-graphs false`) is taken as well
                given = argv[i].lower() if i < len(argv) else ""
                explicit = given in ("true", "false", "yes", "no", "null")
                out += [f"--{name}", given if explicit else "true"]
                i += explicit
            else:
                out.append(f"--{name}{eq}{value}")
            continue
        if head.startswith("--no-") and "--" + head[5:] in by_flag and params[by_flag["--" + head[5:]]] and not eq:
            out += [f"--{by_flag['--' + head[5:]]}", "false"]
            continue
        name = head[2:]
        if "_" in name and name in params and head not in warned:
            warned.add(head)
            new = kebab(name) + (" / --no-" + kebab(name)[2:] if params[name] else "")
            print(f"{tool}: warning: {head} is deprecated; use {new}", file=sys.stderr)
        out.append(arg)
    return out


def dashed_help(text: str, params: Mapping[str, bool]) -> str:
    """A jsonargparse help text with every parameter's flag in the kebab-case spelling (`dashed_argv`)."""
    for name in sorted(params, key=len, reverse=True):
        if params[name]:
            text = re.sub(rf"--{name}\b( [A-Z_]+| {{true,false,null}})?", f"{kebab(name)}|--no-{kebab(name)[2:]}", text)
        elif "_" in name:
            text = re.sub(rf"--{name}\b", kebab(name), text)
    return text
