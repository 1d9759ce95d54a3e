"""A testbed's realism bars and its router's, read off one benchmark run: each bar, what was measured, met or by
how much not.

Usage: python scripts/testbed_bars.py RESULTS.json [--t1 RESULTS_T1.json] [--testbed DIR] [--build-minutes 12]
       [--pair df-e3] [--thresholds THRESHOLDS.json] [--out BARS.md]

``RESULTS.json`` is a ``whiflash-eval bench`` results file at temperature 0 (the routed bench of
``scripts/gpu_loop.sh`` holds AR, EAGLE-3, DFlash, DDTree at its budgets and the per-round oracle); ``--t1`` one at
temperature 1. Speedups are the bench's own (mean AR time per output token / mean method time per output token over a
category's samples), medians its per-prompt medians, τ its mean of per-sample means. ``--testbed`` adds the build's
stage minutes (corpus to dflash, from ``manifest.json``) and, where the oracle was not benched, the acceptance stage's
oracle τ headroom. The bars:

- every speculative method above 1.5x in every category at T = 0, above 1.2x at T = 1;
- for every method and category, the median per-prompt ratio at least 0.8 of the category's speedup;
- τ in the released drafters' ranges: DFlash >= 3 on prose, >= 5 on code, >= 6 on math; EAGLE-3 within 3..5;
- EAGLE-3 faster than DFlash on prose, DFlash faster than EAGLE-3 on code and math;
- the per-round oracle's τ at least 1.10x the better drafter's in at least two categories;
- DDTree at some budget <= 64 faster than DFlash on code and math;
- the build's stages within ``--build-minutes``;
- and the router's: each routed method (WhiFlash-Neural, WhiFlash-Entropy) at least as fast as the faster drafter
  of its pair (``--pair``: EAGLE-3 and DFlash for ``df-e3``, EAGLE-3 and DDTree for ``ddt-e3``) in every category,
  by the bench's paired gain and its interval (``pinned``: the method ran that drafter alone there);
- with ``--thresholds`` (a replayed calibration, ``whiflash-eval calibrate --replay``'s thresholds JSON): the routed
  method's share of the speed oracle's gain over the better drafter alone at least 0.5 in every category where
  that gain is at least 5%, on the rows the calibration replayed (which prompts: the file's ``samples``).
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

STAGES = ("corpus", "tokenizer", "tokens", "target", "responses", "eagle3", "dflash")
"""The build stages the budget covers (the acceptance stage is a measurement, not part of the world)."""
NOT_SPECULATIVE = {"ar", "oracle"}
TAU_RANGES = {("dflash", "prose"): (3.0, None), ("dflash", "code"): (5.0, None), ("dflash", "math"): (6.0, None)}
"""(method, category) -> (low, high) of τ; EAGLE-3's 3..5 holds in every category."""


def load_results(path: Path) -> dict:
    """A bench results file, with a clear error for anything else."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise SystemExit(f"{path}: not a readable JSON file ({err})")
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, dict) or not cells:
        raise SystemExit(f"{path}: no 'cells' (category -> method -> figures); expected a whiflash-eval bench "
                         f"results JSON")
    return data


def per_category(cells: dict) -> dict[str, dict[str, dict]]:
    """``category -> method -> cell`` without the pooled ``all``: the bars are per category."""
    return {cat: methods for cat, methods in cells.items() if cat != "all"}


def ddtree_methods(methods) -> list[str]:
    """DDTree entries at a budget <= 64 (``ddtree`` or ``ddtree-bN``)."""
    out = []
    for m in methods:
        hit = re.fullmatch(r"ddtree(?:-b(\d+))?", m)
        if hit and int(hit.group(1) or 0) <= 64:
            out.append(m)
    return out


def bars(t0: dict, t1: dict | None = None, build_seconds: float | None = None, build_minutes: float = 12.0,
         acceptance_headroom: dict[str, float] | None = None) -> list[tuple[str, str, bool, str]]:
    """``(bar, measured, met, distance)`` rows; ``distance`` is empty where the bar is met."""
    rows: list[tuple[str, str, bool, str]] = []
    cats = sorted(t0)

    def per_method(cells: dict, bar: str, value, floor: float, skip: set[str]) -> None:
        """One row a method: its value in every category, met where all are at least ``floor``."""
        methods = dict.fromkeys(m for cat in sorted(cells) for m in cells[cat] if m not in skip)
        for m in methods:
            got = {cat: value(cells[cat][m]) for cat in sorted(cells) if m in cells[cat]}
            got = {cat: v for cat, v in got.items() if v is not None}
            if not got:
                continue
            misses = {cat: v for cat, v in got.items() if not v > floor}
            rows.append((bar.format(m=m), " · ".join(f"{cat} {v:.2f}" for cat, v in got.items()), not misses,
                         " · ".join(f"{cat} {v - floor:+.2f}" for cat, v in misses.items())))

    per_method(t0, "T=0 speedup of {m} > 1.5x", lambda c: c["speedup"], 1.5, NOT_SPECULATIVE)
    if t1:
        per_method(t1, "T=1 speedup of {m} > 1.2x", lambda c: c["speedup"], 1.2, NOT_SPECULATIVE)
    # the median over the speedup must reach 0.8: the bar holds at equality, hence the floor just below it
    per_method(t0, "median per-prompt ratio of {m} / its speedup >= 0.8",
               lambda c: None if c.get("speedup_median_ratio") is None else c["speedup_median_ratio"] / c["speedup"],
               0.8 - 1e-9, {"ar"})
    for cat in cats:
        for m in ("eagle3", "dflash"):
            if m not in t0[cat]:
                continue
            low, high = TAU_RANGES.get((m, cat), (3.0, 5.0) if m == "eagle3" else (None, None))
            if low is None:
                continue
            tau = t0[cat][m]["tau"]
            ok = tau >= low and (high is None or tau <= high)
            want = f">= {low:g}" if high is None else f"{low:g}..{high:g}"
            dist = "" if ok else (f"{tau - low:+.2f}" if tau < low else f"{tau - high:+.2f}")
            rows.append((f"tau {m} {cat} {want}", f"{tau:.2f}", ok, dist))
    for cat, faster, slower in (("prose", "eagle3", "dflash"), ("code", "dflash", "eagle3"),
                                ("math", "dflash", "eagle3")):
        if cat in t0 and faster in t0[cat] and slower in t0[cat]:
            a, b = t0[cat][faster]["speedup"], t0[cat][slower]["speedup"]
            rows.append((f"{faster} faster than {slower} on {cat}", f"{a:.2f}x vs {b:.2f}x", a > b,
                         "" if a > b else f"{a / b - 1:+.1%}"))
    headroom = {}
    for cat in cats:
        cell = t0[cat]
        if "oracle" in cell and "eagle3" in cell and "dflash" in cell:
            headroom[cat] = cell["oracle"]["tau"] / max(cell["eagle3"]["tau"], cell["dflash"]["tau"])
    source = "bench"
    if not headroom and acceptance_headroom:
        headroom, source = dict(acceptance_headroom), "acceptance"
    if headroom:
        n = sum(h >= 1.10 for h in headroom.values())
        shown = ", ".join(f"{c} x{h:.2f}" for c, h in sorted(headroom.items()))
        rows.append((f"oracle tau headroom >= x1.10 in >= 2 categories ({source})", shown, n >= 2,
                     "" if n >= 2 else f"{n} of 2"))
    for cat in ("code", "math"):
        if cat not in t0 or "dflash" not in t0[cat]:
            continue
        trees = ddtree_methods(t0[cat])
        if not trees:
            continue
        best = max(trees, key=lambda m: t0[cat][m]["speedup"])
        a, b = t0[cat][best]["speedup"], t0[cat]["dflash"]["speedup"]
        rows.append((f"DDTree (budget <= 64) faster than DFlash on {cat}", f"{best} {a:.2f}x vs {b:.2f}x", a > b,
                     "" if a > b else f"{a / b - 1:+.1%}"))
    if build_seconds is not None:
        minutes = build_seconds / 60
        ok = minutes <= build_minutes
        rows.append((f"build stages <= {build_minutes:g} min", f"{minutes:.1f} min", ok,
                     "" if ok else f"{minutes - build_minutes:+.1f} min"))
    return rows


def router_rows(gains: dict, cells: dict, pair: str = "df-e3") -> list[tuple[str, str, bool, str]]:
    """Each routed method against the faster drafter of its pair, per category, from the bench's paired gains (%)."""
    parallel = "dflash" if pair == "df-e3" else "ddtree"
    rows = []
    for method in sorted(m for m in gains if m.startswith("whiflash")):  # the oracle is an analysis bound
        for cat in sorted(c for c in gains[method] if c in cells):
            g = gains[method][cat]
            speed = {m: cells[cat][m]["speedup"] for m in cells[cat]
                     if m == "eagle3" or m == parallel or m.startswith(parallel + "-")}
            if "eagle3" not in speed or len(speed) < 2:
                continue
            # the bench's gain is against the pair's own parallel drafter; its other DDTree budgets only say
            # which side of the pair is the faster one
            key = "vs_eagle3" if max(speed, key=speed.get) == "eagle3" else f"vs_{parallel}"
            if g.get(key) is None:
                continue
            low, high = g.get(f"{key}_ci") or (float("nan"), float("nan"))
            pinned = f", pinned {g['pinned']}" if g.get("pinned") else ""
            rows.append((f"{method} >= the faster of its pair on {cat}",
                         f"{g[key]:+.1f}% ({low:+.1f}..{high:+.1f}) vs {key[3:]}{pinned}", g[key] >= 0,
                         "" if g[key] >= 0 else f"{g[key]:+.1f}%"))
    return rows


def share_rows(path: Path, min_gain: float = 0.05, min_share: float = 0.5) -> list[tuple[str, str, bool, str]]:
    """The routed method's share of the speed oracle's gain per category, from a replayed calibration's file: a
    bar wherever the oracle gains at least ``min_gain`` over the better drafter alone."""
    try:
        data = json.loads(path.read_text())
        method, details = data["method"], data["details"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise SystemExit(f"{path}: not a replayed calibration's thresholds JSON with 'method' and 'details' ({err})")
    rows = []
    for cat, d in sorted(details.items()):
        gain, share = d.get("speed_oracle_gain"), d.get("share_of_speed_oracle_gain")
        if gain is None or share is None or gain < min_gain:
            continue
        ok = share >= min_share
        rows.append((f"{method} share of the speed oracle's gain >= {min_share:g} on {cat} (replayed)",
                     f"{share:.2f} of +{gain:.1%} at threshold {d.get('threshold')}", ok,
                     "" if ok else f"{share - min_share:+.2f}"))
    return rows


def testbed_figures(folder: Path) -> tuple[float | None, dict[str, float] | None]:
    """Stage seconds (corpus to dflash; None unless all were built) and the acceptance stage's oracle headroom."""
    path = folder / "manifest.json"
    try:
        stages = json.loads(path.read_text())["stages"]
    except (OSError, json.JSONDecodeError, KeyError) as err:
        raise SystemExit(f"{path}: not a testbed manifest with 'stages' ({err})")
    done = [stages.get(s, {}) for s in STAGES]
    seconds = sum(s["seconds"] for s in done) if all(s.get("done") for s in done) else None
    return seconds, stages.get("acceptance", {}).get("oracle_headroom")


def render(rows: list[tuple[str, str, bool, str]]) -> str:
    """A markdown table, unmet bars first, with a count line."""
    rows = sorted(rows, key=lambda r: r[2])
    lines = ["| bar | measured | met | distance |", "|---|---|---|---|"]
    lines += [f"| {bar} | {got} | {'yes' if ok else '**no**'} | {dist} |" for bar, got, ok, dist in rows]
    met = sum(r[2] for r in rows)
    return "\n".join(lines) + f"\n\n{met} of {len(rows)} bars met.\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="whiflash-eval bench results JSON at temperature 0")
    ap.add_argument("--t1", type=Path, default=None, help="bench results JSON at temperature 1")
    ap.add_argument("--testbed", type=Path, default=None, help="the built testbed (its manifest.json)")
    ap.add_argument("--build-minutes", type=float, default=12.0, help="the build's budget in minutes of stages")
    ap.add_argument("--pair", choices=("df-e3", "ddt-e3"), default="df-e3", help="the routed methods' drafter pair")
    ap.add_argument("--thresholds", type=Path, default=None,
                    help="a replayed calibration's thresholds JSON: the router's share of the speed oracle's gain")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = ap.parse_args()
    seconds, headroom = testbed_figures(args.testbed) if args.testbed else (None, None)
    t0 = load_results(args.results)
    cells = per_category(t0["cells"])
    rows = bars(cells, per_category(load_results(args.t1)["cells"]) if args.t1 else None, seconds,
                args.build_minutes, headroom)
    shares = share_rows(args.thresholds) if args.thresholds else []
    table = render(rows + router_rows(t0.get("gains") or {}, cells, args.pair) + shares)
    print(table, end="")
    if args.out:
        args.out.write_text(table)


if __name__ == "__main__":
    main()
