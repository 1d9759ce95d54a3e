"""`whiflash-eval report RUN [RUN...]`: tables (Markdown, CSV, LaTeX) and plots from finished run folders.

Each run's `results.json` is read as written by `bench`; rows of every run appear side by side,
labelled by the run folder's name. A folder written before the speedup became upstream's ratio of
mean TPOTs (its results.json has no `metrics_version`) is re-aggregated from its `samples.jsonl`
with today's definitions, so every column means the same in every run; one without its rows is
refused.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from whiflash.errors import UsageError
from whiflash.folders import EVAL, MANIFEST, check_folder
from whiflash.io import atomic_write_json, atomic_write_text
from whiflash.locks import claim, owning_folders

from .metrics import METRICS_VERSION, aggregate
from .outputs import csv_text, latex_table, markdown_table, run_sample_ids, table_rows
from .plots import speedup_bars, tau_histograms

log = logging.getLogger(__name__)

__all__ = ["load_results", "report"]


def load_results(run: str | Path) -> dict[str, Any]:
    """The results of a run folder, re-aggregated from its rows when results.json predates the current metrics
    (a clear error when the folder is not a finished run, or an old one without its rows)."""
    path = Path(run) / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"{run}: no results.json (not a finished `whiflash-eval bench` run folder)")
    results = json.loads(path.read_text())
    if results.get("metrics_version") == METRICS_VERSION:
        return results
    rows_file = Path(run) / "samples.jsonl"
    if not rows_file.is_file():
        raise ValueError(f"{path}: written by an older whiflash-eval (metrics_version "
                         f"{results.get('metrics_version', 'absent')}, expected {METRICS_VERSION}: its 'speedup' is a "
                         "mean of per-sample ratios), and the folder has no samples.jsonl to recompute the figures "
                         "from; re-run the bench")
    rows = [json.loads(line) for line in rows_file.read_text().splitlines() if line.strip()]
    config = Path(run) / "config.json"
    seed, iterations = 0, 1000
    if config.is_file():
        saved = json.loads(config.read_text())
        seed, iterations = int(saved.get("seed", 0)), int(saved.get("bootstrap", 1000))
    methods = results.get("methods") or list(dict.fromkeys(r["method"] for r in rows))
    log.info("%s: results.json predates metrics version %d; figures recomputed from samples.jsonl", run,
             METRICS_VERSION)
    return {**results, **aggregate(rows, methods, seed=seed, iterations=iterations)}


@owning_folders()  # the report folder's lock ends with the call
def report(runs: list[str], out: str | None = None, replay: str | None = None,
           latency_profile: str | None = None) -> Path:
    """Write report.md, report.csv, report.tex and plots for `runs` into `out`; return the folder. With
    `replay` (datagen rows) and `latency_profile`, also every routed method's share of the speed oracle's
    gain (`whiflash.eval.oracle_share`, in report.md and speed_oracle.json)."""
    if (replay is None) != (latency_profile is None):
        raise UsageError("report: --replay DATA and --latency-profile FILE go together (the speed oracle needs "
                         "both datagen rows and a latency profile)")
    loaded = [(Path(r).name, load_results(r)) for r in runs]
    shares = None
    if replay is not None:
        from .oracle_share import oracle_shares

        shares = {label: oracle_shares(res, replay, latency_profile, samples=run_sample_ids(run, "report"))
                  for run, (label, res) in zip(runs, loaded)}
    folder = Path(out) if out else Path("runs/eval") / f"report_{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    check_folder(folder, EVAL, "--out")  # never into another tool's folder (or a folder of foreign files)
    claim(folder, "--out")  # creates it
    check_folder(folder, EVAL, "--out")  # again, under the lock
    atomic_write_json(folder / MANIFEST, {"kind": EVAL, "tool": "whiflash-eval report",
                                          "runs": [str(Path(r).resolve()) for r in runs],
                                          "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    rows = [row for label, res in loaded for row in table_rows(res, label)]
    tau_def = loaded[0][1]["tau_definition"]
    md = [f"# whiflash-eval report\n\nRuns: {', '.join(label for label, _ in loaded)}\n"]
    for label, res in loaded:
        md.append(f"## {label}\n\n{markdown_table(res, label)}")
        if res.get("mismatches"):
            md.append(f"Lossless mismatches: {len(res['mismatches'])} (see the run's results.json)\n")
        if shares is not None:
            from .oracle_share import shares_markdown

            md.append(f"Share of the speed oracle's gain over the better standalone drafter:\n\n"
                      f"{shares_markdown(shares[label])}\n")
    atomic_write_text(folder / "report.md", "\n".join(md))
    atomic_write_text(folder / "report.csv", csv_text(rows))
    if shares is not None:
        atomic_write_json(folder / "speed_oracle.json", shares)
    atomic_write_text(folder / "report.tex", latex_table(rows, tau_def, loaded[0][1]["speedup_definition"]))
    plots = folder / "plots"
    plots.mkdir(exist_ok=True)
    speedup_bars(loaded, plots / "speedup.png")
    for label, res in loaded:
        tau_histograms(res, plots / f"tau_hist_{label}.png")
    log.info("report of %d runs in %s", len(loaded), folder)
    return folder
