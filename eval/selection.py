"""Which rows of a prompt set `--max-samples N` keeps.

A named benchmark or a JSONL file keeps upstream's selection: all rows in their order when it has
at most N, else `dataset.shuffle(seed=S).select(range(N))` of `datasets`, i.e. the first N entries
of `numpy.random.default_rng(S).permutation(rows)` (S = `--seed`, 0 by default, as upstream's
fixed seed). N applies to every `--dataset` source on its own, as upstream's benchmark runs one
dataset at a time. A testbed split, which holds several categories, keeps N prompts in all, in equal
shares per category (`balanced`), as the routing measurements on it are made per category.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["SourceSelection", "balanced", "upstream_indices"]


def upstream_indices(rows: int, max_samples: int | None, seed: int = 0) -> list[int]:
    """Row indices upstream's `--max-samples` keeps of a dataset of `rows` rows, in the order it decodes them."""
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"--max-samples: expected an integer >= 1, got {max_samples}")
    if max_samples is None or rows <= max_samples:
        return list(range(rows))
    return [int(i) for i in np.random.default_rng(seed).permutation(rows)[:max_samples]]


def balanced(pool: list[Any], max_samples: int | None, seed: int) -> list[Any]:
    """Seeded shuffle within each category, then round-robin across categories up to `max_samples` (all when
    None): the selection of a testbed split, and of calibration prompts outside a benchmark subset."""
    groups: dict[str, list[Any]] = {}
    for s in pool:
        groups.setdefault(s.category, []).append(s)
    for cat, items in groups.items():
        random.Random(f"{seed}:{cat}").shuffle(items)
    out: list[Any] = []
    limit = len(pool) if max_samples is None else max_samples
    while len(out) < limit and any(groups.values()):
        for cat in list(groups):
            if groups[cat] and len(out) < limit:
                out.append(groups[cat].pop(0))
    return out


@dataclass
class SourceSelection:
    """What `--max-samples` kept of one `--dataset` source: recorded in the run's manifest."""

    source: str
    """The `--dataset` entry as given."""
    rule: str
    """`upstream` (seeded permutation, first N) or `balanced` (a testbed split: equal shares per category)."""
    rows: int
    """Rows (prompts) the source holds; for a testbed split, the prompts read per category times categories."""
    indices: list[int] = field(default_factory=list)
    """Kept row indices in the source's own order, in the order they are decoded."""
    ids: list[str] = field(default_factory=list)
    """The kept samples' ids, in the same order."""
    seed: int = 0
    max_samples: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "rule": self.rule, "rows": self.rows, "max_samples": self.max_samples,
                "seed": self.seed, "indices": self.indices, "ids": self.ids}
