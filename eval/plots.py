"""Plots of a run (matplotlib, Agg backend): speedup bars, tau histograms, routed-slot timelines and, for swept
methods (DDTree budgets, router thresholds), speedup against the setting."""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

log = logging.getLogger(__name__)

from .families import parse_method

__all__ = ["slot_timelines", "speedup_bars", "sweep_lines", "tau_histograms", "write_plots"]


def speedup_bars(results: list[tuple[str, dict[str, Any]]], path: Path) -> Path:
    """Grouped bars of the speedup (mean AR TPOT / mean method TPOT, 95% interval as error bars) per category x
    method, one group per category; several runs are shown side by side as `run/method`."""
    series: list[tuple[str, dict[str, dict[str, Any]]]] = []
    cats: list[str] = []
    for label, res in results:
        for m in res["methods"]:
            if m == "ar":
                continue
            series.append((f"{label}/{m}" if label else m, {c: per[m] for c, per in res["cells"].items() if m in per}))
        cats += [c for c in res["cells"] if c not in cats]
    fig, ax = plt.subplots(figsize=(min(14.0, max(6.0, 0.35 * len(cats) * max(1, len(series)))), 4))
    width = 0.8 / max(1, len(series))
    for i, (name, per) in enumerate(series):
        xs = [j + i * width for j in range(len(cats))]
        ys = [per[c]["speedup"] if c in per else math.nan for c in cats]
        lo = [max(0.0, y - per[c]["speedup_ci_low"]) if c in per else 0 for c, y in zip(cats, ys)]
        hi = [max(0.0, per[c]["speedup_ci_high"] - y) if c in per else 0 for c, y in zip(cats, ys)]
        ax.bar(xs, ys, width, label=name, yerr=[lo, hi], capsize=2)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cats))], cats)
    ax.set_ylabel("speedup over AR (×, mean TPOT ratio)")
    ax.legend(fontsize=7)
    return _save(fig, path)


def tau_histograms(res: dict[str, Any], path: Path) -> Path:
    """Share of rounds per tau value, one line per method (all categories pooled)."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for m, fig_ in res["cells"].get("all", {}).items():
        hist = {int(k): v for k, v in fig_["tau_histogram"].items()}
        total = sum(hist.values())
        if m == "ar" or not total:
            continue
        xs = sorted(hist)
        ax.plot(xs, [hist[x] / total for x in xs], marker="o", label=m)
    ax.set_xlabel("τ (accepted drafts + 1)")
    ax.set_ylabel("share of rounds")
    ax.legend(fontsize=7)
    return _save(fig, path)


def slot_timelines(rows: list[dict[str, Any]], path: Path, max_samples: int = 4) -> Path | None:
    """For a few routed decodes: which slot proposed each output token (token index on x)."""
    routed = [r for r in rows if r.get("slots")][:max_samples]
    if not routed:
        return None
    fig, axes = plt.subplots(len(routed), 1, figsize=(8, 0.9 * len(routed) + 0.8), squeeze=False)
    for ax, r in zip(axes[:, 0], routed):
        pos = 1  # the first token comes from the prefill
        for slot, tau in zip(r["slots"], r["taus"]):
            ax.barh(0, tau, left=pos, color="tab:blue" if slot == 0 else "tab:orange", edgecolor="white", lw=0.3)
            pos += tau
        ax.set_yticks([])
        ax.set_xlim(0, max(pos, 2))
        ax.set_title(f"{r['sample']} turn {r['turn']} {r['method']}", fontsize=7, loc="left")
    axes[-1, 0].set_xlabel("output token (blue: slot 0, orange: slot 1)")
    return _save(fig, path)


def sweep_lines(results: dict[str, Any], path: Path) -> Path | None:
    """Speedup against the setting of every swept family (DDTree budget, router threshold): one panel per family,
    one line per category; None when nothing was swept over two settings or more."""
    families: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for cat, per in results["cells"].items():
        for name, fig in per.items():
            family, value = parse_method(name)
            if value is not None and not math.isnan(fig["speedup"]):
                families.setdefault(family, {}).setdefault(cat, []).append((value, fig["speedup"]))
    families = {f: per for f, per in families.items() if any(len(v) > 1 for v in per.values())}
    if not families:
        return None
    fig, axes = plt.subplots(1, len(families), figsize=(5 * len(families), 3.5), squeeze=False)
    for ax, (family, per) in zip(axes[0], families.items()):
        for cat, points in per.items():
            points.sort()
            ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=cat)
        if family == "ddtree":  # budgets double from one setting to the next: a log axis labelled with them
            ax.set_xscale("log", base=2)
            ticks = sorted({x for points in per.values() for x, _ in points})
            ax.set_xticks(ticks, [f"{x:g}" for x in ticks])
            ax.minorticks_off()
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xlabel("tree budget" if family == "ddtree" else f"{family} threshold")
        ax.set_ylabel("speedup over AR (×)")
        ax.set_title(family, fontsize=9)
        ax.legend(fontsize=7)
    return _save(fig, path)


def write_plots(run: Path, results: dict[str, Any], rows: list[dict[str, Any]] | None = None) -> list[Path]:
    """speedup.png, tau_hist.png, (routed methods) slots.png and (swept methods) sweep.png under `run/plots`."""
    out = run / "plots"
    out.mkdir(exist_ok=True)
    paths = [speedup_bars([("", results)], out / "speedup.png"), tau_histograms(results, out / "tau_hist.png")]
    swept = sweep_lines(results, out / "sweep.png")
    if swept:
        paths.append(swept)
    if rows:
        p = slot_timelines(rows, out / "slots.png")
        if p:
            paths.append(p)
    return paths


def _save(fig: Any, path: Path) -> Path:
    """Lay out, write and close a figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
