"""`whiflash-eval report --replay DATA --latency-profile FILE`: measured routers against the speed oracle.

The speed oracle (`whiflash.speed_oracle`) comes from datagen rows and a latency profile, so it is
an estimate; a bench run measures. Per category the report takes the oracle's *relative* gain over the
better standalone drafter from the replay (both costed the same way) and the better standalone drafter
from the run itself (the faster of the pair's single-drafter methods, by upstream's speedup), so

    share of the speed oracle's gain = (method speedup / better standalone speedup - 1) / speed oracle gain

which is (method tok/s - best tok/s) / (oracle tok/s - best tok/s) with the oracle at the measured
better drafter times (1 + its replayed gain). Speedups share the run's AR, so they stand for tokens/s.

When the rows hold the run's own prompts (datagen gives a testbed prompt the sample id the bench gives it,
so `whiflash-datagen --prompts testbed:test` with the bench's `--max-samples` a category covers them), the
replay keeps only those: the oracle's gain on exactly the prompts measured. Then which prompts that gain
comes from (`whiflash.speed_oracle.prompt_gains`: how many carry half of it, the largest parts). Beside it,
each slot's τ in the rows (mean of per-prompt means) against the τ the run measured for that drafter alone:
the rows follow the oracle's path, so a gap there is what the logged states do not share with a drafter's own
decode.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from whiflash.latency import LatencyProfile, slot_kind
from whiflash.speed_oracle import walked

__all__ = ["oracle_shares", "shares_markdown"]


def _standalone_names(kind: str, tree_budget: int | None) -> tuple[str, ...]:
    """Method names a bench run gives a slot's drafter alone."""
    return ("ddtree", slot_kind(kind, tree_budget)) if kind == "ddtree" else (kind,)


def oracle_shares(results: dict[str, Any], data: str | Path, profile_path: str | Path, lazy: bool = True,
                  samples: dict[str, str] | None = None) -> dict[str, Any]:
    """Per category of the run: the better standalone drafter measured, the speed oracle's replayed gain over
    it, and every routed method's share of that gain (None where the oracle gains nothing or a figure is
    missing). `samples`: the run's sample ids and their categories; where the rows hold any of them, only those
    prompts' rows are replayed."""
    from .replay import read_rounds, rows_of_prompts
    from whiflash.speed_oracle import DEFINITION, oracle_gain_share, speed_oracle

    profile = LatencyProfile.read(profile_path, flag="--latency-profile")
    manifest, cols = read_rounds(data, with_hidden=False)
    own = rows_of_prompts(cols, samples or ())
    cols = own or cols
    kinds, budget = tuple(manifest.pair.slots), manifest.tree_budget
    every = manifest.every_position
    oracle = speed_oracle(cols, kinds, profile, budget, lazy, every, by_prompt=True)["categories"]
    names = [n for k in kinds for n in _standalone_names(k, budget)]
    out: dict[str, Any] = {}
    for cat, per in (results.get("cells") or {}).items():
        o = oracle.get(cat)
        alone = {m: per[m]["speedup"] for m in names if m in per and per[m].get("speedup") is not None}
        if o is None or not alone:
            continue
        best = max(alone, key=lambda m: alone[m])
        gain = o["oracle_gain"]
        routed = {m: f["speedup"] for m, f in per.items() if m.startswith("whiflash-") and f.get("speedup") is not None}
        sel = np.ones(len(cols["category"]), bool) if cat == "all" else cols["category"] == cat
        out[cat] = {"best_standalone": best, "best_standalone_speedup": alone[best], "speed_oracle_gain": gain,
                    "speed_oracle_speedup": alone[best] * (1 + gain),
                    "share_of_speed_oracle_gain": {m: oracle_gain_share(s, alone[best], alone[best] * (1 + gain))
                                                   for m, s in routed.items()},
                    "prompts": int(len(set(cols["prompt_id"][sel].tolist()))), "runs_own_prompts": own is not None,
                    "gain_by_prompt": o["gain_by_prompt"],
                    "run_prompts": sum(cat in ("all", c) for c in (samples or {}).values()) or None,
                    "tau_replayed": {slot_kind(k, budget): _tau_alone(cols, sel, i, every) for i, k in enumerate(kinds)},
                    "tau_measured": {slot_kind(k, budget): next((per[m].get("tau") for m in _standalone_names(k, budget)
                                                                 if m in per), None) for k in kinds}}
    return {"data": str(data), "latency_profile": str(profile_path), "definition": DEFINITION,
            "report_definition": __doc__.split("\n\n")[1].strip() if __doc__ else "", "categories": out}


def _tau_alone(cols: dict[str, np.ndarray], sel: np.ndarray, slot: int, every: bool) -> float:
    """Slot `slot`'s τ in the rows `sel`, as the bench defines τ (mean over prompts of each prompt's mean): over
    the logged path's rounds, or over rows at every position along the slot's own walk (its τ alone)."""
    rows = {k: v[sel] for k, v in cols.items()}
    if every:
        walk = walked(np.full(len(rows["tau_0"]), slot == 0), rows)
        rows = {k: v[walk] for k, v in rows.items()}
    _, prompt = np.unique(rows["prompt_id"], return_inverse=True)
    taus = rows[f"tau_{slot}"]
    return float((np.bincount(prompt, weights=taus) / np.bincount(prompt)).mean())


def shares_markdown(shares: dict[str, Any]) -> str:
    """The report.md section: one row per category and routed method, then each slot's τ replayed and measured."""
    lines = ["| category | method | better standalone (speedup) | speed oracle gain (replayed) | "
             "share of the speed oracle's gain | prompts replayed |", "|---|---|---|---|---|---|"]
    for cat, c in shares["categories"].items():
        whose = f"of the run's {c.get('run_prompts')}" if c.get("runs_own_prompts") else "the dataset's"
        for m, share in c["share_of_speed_oracle_gain"].items():
            lines.append(f"| {cat} | {m} | {c['best_standalone']} ({c['best_standalone_speedup']:.3f}×) | "
                         f"{100 * c['speed_oracle_gain']:+.1f}% | {'—' if share is None else f'{share:.3f}'} | "
                         f"{c.get('prompts', '—')} ({whose}) |")
    lines += ["", "Where the speed oracle's gain lies (`whiflash.speed_oracle.prompt_gains`: each prompt's part of it, "
              "and on that prompt alone the oracle's gain over the better drafter):", "",
              "| category | prompts that carry half of it | the largest parts |", "|---|---|---|"]
    for cat, c in shares["categories"].items():
        parts = c.get("gain_by_prompt") or []
        if parts:
            half = next(i + 1 for i, v in enumerate(np.cumsum([e["share"] for e in parts])) if v >= 0.5 - 1e-9)
            top = "; ".join(f"`{e['prompt_id']}` {e['share']:.2f} ({100 * e['gain']:+.1f}%)" for e in parts[:3])
            lines.append(f"| {cat} | {half} of {len(parts)} | {top} |")
    lines += ["", "| category | drafter | τ replayed from the rows (their path's rounds, or rows at every position "
              "along its own walk) | τ measured alone |", "|---|---|---|---|"]
    for cat, c in shares["categories"].items():
        for kind, tau in c.get("tau_replayed", {}).items():
            measured = c.get("tau_measured", {}).get(kind)
            lines.append(f"| {cat} | {kind} | {tau:.2f} | {'—' if measured is None else f'{measured:.2f}'} |")
    return "\n".join(lines)
