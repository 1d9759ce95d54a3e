"""Aggregation of per-sample rows into the reported figures (the protocol is in `PROTOCOL`).

Every row is one (sample, turn, method) decode with its time per output token (TPOT) and the AR
baseline's TPOT on the same prompt in the same process. Per category and method:

* speedup (mean) = mean over rows of AR TPOT / method TPOT, with a seeded bootstrap 95% interval;
* speedup (pooled) = (total AR decode time / AR tokens) / (total method decode time / method tokens);
* tau = mean over rows of the row's mean tau; tau_pooled = all rounds' tau averaged; a histogram;
* routed methods: slot-0 share of rounds, switch rate, catch-up share of decode time (only when
  catch-up was timed).
"""
from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable
from typing import Any

from whiflash.decoding.stats import TAU_DEFINITION

__all__ = ["PROTOCOL", "aggregate", "bootstrap_ci", "decode_tokens", "gains"]

PROTOCOL = (
    "Per sample, every method (AR included) decodes the same prompt in the same process, in an order that "
    "rotates from sample to sample. Before the first timed sample the target cache is allocated for the "
    "longest sample and every method runs one untimed warm-up decode (capturing CUDA graphs when enabled). "
    "Timings are device-synchronised; prefill is excluded: time per output token (TPOT) = decode seconds / "
    "decode tokens, where decode tokens = new tokens - 1 (the first new token comes from the prefill). "
    "Speedup = mean over samples of AR TPOT / method TPOT (bootstrap 95% interval over samples), and the "
    "pooled ratio of total-time TPOTs. Every greedy output is compared with AR's token for token."
)


def decode_tokens(new_tokens: int) -> int:
    """Tokens produced by the decode rounds (the first new token comes from the prefill)."""
    return max(0, new_tokens - 1)


def tpot(row: dict[str, Any]) -> float | None:
    """Decode seconds per decode token of a row, or None when it decoded nothing."""
    n = decode_tokens(row["new_tokens"])
    return row["decode_seconds"] / n if n and row["decode_seconds"] > 0 else None


def bootstrap_ci(values: list[float], iterations: int = 1000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` (NaN, NaN when empty)."""
    if not values:
        return math.nan, math.nan
    if len(values) == 1:
        return values[0], values[0]
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choice(values) for _ in range(n)) / n for _ in range(iterations))
    lo = means[int((1 - level) / 2 * (iterations - 1))]
    hi = means[int((1 + level) / 2 * (iterations - 1))]
    return lo, hi


def _mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else math.nan


def summarize_rows(rows: list[dict[str, Any]], seed: int = 0, iterations: int = 1000) -> dict[str, Any]:
    """The figures of one cell (one category, or all, for one method)."""
    ratios = [r["speedup"] for r in rows if r.get("speedup") is not None]
    ar_time = sum(r["ar_decode_seconds"] for r in rows if r.get("speedup") is not None)
    ar_tok = sum(decode_tokens(r["ar_new_tokens"]) for r in rows if r.get("speedup") is not None)
    m_time = sum(r["decode_seconds"] for r in rows if r.get("speedup") is not None)
    m_tok = sum(decode_tokens(r["new_tokens"]) for r in rows if r.get("speedup") is not None)
    pooled = (ar_time / ar_tok) / (m_time / m_tok) if ar_tok and m_tok and m_time > 0 and ar_time > 0 else math.nan
    lo, hi = bootstrap_ci(ratios, iterations, seed)
    seqs = [r for r in rows if r["taus"]]
    rounds = [t for r in seqs for t in r["taus"]]
    hist = Counter(rounds)
    slots = [s for r in rows for s in r.get("slots") or []]
    routed = bool(slots)
    total_decode = sum(r["decode_seconds"] for r in rows)
    timed = [r for r in rows if r.get("catchup_timed")]
    out: dict[str, Any] = {
        "n": len(rows),
        "speedup": _mean(ratios), "speedup_ci_low": lo, "speedup_ci_high": hi, "speedup_pooled": pooled,
        "tau": _mean(sum(r["taus"]) / len(r["taus"]) for r in seqs), "tau_pooled": _mean(rounds),
        "tau_histogram": {str(k): v for k, v in sorted(hist.items())},
        "tokens_per_second": (sum(decode_tokens(r["new_tokens"]) for r in rows) / total_decode
                              if total_decode > 0 else math.nan),
        "mismatches": sum(1 for r in rows if r.get("mismatch")),
        "slot0_share": _mean(1.0 if s == 0 else 0.0 for s in slots) if routed else None,
        "switch_rate": _mean(r["switch_rate"] for r in rows if r.get("slots")) if routed else None,
        "catchup_share": (sum(r["catchup_seconds"] for r in timed) / sum(r["decode_seconds"] for r in timed)
                          if routed and timed and sum(r["decode_seconds"] for r in timed) > 0 else None),
    }
    return out


def aggregate(rows: list[dict[str, Any]], methods: list[str], seed: int = 0,
              iterations: int = 1000) -> dict[str, Any]:
    """`{"cells": {category: {method: figures}}, "gains": ..., "tau_definition": ..., "protocol": ...}`; category
    "all" pools every category."""
    cats = sorted({r["category"] for r in rows})
    cells: dict[str, dict[str, Any]] = {}
    for cat in [*cats, "all"]:
        cells[cat] = {}
        for m in methods:
            sel = [r for r in rows if r["method"] == m and (cat == "all" or r["category"] == cat)]
            if sel:
                cells[cat][m] = summarize_rows(sel, seed, iterations)
    return {"cells": cells, "gains": gains(cells), "categories": cats, "methods": methods,
            "tau_definition": TAU_DEFINITION, "protocol": PROTOCOL}


def gains(cells: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Upstream-style throughput gains of every routed method: `+x%` vs EAGLE-3 and vs DFlash (and DDTree),
    as (method speedup / baseline speedup - 1) * 100 per category (same prompts, same AR baseline)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for cat, per in cells.items():
        for m, fig in per.items():
            if not m.startswith("whiflash") and m != "oracle":
                continue
            for base in ("eagle3", "dflash", "ddtree"):
                if base in per and per[base]["speedup"] and not math.isnan(per[base]["speedup"]):
                    out.setdefault(m, {}).setdefault(cat, {})[f"vs_{base}"] = \
                        (fig["speedup"] / per[base]["speedup"] - 1) * 100
    return out
