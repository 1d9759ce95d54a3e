"""Run folders and result files: `runs/eval/<timestamp>_<name>/` with config, manifest, rows and tables.

A run folder holds `config.yaml` (the resolved flags), `manifest.json` (kind `whiflash.eval`),
`samples.jsonl` (one row per sample x turn x method, appended as it goes), `results.json`,
`results.csv`, `results.md` and `plots/`. A new run never reuses a folder, except to resume: an
eval folder of the same name whose `config.json` equals this run's config, the content hashes of its
prompts and the stamps of its checkpoints included, is continued (done rows are skipped). `--out`
holds run folders and may not be one itself (`whiflash/folders.py`); `--name` is one folder name. A run
holds its folder's lock (`whiflash/locks.py`) while it writes there.
"""
from __future__ import annotations

import csv
import glob
import io
import json
import logging
import math
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from whiflash.containment import plain_name
from whiflash.folders import EVAL, MANIFEST, check_folder, folder_kind
from whiflash.inputs import input_changes
from whiflash.io import append_text, atomic_write_json, atomic_write_text
from whiflash.locks import claim
from whiflash.versions import package_versions

from .decisions import decisions_markdown
from .metrics import OUTLIER_FACTOR, SPEEDUP_DEFINITION, one_off_text

log = logging.getLogger(__name__)

__all__ = ["SampleLog", "check_output_file", "csv_text", "latex_table", "markdown_table", "prepare_run_dir",
           "write_manifest", "write_results", "write_save_path"]

CONFIG_FILE = "config.json"
PINNED_INPUTS = ("inputs", "checkpoint_files")
"""Config fields that pin a run's inputs by content (prompt hashes per source, checkpoint stamps)."""
RUN_FOLDER = "run folder (--out/--name)"


def check_output_file(path: str | Path | None, flag: str = "--output") -> None:
    """Refuse, before any work, an `--output` that cannot take a file (a folder there)."""
    if path is not None and Path(path).is_dir():
        raise ValueError(f"{flag} {path}: is a folder; expected the path of a JSON file to write")


def prepare_run_dir(out: str | Path, name: str, config: dict[str, Any], resume: bool = True) -> tuple[Path, bool]:
    """(folder, resumed): the newest `<out>/*_<name>` eval run holding the same config (when `resume`), else a
    new timestamped folder. Runs that cannot continue a half-done folder (a profile) pass `resume=False`.
    `out` holds run folders and may not be one itself (a testbed, a dataset, a run)."""
    root = Path(out)
    plain_name(name, "--name")  # one folder inside --out, never a path out of it
    check_folder(root, None, "--out")
    now = json.loads(json.dumps(config))
    for old in sorted(root.glob(f"*_{glob.escape(name)}"), reverse=True) if resume else []:
        saved = old / CONFIG_FILE
        # a run killed before its manifest has no kind yet; another tool's folder is never resumed
        if not (saved.is_file() and folder_kind(old) in (EVAL, None)):
            continue
        pinned = json.loads(saved.read_text())
        if pinned == now:
            claim(old, RUN_FOLDER)  # a run still writing there is named and refused
            log.info("resuming %s (same configuration and inputs)", old)
            return old, True
        changes = input_changes(pinned, now, PINNED_INPUTS)
        if changes:  # the same command on edited prompts or retrained checkpoints: its rows are not reused
            log.warning("not resuming %s: its inputs changed (%s); starting a new run folder", old, "; ".join(changes))
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path = root / f"{stamp}_{name}"
    i = 1
    while path.exists():  # never overwrite: another run started within the same second
        path = root / f"{stamp}-{i}_{name}"
        i += 1
    claim(path, RUN_FOLDER)  # creates it; a refused run removes it again (whiflash.locks.owning_folders)
    atomic_write_json(path / CONFIG_FILE, config, sort_keys=True)
    return path, False


def _git_revision() -> dict[str, Any]:
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, timeout=10)
        return {"sha": sha.stdout.strip() or None, "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"sha": None, "dirty": None}


def device_info(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {"device": device, "cuda": torch.version.cuda, "platform": platform.platform(),
                            "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def write_manifest(run: Path, *, argv: list[str], seed: int, device: str, models: dict[str, Any],
                   samples: list[Any], extra: dict[str, Any], command: str = "bench") -> dict[str, Any]:
    """`manifest.json` (kind `whiflash.eval`) of a bench, calibrate or profile run folder."""
    manifest = {
        "kind": EVAL, "tool": f"whiflash-eval {command}", "argv": argv, "seed": seed, "git": _git_revision(),
        "versions": package_versions("whiflash", "torch", "transformers", "datasets", "jsonargparse", "numpy"),
        "python_executable": sys.executable, "hardware": device_info(device), "models": models,
        "samples": [{"id": s.id, "category": s.category, "turns": s.n_turns, "source": s.source,
                     "dataset": getattr(s, "dataset", ""), "row": getattr(s, "row", None)} for s in samples],
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **extra,
    }
    atomic_write_json(run / MANIFEST, manifest)
    return manifest


def run_sample_ids(run: str | Path, flag: str) -> dict[str, str]:
    """Sample id -> category of a bench run folder, from its manifest (a clear error naming `flag` otherwise)."""
    path = Path(run) / MANIFEST
    try:
        return {s["id"]: s.get("category", "") for s in json.loads(path.read_text())["samples"]}
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"{flag} {run}: {path} lists no samples (expected a `whiflash-eval bench` run "
                         "folder)") from None


class SampleLog:
    """`samples.jsonl`: rows appended and flushed one at a time; `done` lists (sample, turn, method) keys."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[dict[str, Any]] = []
        self._index: dict[tuple[str, int, str], dict[str, Any]] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    try:
                        self.rows.append(json.loads(line))
                    except json.JSONDecodeError:  # a line cut by a kill: dropped and redone
                        log.warning("%s: skipping a truncated row", path)
            # rewrite without a truncated tail so appends start on a fresh line (atomically: a kill
            # during the rewrite must not lose the rows already there)
            atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in self.rows))
        self._index = {_key(r): r for r in self.rows}

    @property
    def done(self) -> set[tuple[str, int, str]]:
        return set(self._index)

    def find(self, sample: str, turn: int, method: str) -> dict[str, Any] | None:
        return self._index.get((sample, turn, method))

    def append(self, row: dict[str, Any]) -> None:
        append_text(self.path, json.dumps(row) + "\n")  # a full disk names this file
        self.rows.append(row)
        self._index[_key(row)] = row


def _key(row: dict[str, Any]) -> tuple[str, int, str]:
    return row["sample"], row["turn"], row["method"]


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{digits}f}"


def table_rows(results: dict[str, Any], run_label: str = "", key: str = "cells") -> list[dict[str, Any]]:
    """Flat rows (category or dataset, method, figures) of one results dict (`key` "cells" or "datasets")."""
    group = "category" if key == "cells" else "dataset"
    out = []
    for cat, per in (results.get(key) or {}).items():
        for m, f in per.items():
            out.append({"run": run_label, group: cat, "method": m, **{k: v for k, v in f.items()
                                                                       if k != "tau_histogram"}})
    return out


def _x(v: Any) -> str:
    return f"{_fmt(v)}×"


def _gain(g: dict[str, Any], key: str) -> str:
    """A gain cell: `+x%`, with its paired interval where the results carry one."""
    if key not in g:
        return "—"
    ci = g.get(f"{key}_ci")
    pinned = " pinned" if key == f"vs_{g.get('pinned')}" else ""  # that drafter itself: the bench's noise
    return (f"{g[key]:+.1f}%" + (f" ({ci[0]:+.1f} to {ci[1]:+.1f})" if ci and not math.isnan(ci[0]) else "")
            + pinned)


def _share(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.1f}%"


def _signed(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:+.1f}%"


def markdown_table(results: dict[str, Any], run_label: str = "") -> str:
    """Per category and method: speedup (upstream's, with its 95% interval) and tau first, then the per-sample
    mean and median ratios, the pooled ratio, tokens/s and routing figures; then per dataset (several
    datasets), the best setting of swept families, and the gains."""
    head = ("| category | method | speedup (95% CI) | tau | tau pooled | mean ratio | median ratio | pooled | tok/s | "
            "slot-0 | switch | catch-up | vs alone | mismatches |")
    lines = [head, "|" + "---|" * 14]
    for r in table_rows(results, run_label):
        lines.append(f"| {r['category']} | {r['method']} | {_x(r['speedup'])} ({_fmt(r['speedup_ci_low'])}–"
                     f"{_fmt(r['speedup_ci_high'])}) | {_fmt(r['tau'])} | {_fmt(r.get('tau_pooled'))} | "
                     f"{_x(r.get('speedup_mean_ratio'))} | "
                     f"{_x(r.get('speedup_median_ratio'))} | {_x(r['speedup_pooled'])} | "
                     f"{_fmt(r['tokens_per_second'], 1)} | {_share(r['slot0_share'])} | {_share(r['switch_rate'])} | "
                     f"{_share(r['catchup_share'])} | {_signed(r.get('round_cost_vs_alone'))} | {r['mismatches']} |")
    text = "\n".join(lines)
    datasets = [d for d in (results.get("datasets") or {}) if d != "all"]
    if len(datasets) > 1:
        text += ("\n\nPer dataset:\n\n| dataset | method | speedup (95% CI) | tau | median ratio |"
                 "\n|---|---|---|---|---|")
        for r in table_rows(results, run_label, "datasets"):
            text += (f"\n| {r['dataset']} | {r['method']} | {_x(r['speedup'])} ({_fmt(r['speedup_ci_low'])}–"
                     f"{_fmt(r['speedup_ci_high'])}) | {_fmt(r['tau'])} | {_x(r.get('speedup_median_ratio'))} |")
    best = [(level, fam, group, b) for level in ("categories", "datasets")
            for fam, per in ((results.get("best") or {}).get(level) or {}).items() for group, b in per.items()
            if level == "categories" or (len(datasets) > 1 and group != "all")]
    if best:
        text += ("\n\nBest setting per group (highest speedup):\n\n| family | group | best | speedup | tau | of |"
                 "\n|---|---|---|---|---|---|")
        for _, fam, group, b in best:
            text += (f"\n| {fam} | {group} | {b['method']} | {_x(b['speedup'])} | {_fmt(b['tau'])} | "
                     f"{', '.join(b['of'])} |")
    if results.get("gains"):
        text += "\n\n| method | category | " + " | ".join(["vs EAGLE-3", "vs DFlash", "vs DDTree"]) + " |\n|---|---|---|---|---|"
        for m, per in results["gains"].items():
            for cat, g in per.items():
                cells = [_gain(g, k) for k in ("vs_eagle3", "vs_dflash", "vs_ddtree")]
                text += f"\n| {m} | {cat} | " + " | ".join(cells) + " |"
    if results.get("decisions"):
        text += (f"\n\nDecisions on shared states ({results['decisions_definition']}):\n\n"
                 + decisions_markdown(results["decisions"]))
    text += f"\n\nSpeedup columns: {results.get('speedup_definition', SPEEDUP_DEFINITION)}.\n"
    text += (f"τ: {results['tau_definition']}; tau pooled = every round's tau averaged (tokens per round), "
             "which a few sequences of very long acceptances do not carry.\n")
    if any("_ci" in k for per in (results.get("gains") or {}).values() for g in per.values() for k in g):
        text += ("Gains: the method's speedup / the baseline's - 1, with a paired bootstrap 95% interval (the samples "
                 "both decoded, resampled with their two TPOTs together).\n")
    if any("pinned" in g for per in (results.get("gains") or {}).values() for g in per.values()):
        text += ("Pinned: in that category every decode of the routed method was that drafter itself (an infinite "
                 "threshold: no decision, no pair), so the gain is one decoder timed twice, the bench's own noise.\n")
    if results.get("routed_round_definition") and any(
            r.get("round_cost_vs_alone") is not None for r in table_rows(results, run_label)):
        text += f"Routed rounds: {results['routed_round_definition']}.\n"
    if results.get("catchup_note"):
        text += f"Catch-up: {results['catchup_note']}.\n"
    if results.get("lossless_check"):
        text += f"Lossless check: {results['lossless_check']}; {len(results.get('mismatches') or [])} mismatches.\n"
    outliers = results.get("timing_outliers") or []
    if outliers:
        text += (f"Timing outliers ({len(outliers)}; a decode's ms a round > {OUTLIER_FACTOR:g}x its method's median: "
                 "something paid once inside the timing): " + "; ".join(
                     f"{o['method']} on {o['sample']} (turn {o['turn']}) {o['ms_per_round']} ms a round against "
                     f"{o['median_ms_per_round']}, +{o['excess_ms']} ms ({one_off_text(o)})" for o in outliers[:5])
                 + ("; ..." if len(outliers) > 5 else "") + ".\n")
    if results.get("protocol"):
        text += f"\nProtocol: {results['protocol']}\n"
    return text


def csv_text(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    if rows:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        w = csv.DictWriter(buf, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    return buf.getvalue()


def latex_table(rows: list[dict[str, Any]], tau_definition: str, speedup_definition: str = SPEEDUP_DEFINITION) -> str:
    """A booktabs table per (run,) category and method: speedup and tau (upstream's two columns), then the
    per-sample mean and median ratios."""
    lines = [r"\begin{tabular}{lllrrrr}", r"\toprule",
             r"run & category & method & speedup & $\tau$ & mean ratio & median ratio \\", r"\midrule"]
    esc = lambda s: str(s).replace("_", r"\_").replace("%", r"\%")  # noqa: E731
    for r in rows:
        lines.append(f"{esc(r.get('run', ''))} & {esc(r['category'])} & {esc(r['method'])} & "
                     f"{_fmt(r['speedup'])}$\\times$ & {_fmt(r['tau'])} & "
                     f"{_fmt(r.get('speedup_mean_ratio'))}$\\times$ & {_fmt(r.get('speedup_median_ratio'))}$\\times$ \\\\")
    lines += [r"\bottomrule", r"\end{tabular}", f"% speedup: {speedup_definition}", f"% tau: {tau_definition}"]
    return "\n".join(lines) + "\n"


def write_save_path(path: str | Path, results: dict[str, Any], rows: list[dict[str, Any]],
                    args: dict[str, Any]) -> Path:
    """`--save-path`: the run's data in one JSON file (results, every sample's row, the flags), where upstream
    writes its `torch.save` run data; JSON whatever the suffix, since this toolkit never pickles."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"kind": EVAL, "results": results, "rows": rows, "args": args},
                                       default=str))
    log.info("run data written to %s (JSON)", path)
    return path


def write_results(run: Path, results: dict[str, Any]) -> None:
    """results.json, results.csv (+ results_datasets.csv with several datasets) and results.md in `run`."""
    atomic_write_text(run / "results.json", json.dumps(results, indent=2, default=str))
    atomic_write_text(run / "results.csv", csv_text(table_rows(results)))
    if len(results.get("datasets") or {}) > 2:  # several datasets besides "all": their own cells too
        atomic_write_text(run / "results_datasets.csv", csv_text(table_rows(results, key="datasets")))
    atomic_write_text(run / "results.md", markdown_table(results))
