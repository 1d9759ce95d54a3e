"""Run plots (matplotlib Agg): learning curves, predicted vs actual gain, tau versus threshold."""

from __future__ import annotations

import csv
import logging
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from whiflash.hub import public_name  # noqa: E402

log = logging.getLogger(__name__)


def _read_metrics(csv_path: Path) -> dict[str, list[tuple[float, float]]]:
    """``metrics.csv`` of CSVLogger -> {metric: [(step, value), ...]} (empty cells skipped)."""
    series: dict[str, list[tuple[float, float]]] = {}
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            step = float(row.get("step") or 0)
            for k, v in row.items():
                if k in ("step", "epoch") or v in (None, ""):
                    continue
                value = float(v)
                if math.isfinite(value):
                    series.setdefault(k, []).append((step, value))
    return series


def learning_curves(csv_path: Path, out: Path) -> Path | None:
    if not csv_path.is_file():
        log.warning("no %s; skipping learning curves", csv_path)
        return None
    s = _read_metrics(csv_path)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for key, style in (("train/loss_step", "-"), ("train/loss_epoch", "o-"), ("val/loss", "s-")):
        if key in s:
            x, y = zip(*s[key])
            axes[0].plot(x, y, style, label=key, alpha=0.5 if key.endswith("_step") else 1.0)
    axes[0].set(xlabel="step", ylabel="loss", title="loss", yscale="log")
    axes[0].legend()
    for key in ("val/share", "val/spearman", "val/auroc"):
        if key in s:
            x, y = zip(*s[key])
            axes[1].plot(x, y, "o-", label=key)
    axes[1].set(xlabel="step", title="validation routing quality")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def pred_vs_actual(pred: np.ndarray, gain: np.ndarray, out: Path, max_points: int = 20000) -> Path:
    rng = np.random.default_rng(0)
    idx = rng.choice(len(gain), size=min(max_points, len(gain)), replace=False)
    jitter = rng.uniform(-0.3, 0.3, size=len(idx))  # gains are integers; jitter to show density
    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.scatter(gain[idx] + jitter, pred[idx], s=3, alpha=0.25)
    lo, hi = float(min(gain.min(), pred.min())), float(max(gain.max(), pred.max()))
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
    for g in np.unique(gain):  # conditional mean of the prediction per actual gain
        m = gain == g
        if m.sum() >= 20:
            ax.plot(g, pred[m].mean(), "r_", ms=12, mew=2)
    ax.set(xlabel="actual gain tau_0 - tau_1 (jittered)", ylabel="predicted gain", title="validation: predicted vs actual")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def tau_vs_threshold(routing: dict[str, Any], out: Path, slot_names: tuple[str, str] = ("slot 0", "slot 1")) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.plot(routing["thresholds"], routing["tau_router"], "o-", ms=3, label="router (slot 0 if g_hat > theta)")
    ax.axhline(routing["tau_slot0"], color="tab:green", ls="--", label=f"{slot_names[0]} only")
    ax.axhline(routing["tau_slot1"], color="tab:orange", ls="--", label=f"{slot_names[1]} only")
    ax.axhline(routing["tau_oracle"], color="k", ls=":", label="oracle")
    ax.axvline(routing["best_threshold"], color="gray", lw=0.8)
    ax.set(xlabel="threshold theta", ylabel="mean tau (bonus incl., pooled over rounds)",
           title=f"validation replay: share of oracle gain {routing['share']:.3f}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_run(run_dir: Path, results: dict[str, Any], slot_names: tuple[str, str]) -> list[Path]:
    """All plots of a run into ``run_dir/plots``; slots are labelled by Hub id or folder name, never local path."""
    plots = run_dir / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    made = [learning_curves(run_dir / "metrics.csv", plots / "learning_curves.png")]
    scores = results.get("_scores")
    if scores is not None and len(scores["gain"]):
        made.append(pred_vs_actual(scores["pred"], scores["gain"], plots / "pred_vs_actual.png"))
    names = (public_name(slot_names[0]), public_name(slot_names[1]))
    made.append(tau_vs_threshold(results["routing"], plots / "tau_vs_threshold.png", names))
    return [p for p in made if p is not None]
