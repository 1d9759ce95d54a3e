"""What a resumable run's results depend on, pinned by content: hashes of its inputs and what changed.

A run that resumes finishes the rows of an earlier run, so it must be given the same inputs, not only the
same names: a prompt file edited in place, or a checkpoint retrained into the same folder, would otherwise
mix rows of two inputs in one result. Tools pin :func:`content_sha256` of the prompts they read (and
:func:`whiflash.io.checkpoint_stamp` of each checkpoint) beside their arguments; :func:`input_changes` says
which pinned input differs between two records. Only the standard library is imported here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable
from typing import Any

__all__ = ["content_sha256", "input_changes", "samples_sha256"]


def content_sha256(value: Any) -> str:
    """sha256 of ``value`` as canonical JSON (sorted keys; tuples as lists)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _short(value: Any) -> str:
    return repr(value[:16]) if isinstance(value, str) and len(value) == 64 else repr(value)


def input_changes(pinned: dict[str, Any], now: dict[str, Any], inputs: Collection[str]) -> list[str] | None:
    """How the inputs differ between a pinned record and this run's, one ``NAME OLD -> NEW`` per input
    (nested mappings, such as a hash per prompt source, by their own keys); None when anything else differs
    too (the records are of other runs altogether), an empty list when they are the same."""
    if any(pinned.get(k) != now.get(k) for k in pinned.keys() | now.keys() if k not in inputs):
        return None
    changes = []
    for key in sorted(inputs):
        old, new = pinned.get(key), now.get(key)
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            changes += [f"{k} {_short(old.get(k))} -> {_short(new.get(k))}" for k in sorted(old.keys() | new.keys())
                        if old.get(k) != new.get(k)]
        else:
            changes.append(f"{key} {_short(old)} -> {_short(new)}")
    return changes


def samples_sha256(samples: Iterable[Any]) -> dict[str, str]:
    """sha256 of the prompts of each source (``--dataset`` entry), from what the rows depend on: every sample's
    id, category, turns and token ids, in order. ``samples`` are ``whiflash.eval.datasets.Sample``-like."""
    by_source: dict[str, list[Any]] = {}
    for s in samples:
        ids = list(s.input_ids) if s.input_ids is not None else None
        by_source.setdefault(f"--dataset {s.source}", []).append([s.id, s.category, list(s.turns), ids])
    return {source: content_sha256(items) for source, items in by_source.items()}
