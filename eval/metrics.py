"""Aggregation of per-sample rows into the reported figures (the protocol is in `PROTOCOL`).

Every row is one (sample, turn, method) decode with its time per output token (TPOT) and the AR
baseline's TPOT on the same prompt in the same process. Per category (and per dataset) and method:

* speedup = mean over rows of AR TPOT / mean over the same rows of the method's TPOT (upstream's
  definition), with a seeded bootstrap 95% interval over rows;
* speedup_mean_ratio, speedup_median_ratio = mean and median over rows of the per-row ratio AR TPOT /
  method TPOT (a heavy tail shows as a median well below the speedup);
* speedup_pooled = (total AR decode time / AR tokens) / (total method decode time / method tokens);
* tau = mean over rows of the row's mean tau; tau_pooled = all rounds' tau averaged; a histogram;
* routed methods: slot-0 share of rounds, switch rate, catch-up share of decode time (only when
  catch-up was timed), and the cost of their rounds against their drafters' own (`ROUTED_ROUND_DEFINITION`);
  their gains over each standalone drafter with a paired bootstrap interval (`gains`).

Beside the figures, the decodes whose time a round is far above their method's median (`timing_outliers`).
"""
from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable
from typing import Any

from whiflash.bootstrap import bootstrap_ci, ratio_of_means_ci
from whiflash.decoding.stats import TAU_DEFINITION

from .families import best_of_families

__all__ = ["METRICS_VERSION", "ONE_OFF", "OUTLIER_FACTOR", "PROTOCOL", "ROUTED_ROUND_DEFINITION",
           "SPEEDUP_DEFINITION", "aggregate", "alone_round_ms", "alone_seconds", "bootstrap_ci", "decode_tokens",
           "gains", "one_off_text", "ratio_of_means_ci", "timing_outliers"]

METRICS_VERSION = 2
"""Version of the figures in results.json: 2 = speedup as a ratio of mean TPOTs (1, unmarked: a mean of ratios)."""

SPEEDUP_DEFINITION = ("speedup = mean over samples of AR time per output token / mean over the same samples of the "
                      "method's time per output token (bootstrap 95% interval over samples); mean ratio and median "
                      "ratio = mean and median over samples of the per-sample ratio AR TPOT / method TPOT; pooled = "
                      "total AR time per token / total method time per token")
"""The one definition of the speedup columns, printed under every table and written into every results.json."""

ROUTED_ROUND_DEFINITION = ("vs alone = a routed method's decode time / what its rounds cost its two drafters alone on "
                           "the same prompts (each slot's rounds times that drafter's own ms a round there), - 1: what "
                           "deciding, switching (catch-up) and running as a pair add to its rounds")
"""The routed-round column's definition, printed under every table that has one."""

PROTOCOL = (
    "Per sample, every method (AR included) decodes the same prompt in the same process, in an order that "
    "changes from one sample of a category to the next (a Williams design: each method at each position and "
    "right after each other method equally often). Before the first timed sample the target cache is "
    "allocated for the longest sample and every method runs one untimed warm-up decode, a routed method one "
    "more with each of its slots forced and, with a stick rule, one with every slot-0 round kept (capturing CUDA "
    "graphs when enabled). "
    "Each decode runs with Python's garbage collector off (as timeit times). "
    "Timings are device-synchronised; the prefill is excluded, the target's pass over the prompt and every "
    "drafter's one-time pass over it (as upstream's decode time starts after the first draft call): time per output "
    "token (TPOT) = decode seconds / decode tokens, where decode tokens = new tokens - 1 (the first new token comes "
    "from the prefill). "
    "Speedup = mean AR TPOT / mean method TPOT over the same samples (bootstrap 95% interval over samples); "
    "beside it the mean and the median of per-sample ratios and the pooled ratio of total-time TPOTs. Every "
    "greedy output is compared with AR's token for token."
)


def decode_tokens(new_tokens: int) -> int:
    """Tokens produced by the decode rounds (the first new token comes from the prefill)."""
    return max(0, new_tokens - 1)


def tpot(row: dict[str, Any]) -> float | None:
    """Decode seconds per decode token of a row, or None when it decoded nothing."""
    n = decode_tokens(row["new_tokens"])
    return row["decode_seconds"] / n if n and row["decode_seconds"] > 0 else None


def _mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else math.nan


def alone_round_ms(rows: list[dict[str, Any]]) -> dict[tuple[str, int, str], float]:
    """(sample, turn, method) -> that decode's seconds a round, for every row that drafted rounds."""
    return {(r.get("sample"), r.get("turn"), r["method"]): r["decode_seconds"] / len(r["taus"])
            for r in rows if r.get("taus")}


def alone_seconds(row: dict[str, Any], alone: dict[tuple[str, int, str], float]) -> float | None:
    """What a routed row's rounds would cost its two drafters alone on its prompt (each slot's rounds times that
    drafter's seconds a round there), or None without both drafters' rows (or for a method that does not route)."""
    methods, slots = row.get("slot_methods"), row.get("slots")
    if not methods or not slots:
        return None
    per = [alone.get((row.get("sample"), row.get("turn"), m)) for m in methods]
    if any(v is None for v in per):
        return None
    n0 = sum(1 for s in slots if s == 0)
    return n0 * per[0] + (len(slots) - n0) * per[1]


OUTLIER_FACTOR = 1.5
"""A decode is a timing outlier when its ms a round exceed this many times its method's median over the run: a
method's round costs within a few percent of its median on every prompt, and one stall of 10 ms moves a short
decode's TPOT (12 rounds of 1.9 ms) by 40%."""

ONE_OFF = ("graphs_captured", "passes_compiled", "segments_reserved")
"""A bench row's counts of the work its decode paid for once (`Runner.one_off_now`)."""


def one_off_text(outlier: dict[str, Any]) -> str:
    """What a timing outlier's decode paid for once, in words, or that it paid none of it (a host stall)."""
    paid = [f"{k.replace('_', ' ')} {outlier[k]}" for k in ONE_OFF if outlier.get(k)]
    if paid:
        return "inside the timing: " + ", ".join(paid)
    if any(k in outlier for k in ONE_OFF):
        return "no graph captured, pass compiled or memory reserved inside the timing: a host or device stall"
    return "a graph captured or code compiled inside the timing, or a host stall"


def timing_outliers(rows: list[dict[str, Any]], factor: float = OUTLIER_FACTOR) -> list[dict[str, Any]]:
    """Decodes whose time a round is more than `factor` times the median of their method's decodes in the run,
    largest excess first. A round costs a method about the same on every prompt (a long context adds a little),
    so such a decode paid for something once (a graph captured or code compiled inside the timing, a host stall)
    and carries its category's mean TPOT: a finding to explain, as a mismatch is."""
    per: dict[str, list[tuple[float, dict[str, Any]]]] = {}
    for r in rows:
        if r.get("taus"):
            per.setdefault(r["method"], []).append((r["decode_seconds"] * 1e3 / len(r["taus"]), r))
    out = []
    for method, timed in per.items():
        median = statistics.median(ms for ms, _ in timed)
        for ms, r in timed:
            if median > 0 and ms > factor * median:
                out.append({"sample": r.get("sample"), "turn": r.get("turn", 0), "method": method,
                            "category": r.get("category"), "rounds": len(r["taus"]), "ms_per_round": round(ms, 3),
                            "median_ms_per_round": round(median, 3),
                            "excess_ms": round(r["decode_seconds"] * 1e3 - len(r["taus"]) * median, 1),
                            **{k: r[k] for k in ONE_OFF if k in r}})
    return sorted(out, key=lambda o: -o["excess_ms"])


def summarize_rows(rows: list[dict[str, Any]], seed: int = 0, iterations: int = 1000,
                   alone: dict[tuple[str, int, str], float] | None = None) -> dict[str, Any]:
    """The figures of one cell (one category, dataset or all, for one method); see the module doc. `alone`:
    `alone_round_ms` of the whole run, for the routed-round column."""
    timed = [r for r in rows if r.get("speedup") is not None]
    ratios = [r["speedup"] for r in timed]
    ar_tpot = [r["ar_decode_seconds"] / decode_tokens(r["ar_new_tokens"]) for r in timed]
    m_tpot = [r["decode_seconds"] / decode_tokens(r["new_tokens"]) for r in timed]
    ar_time, m_time = sum(r["ar_decode_seconds"] for r in timed), sum(r["decode_seconds"] for r in timed)
    ar_tok = sum(decode_tokens(r["ar_new_tokens"]) for r in timed)
    m_tok = sum(decode_tokens(r["new_tokens"]) for r in timed)
    pooled = (ar_time / ar_tok) / (m_time / m_tok) if ar_tok and m_tok and m_time > 0 and ar_time > 0 else math.nan
    lo, hi = ratio_of_means_ci(ar_tpot, m_tpot, iterations, seed)
    seqs = [r for r in rows if r["taus"]]
    rounds = [t for r in seqs for t in r["taus"]]
    hist = Counter(rounds)
    slots = [s for r in rows for s in r.get("slots") or []]
    routed = bool(slots)
    total_decode = sum(r["decode_seconds"] for r in rows)
    caught = [r for r in rows if r.get("catchup_timed")]
    costed = [(r["decode_seconds"], a) for r in rows if (a := alone_seconds(r, alone or {})) is not None]
    out: dict[str, Any] = {
        "n": len(rows),
        "speedup": _mean(ar_tpot) / _mean(m_tpot) if timed else math.nan,
        "speedup_ci_low": lo, "speedup_ci_high": hi,
        "speedup_mean_ratio": _mean(ratios), "speedup_median_ratio": statistics.median(ratios) if ratios else math.nan,
        "speedup_pooled": pooled,
        "ar_tpot_ms": 1000 * _mean(ar_tpot), "tpot_ms": 1000 * _mean(m_tpot),
        "tau": _mean(sum(r["taus"]) / len(r["taus"]) for r in seqs), "tau_pooled": _mean(rounds),
        "tau_histogram": {str(k): v for k, v in sorted(hist.items())},
        "tokens_per_second": (sum(decode_tokens(r["new_tokens"]) for r in rows) / total_decode
                              if total_decode > 0 else math.nan),
        "mismatches": sum(1 for r in rows if r.get("mismatch")),
        "slot0_share": _mean(1.0 if s == 0 else 0.0 for s in slots) if routed else None,
        "switch_rate": _mean(r["switch_rate"] for r in rows if r.get("slots")) if routed else None,
        "catchup_share": (sum(r["catchup_seconds"] for r in caught) / sum(r["decode_seconds"] for r in caught)
                          if routed and caught and sum(r["decode_seconds"] for r in caught) > 0 else None),
        "round_cost_vs_alone": (sum(t for t, _ in costed) / sum(a for _, a in costed) - 1.0
                                if costed and sum(a for _, a in costed) > 0 else None),
    }
    return out


def _cells(rows: list[dict[str, Any]], methods: list[str], key: str, seed: int,
           iterations: int) -> dict[str, dict[str, Any]]:
    """{group: {method: figures}} for every value of `rows[key]`, plus "all" pooling every group."""
    groups = sorted({r[key] for r in rows if r.get(key) is not None})
    alone = alone_round_ms(rows)
    cells: dict[str, dict[str, Any]] = {}
    for group in [*groups, "all"]:
        cells[group] = {}
        for m in methods:
            sel = [r for r in rows if r["method"] == m and (group == "all" or r.get(key) == group)]
            if sel:
                cells[group][m] = summarize_rows(sel, seed, iterations, alone)
    return cells


def aggregate(rows: list[dict[str, Any]], methods: list[str], seed: int = 0,
              iterations: int = 1000) -> dict[str, Any]:
    """`{"cells": {category: {method: figures}}, "datasets": {dataset: {method: figures}}, "gains": ..., "best":
    ..., definitions}`; the group "all" pools every category (dataset)."""
    cells = _cells(rows, methods, "category", seed, iterations)
    by_dataset = _cells(rows, methods, "dataset", seed, iterations) if any(r.get("dataset") for r in rows) else {}
    return {"metrics_version": METRICS_VERSION, "cells": cells, "datasets": by_dataset,
            "gains": gains(cells, rows, seed, iterations),
            "best": {"categories": best_of_families(cells), "datasets": best_of_families(by_dataset)},
            "categories": sorted({r["category"] for r in rows}), "methods": methods,
            "timing_outliers": timing_outliers(rows),
            "tau_definition": TAU_DEFINITION, "speedup_definition": SPEEDUP_DEFINITION,
            "routed_round_definition": ROUTED_ROUND_DEFINITION, "protocol": PROTOCOL}


def gains(cells: dict[str, dict[str, Any]], rows: list[dict[str, Any]] | None = None, seed: int = 0,
          iterations: int = 1000) -> dict[str, dict[str, dict[str, Any]]]:
    """Upstream-style throughput gains of every routed method: `+x%` vs EAGLE-3 and vs DFlash (and DDTree),
    as (method speedup / baseline speedup - 1) * 100 per category (same prompts, same AR baseline). With DDTree
    run at several budgets (and no plain `ddtree`), the baseline is the category's best budget. With `rows`,
    each gain has its paired bootstrap 95% interval beside it (`vs_BASE_ci`, in %): the samples both methods
    decoded are resampled with their two TPOTs together, so the interval is the gain's own noise, far narrower
    than the two speedups' intervals, which both carry the spread between prompts. Where every decode of a routed
    method in a category ran one slot's drafter itself (an infinite threshold), its gain over that drafter is one
    decoder timed twice, the bench's own noise: `pinned` names that baseline."""
    best = best_of_families(cells).get("ddtree", {})
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for cat, per in cells.items():
        bases = {b: b for b in ("eagle3", "dflash", "ddtree") if b in per}
        if "ddtree" not in bases and cat in best:
            bases["ddtree"] = best[cat]["method"]
        for m, fig in per.items():
            if not m.startswith("whiflash") and m != "oracle":
                continue
            drafter = pinned_to(rows or [], cat, m)
            for base, name in bases.items():
                speedup = per[name]["speedup"]
                if not speedup or math.isnan(speedup):
                    continue
                g = out.setdefault(m, {}).setdefault(cat, {})
                g[f"vs_{base}"] = (fig["speedup"] / speedup - 1) * 100
                if rows is not None:
                    g[f"vs_{base}_ci"] = _paired_gain_ci(rows, cat, m, name, seed, iterations)
                if name == drafter:
                    g["pinned"] = base
    return out


def pinned_to(rows: list[dict[str, Any]], cat: str, method: str) -> str | None:
    """The drafter (a slot method: `eagle3`, `dflash`, `ddtree`) that every decode of routed `method` in category
    `cat` ("all": every one) ran alone, pinned by an infinite threshold; None where any decode could decide."""
    mine = [r for r in rows if r["method"] == method and (cat == "all" or r.get("category") == cat)]
    thresholds = [r.get("threshold") for r in mine]
    if not mine or not all(isinstance(t, (int, float)) and math.isinf(t) for t in thresholds):
        return None
    slots = {s for r in mine for s in r.get("slots") or ()}
    names = {tuple(r.get("slot_methods") or ()) for r in mine}
    if len(slots) != 1 or len(names) != 1:
        return None
    (slot,), (slot_methods,) = slots, names
    return slot_methods[slot] if slot < len(slot_methods) else None


def _paired_gain_ci(rows: list[dict[str, Any]], cat: str, method: str, base: str, seed: int,
                    iterations: int) -> tuple[float, float]:
    """The bootstrap 95% interval, in %, of `method`'s gain over `base` in category `cat` ("all": every one):
    mean base TPOT / mean method TPOT - 1 over the samples (and turns) both timed, resampled in pairs."""
    tpots: dict[str, dict[tuple[Any, Any], float]] = {method: {}, base: {}}
    for r in rows:
        if r["method"] in tpots and (cat == "all" or r.get("category") == cat) and r.get("speedup") is not None:
            t = tpot(r)
            if t is not None:
                tpots[r["method"]][(r.get("sample"), r.get("turn"))] = t
    keys = sorted(tpots[method].keys() & tpots[base].keys(), key=repr)
    lo, hi = ratio_of_means_ci([tpots[base][k] for k in keys], [tpots[method][k] for k in keys], iterations, seed)
    return (lo - 1) * 100, (hi - 1) * 100
