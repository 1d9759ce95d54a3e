"""Method families: one method run at several settings in one run, and the best setting of each group.

A swept method's name carries its setting: `ddtree-b32` is DDTree at tree budget 32 (`--tree-budget
16,32,64` runs one per budget), `whiflash-entropy@0.2` the entropy router at threshold 0.2 (as
`whiflash-eval calibrate` and `sweep` name them). Per category (and per dataset) the best setting of a
family is the one with the highest speedup, as upstream's tables report DDTree at its best budget per
dataset (liranringel/ddtree `make_latex_table.py`).
"""
from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["best_of_families", "budget_method", "parse_method", "parse_values", "threshold_method"]

_BUDGET = re.compile(r"^ddtree-b(\d+)$")


def budget_method(budget: int) -> str:
    """The method name of standalone DDTree at tree budget `budget`."""
    return f"ddtree-b{budget}"


def threshold_method(method: str, value: float) -> str:
    """The method name of routed `method` at threshold `value`."""
    return f"{method}@{value:g}"


def parse_method(name: str) -> tuple[str, float | None]:
    """(family, setting) of a method name: ("ddtree", 32.0) for `ddtree-b32`, ("whiflash-entropy", 0.2) for
    `whiflash-entropy@0.2`, (name, None) for an unswept method."""
    m = _BUDGET.match(name)
    if m:
        return "ddtree", float(m.group(1))
    base, sep, value = name.partition("@")
    if sep:
        try:
            return base, float(value)
        except ValueError:
            raise ValueError(f"method {name!r}: expected METHOD@THRESHOLD with a number after '@'") from None
    return name, None


def parse_values(text: str | None, flag: str, kind: type = float) -> list[Any]:
    """The comma-separated numbers of a list flag (`--tree-budget 16,32`), each checked; [] when unset."""
    if text is None or not str(text).strip():
        return []
    out = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            value = kind(part)
        except ValueError:
            raise ValueError(f"{flag} {text!r}: {part!r} is not {'an integer' if kind is int else 'a number'}; "
                             f"expected comma-separated values, e.g. {flag} 16,32,64") from None
        if kind is int and value < 1:
            raise ValueError(f"{flag} {text!r}: expected integers >= 1, got {value}")
        if value not in out:
            out.append(value)
    return out


def best_of_families(cells: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{family: {group: {"method", "value", "speedup", "tau"}}}: per group (category, dataset or "all") the
    member of every swept family with the highest speedup (ties: the first listed); families without a
    swept member are left out."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for group, per in cells.items():
        members: dict[str, list[tuple[str, float]]] = {}
        for name in per:
            family, value = parse_method(name)
            if value is not None:
                members.setdefault(family, []).append((name, value))
        for family, named in members.items():
            valid = [(n, v) for n, v in named if not math.isnan(per[n]["speedup"])]
            if not valid:
                continue
            name, value = max(valid, key=lambda nv: per[nv[0]]["speedup"])
            out.setdefault(family, {})[group] = {"method": name, "value": int(value) if family == "ddtree" else value,
                                                 "speedup": per[name]["speedup"], "tau": per[name]["tau"],
                                                 "of": [n for n, _ in named]}
    return out
