"""`whiflash-eval calibrate`: per category, pick the fastest routing threshold end to end (or, with
`--replay`, estimated from datagen rows and a latency profile: `whiflash.eval.replay`).

On prompts disjoint from the benchmark subset (the samples a bench run with the same flags would
use are excluded, and so are the ids of `--exclude-run`), every threshold value is run as its own
routed method next to AR, exactly like `bench` (same protocol, same run-folder layout, one
`samples.jsonl`). Per category the threshold with the highest mean speedup over AR wins; the
thresholds go to `thresholds.json`, which `bench --whiflash-thresholds FILE` applies per sample
category.

With `--thresholds-around FILE` (a thresholds.json, e.g. the replay's) each category decodes only its own
candidates, its threshold in FILE plus each of `--around-steps`, and both drafters alone (-inf, inf), instead
of every category's candidates on every category: checking a replayed pick by decoding then costs less than
half of what the union of the grids would.
"""
from __future__ import annotations

import logging
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from whiflash.calibration import check_confidence, check_min_gain, pick_threshold
from whiflash.engine import describe, resolve_engine
from whiflash.errors import UsageError
from whiflash.flags import check_int
from whiflash.folders import check_folder
from whiflash.inputs import samples_sha256
from whiflash.io import atomic_write_json, checkpoint_stamp
from whiflash.locks import owning_folders

from .checks import check_bench_config, tau_rule
from .config import BenchConfig
from .datasets import load_samples
from .metrics import aggregate, decode_tokens, summarize_rows
from .outputs import check_output_file, prepare_run_dir, run_sample_ids, write_manifest, write_results
from .selection import balanced

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_THRESHOLDS", "around_grid", "calibrate", "calibrate_replay", "pick_thresholds"]

DEFAULT_THRESHOLDS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
"""Threshold values swept when `--thresholds` is not given."""


def pick_thresholds(rows: list[dict[str, Any]], min_gain: float = 0.0,
                    confidence: float = 0.0) -> dict[str, dict[str, Any]]:
    """Per category: every swept threshold's mean speedup and the fastest one (ties: the smaller threshold; a
    finite one only where it beats a drafter alone by `min_gain` and, with `confidence`, where the prompts both
    decoded show a gain with that probability: `pick_threshold`)."""
    out: dict[str, dict[str, Any]] = {}
    for cat in sorted({r["category"] for r in rows}):
        sweep, tpot = {}, {}
        for thr in sorted({r["threshold"] for r in rows if r["category"] == cat and r["method"] != "ar"}):
            sel = [r for r in rows if r["category"] == cat and r["method"] != "ar" and r["threshold"] == thr]
            sweep[thr] = summarize_rows(sel)["speedup"]
            tpot[thr] = {(r["sample"], r.get("turn", 0)): r["decode_seconds"] / decode_tokens(r["new_tokens"])
                         for r in sel}
        best, bounds = pick_threshold(sweep, min_gain, confidence, tpot)
        if best is not None:
            out[cat] = {"threshold": best, "speedup": sweep[best], "sweep": {str(t): s for t, s in sweep.items()},
                        **({"gain_lower_bound": bounds} if bounds else {})}
    return out


def read_around(path: str, method: str) -> dict[str, Any]:
    """`--thresholds-around`'s thresholds.json, which must be `method`'s."""
    from .bench import read_thresholds

    files = read_thresholds(path, "--thresholds-around")
    if method not in files:
        raise UsageError(f"--thresholds-around {path}: its method is {', '.join(files)}; expected {method} "
                         "(the --calibrate-method whose thresholds are decoded)")
    return files[method]


def around_grid(calibrated: dict[str, Any], categories: list[str], steps: list[float],
                fallback: list[float]) -> dict[str, list[float]]:
    """Per category, the thresholds to decode: its threshold `T` in the thresholds.json `calibrated` (the
    file's own category, the testbed category a benchmark one stands for, else its default) plus each of
    `steps`, and -inf and inf (each drafter alone, the baselines a threshold must beat). An infinite `T` gives
    only the two drafters; a category the file has no threshold for takes `fallback`."""
    from .bench import threshold_for

    grid = {}
    for cat in categories:
        t = threshold_for(calibrated, cat)
        if t is None:
            grid[cat] = sorted(set(fallback))
            continue
        near = [round(t + d, 6) for d in steps] if math.isfinite(t) else []
        grid[cat] = sorted({-math.inf, *near, math.inf})
    return grid


@owning_folders()  # the run folder's lock ends with the call
def calibrate(cfg: BenchConfig, method: str = "whiflash-entropy", values: list[float] | None = None,
              exclude_run: str | None = None, output: str | None = None, around: str | None = None,
              around_steps: tuple[float, ...] = (-0.5, 0.0, 0.5), min_gain: float = 0.0,
              confidence: float = 0.0) -> Path:
    """Sweep `values` for `method` per category (or, with `around`, each category's own grid:
    `around_grid`) and write thresholds.json; returns its path. `min_gain`, `confidence`: `pick_thresholds`'s."""
    from .bench import Runner, run_samples

    check_bench_config(cfg, methods=False)
    if method not in ("whiflash-entropy", "whiflash-neural"):
        raise ValueError(f"--calibrate-method: expected whiflash-entropy or whiflash-neural, got {method!r}")
    values = values or list(DEFAULT_THRESHOLDS)
    check_min_gain(min_gain)  # before anything decodes
    check_confidence(confidence)
    check_output_file(output)
    centres = read_around(around, method) if around else None
    cfg = resolve_engine(cfg)
    testbed = Path(cfg.testbed) if cfg.testbed else None
    bench_ids = {s.id for s in load_samples(cfg.dataset, testbed=testbed, max_samples=cfg.max_samples, seed=cfg.seed)}
    if exclude_run:
        bench_ids |= set(run_sample_ids(exclude_run, "--exclude-run"))
    pool = [s for s in load_samples(cfg.dataset, testbed=testbed, max_samples=None, seed=cfg.seed + 1)
            if s.id not in bench_ids]
    samples = balanced(pool, cfg.max_samples, cfg.seed + 1)
    if not samples:
        raise ValueError(f"--dataset {cfg.dataset}: no prompts left outside the benchmark subset; raise the pool "
                         "or lower --max-samples")
    categories = sorted({s.category for s in samples})
    grid = around_grid(centres, categories, list(around_steps), values) if centres else \
        {c: sorted(set(values)) for c in categories}
    values = sorted({v for vs in grid.values() for v in vs})
    cfg = replace(cfg, methods="ar", name=cfg.name or f"calibrate-{method}")
    runner = Runner(cfg)
    config = {**cfg.__dict__, "calibrate_method": method, "values": values, "exclude": sorted(bench_ids),
              "inputs": samples_sha256(samples), "grid": {c: [str(v) for v in vs] for c, vs in grid.items()},
              # a router (or drafter) retrained at the same path starts a new run, as in bench, instead of
              # finishing the old one's rows (a DAgger round recalibrates its refitted router in place)
              "checkpoint_files": {k: checkpoint_stamp(v) for k, v in
                                   {**runner.paths, "neural_router": cfg.whiflash_neural_router_path}.items()}}
    run, _ = prepare_run_dir(cfg.out, cfg.run_name(), config)
    write_manifest(run, argv=sys.argv, seed=cfg.seed, device=cfg.device, models=runner.paths, samples=samples,
                   extra={"calibrate_method": method, "values": values,
                          "engine": describe(cfg.device, cfg.dtype, runner.target.engine)}, command="calibrate")
    for v in values:
        m = runner.factory.build(method, v)
        m.name = f"{method}@{v:g}"
        runner.add_method(m)
    runner.only = {c: ["ar", *(f"{method}@{v:g}" for v in vs)] for c, vs in grid.items()}
    runner.prepare(samples)
    rows = run_samples(runner, samples, run, "calibrate samples")
    write_results(run, aggregate(rows, runner.names, seed=cfg.seed, iterations=cfg.bootstrap))
    picked = pick_thresholds(rows, min_gain, confidence)
    result = {"method": method, "thresholds": {c: p["threshold"] for c, p in picked.items()}, "min_gain": min_gain,
              "min_gain_confidence": confidence, "details": picked,
              "grid": {c: [str(v) for v in vs] for c, vs in grid.items()}, "around": around,
              "samples": [s.id for s in samples], "excluded_benchmark_ids": sorted(bench_ids),
              "dataset": cfg.dataset, "pair": cfg.whiflash_drafters, "device": cfg.device, "dtype": cfg.dtype,
              "run": str(run)}
    rows_all = [{**r, "category": "all"} for r in rows]
    overall = pick_thresholds(rows_all, min_gain, confidence).get("all")
    result["default"] = overall["threshold"] if overall else None
    path = _write(result, run, output)
    log.info("thresholds per category %s written to %s", result["thresholds"], path)
    return path


def _write(result: dict[str, Any], run: Path, output: str | None) -> Path:
    """thresholds.json at `--output`, else in the run folder."""
    path = Path(output) if output else run / "thresholds.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, result)
    return path


@owning_folders()
def calibrate_replay(cfg: BenchConfig, data: str, latency_profile: str | None, method: str = "whiflash-entropy",
                     values: list[float] | None = None, output: str | None = None,
                     replay_run: str | None = None, min_gain: float = 0.0, confidence: float = 0.0) -> Path:
    """Replay `values` for `method` over the router dataset `data` with the latency profile and write
    thresholds.json (the end-to-end format, plus the estimates); returns its path. Decodes nothing.
    `replay_run`: a bench run folder; only its prompts' rows are replayed (the estimate on exactly the
    prompts it measured, to set beside its figures). `min_gain`, `confidence`: `replay_thresholds`'s."""
    from .replay import replay_thresholds

    if not latency_profile:
        raise ValueError("--replay needs --latency-profile FILE (from `whiflash-eval profile` on this device)")
    values = values or list(DEFAULT_THRESHOLDS)
    check_min_gain(min_gain)
    check_confidence(confidence)
    check_int(cfg.whiflash_stick_tau, "--whiflash-stick-tau", optional=True)
    rule = tau_rule(cfg)
    check_folder(Path(cfg.out), None, "--out")
    check_output_file(output)
    samples = run_sample_ids(replay_run, "--replay-run") if replay_run else None
    result = replay_thresholds(data, latency_profile, method, values, cfg.whiflash_neural_router_path,
                               lazy=not cfg.whiflash_no_lazy_catchup, stick_tau=cfg.whiflash_stick_tau, samples=samples,
                               tau_rule=rule, min_gain=min_gain, confidence=confidence)
    config = {"calibrate_method": method, "values": values, "min_gain": min_gain, "min_gain_confidence": confidence,
              "replay": str(data),
              "replay_run": replay_run, "latency_profile": latency_profile,
              "neural_router": cfg.whiflash_neural_router_path, "lazy_catchup": not cfg.whiflash_no_lazy_catchup,
              "stick_tau": cfg.whiflash_stick_tau, "tau_rule": cfg.whiflash_tau_rule}
    run, _ = prepare_run_dir(cfg.out, cfg.name or f"calibrate-replay-{method}", config, resume=False)
    write_manifest(run, argv=sys.argv, seed=cfg.seed, device="cpu", models={"data": str(data)}, samples=[],
                   extra={"calibrate_method": method, "values": values, "latency_profile": latency_profile,
                          "neural_router": cfg.whiflash_neural_router_path}, command="calibrate --replay")
    result["run"] = str(run)
    path = _write(result, run, output)
    if result["excluded_training_prompts"]:
        log.info("left out the rows of %d prompts the router was trained on; replayed %d prompts",
                 result["excluded_training_prompts"], len(result["samples"]))
    log.info("replayed thresholds per category %s (estimated speedup %s, share of the speed oracle's gain over the "
             "better standalone drafter %s) written to %s", result["thresholds"],
             {c: round(d["speedup"], 3) for c, d in result["details"].items()},
             {c: None if d["share_of_speed_oracle_gain"] is None else round(d["share_of_speed_oracle_gain"], 3)
              for c, d in result["details"].items()}, path)
    bounds = {c: {t: round(g, 4) for t, g in d["gain_lower_bound"].items()}
              for c, d in result["details"].items() if "gain_lower_bound" in d}
    if bounds:
        log.info("gain over the drafter alone that the prompts show with probability %g, per category's fastest "
                 "finite threshold (kept where > 0): %s", confidence, bounds)
    return path
