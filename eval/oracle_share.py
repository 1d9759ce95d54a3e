"""`whiflash-eval report --replay DATA --latency-profile FILE`: measured routers against the speed oracle.

The speed oracle (`whiflash.speed_oracle`) comes from datagen rows and a latency profile, so it is
an estimate; a bench run measures. Per category the report takes the oracle's *relative* gain over the
better standalone drafter from the replay (both costed the same way) and the better standalone drafter
from the run itself (the faster of the pair's single-drafter methods, by upstream's speedup), so

    share of the speed oracle's gain = (method speedup / better standalone speedup - 1) / speed oracle gain

which is (method tok/s - best tok/s) / (oracle tok/s - best tok/s) with the oracle at the measured
better drafter times (1 + its replayed gain). Speedups share the run's AR, so they stand for tokens/s.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from whiflash.latency import LatencyProfile, slot_kind

__all__ = ["oracle_shares", "shares_markdown"]


def _standalone_names(kind: str, tree_budget: int | None) -> tuple[str, ...]:
    """Method names a bench run gives a slot's drafter alone."""
    return ("ddtree", slot_kind(kind, tree_budget)) if kind == "ddtree" else (kind,)


def oracle_shares(results: dict[str, Any], data: str | Path, profile_path: str | Path,
                  lazy: bool = True) -> dict[str, Any]:
    """Per category of the run: the better standalone drafter measured, the speed oracle's replayed gain over
    it, and every routed method's share of that gain (None where the oracle gains nothing or a figure is
    missing)."""
    from .replay import read_rounds
    from whiflash.speed_oracle import DEFINITION, oracle_gain_share, speed_oracle

    profile = LatencyProfile.read(profile_path, flag="--latency-profile")
    manifest, cols = read_rounds(data, with_hidden=False)
    kinds, budget = tuple(manifest.pair.slots), manifest.tree_budget
    oracle = speed_oracle(cols, kinds, profile, budget, lazy)["categories"]
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
        out[cat] = {"best_standalone": best, "best_standalone_speedup": alone[best], "speed_oracle_gain": gain,
                    "speed_oracle_speedup": alone[best] * (1 + gain),
                    "share_of_speed_oracle_gain": {m: oracle_gain_share(s, alone[best], alone[best] * (1 + gain))
                                                   for m, s in routed.items()}}
    return {"data": str(data), "latency_profile": str(profile_path), "definition": DEFINITION,
            "report_definition": __doc__.split("\n\n")[1].strip() if __doc__ else "", "categories": out}


def shares_markdown(shares: dict[str, Any]) -> str:
    """The report.md section: one row per category and routed method."""
    lines = ["| category | method | better standalone (speedup) | speed oracle gain (replayed) | "
             "share of the speed oracle's gain |", "|---|---|---|---|---|"]
    for cat, c in shares["categories"].items():
        for m, share in c["share_of_speed_oracle_gain"].items():
            lines.append(f"| {cat} | {m} | {c['best_standalone']} ({c['best_standalone_speedup']:.3f}×) | "
                         f"{100 * c['speed_oracle_gain']:+.1f}% | {'—' if share is None else f'{share:.3f}'} |")
    return "\n".join(lines)
