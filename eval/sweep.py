"""`whiflash-eval sweep`: every dataset x method x DDTree budget x router threshold in one resumable run.

What upstream spreads over shell loops (a benchmark run per dataset and method, `benchmark.sh`; a
run per threshold, `calibrate_thresholds.sh`) is one bench run here: the `--dataset` sources are
benched together (each with its own `--max-samples` selection), standalone DDTree runs at every
`--tree-budget`, and each routed method at every threshold of `--entropy-thresholds` /
`--neural-thresholds` (as `whiflash-entropy@T`). AR decodes each prompt once for all of them, in
the same process, so every speedup is paired. The run folder is a bench folder: `samples.jsonl` is
appended row by row, so a killed sweep rerun with the same flags continues where it stopped, and
`results.md` holds the per-category and per-dataset tables and the best budget and threshold per
category and dataset (`whiflash.eval.families`), `plots/` the speedup bars and `sweep.png`.
"""
from __future__ import annotations

from dataclasses import fields, replace

from .bench import BenchResult, run_bench
from .config import BenchConfig, SweepConfig
from .families import parse_values, threshold_method
from .methods import method_names

__all__ = ["DEFAULT_METHODS", "run_sweep", "sweep_methods"]

DEFAULT_METHODS = ("eagle3", "dflash", "ddtree", "whiflash-entropy")
"""What a sweep runs besides AR when `--methods` is not given (plus whiflash-neural with a router path)."""


def sweep_methods(cfg: SweepConfig) -> str:
    """The `--methods` list of the sweep's bench run: `--methods` (default `DEFAULT_METHODS`, and
    whiflash-neural when a router is given) with each routed method replaced by one method per threshold of its
    list; a list whose method is missing adds it. DDTree budgets are expanded by bench (`--tree-budget`)."""
    given = cfg.methods or ",".join([*DEFAULT_METHODS, *(["whiflash-neural"] if cfg.whiflash_neural_router_path
                                                         else [])])
    names = method_names(cfg.speculative_algorithm, given, cfg.whiflash_router)
    sweeps = {"whiflash-entropy": parse_values(cfg.entropy_thresholds, "--entropy-thresholds"),
              "whiflash-neural": parse_values(cfg.neural_thresholds, "--neural-thresholds")}
    if sweeps["whiflash-neural"] and not cfg.whiflash_neural_router_path:
        raise ValueError("--neural-thresholds needs --whiflash-neural-router-path (Hub id, folder or .safetensors)")
    out: list[str] = []
    for name in [*names, *(m for m, values in sweeps.items() if values and m not in names)]:
        out += [threshold_method(name, v) for v in sweeps[name]] if sweeps.get(name) else [name]
    return ",".join(out)


def run_sweep(cfg: SweepConfig, argv: list[str] | None = None, config_dump: str | None = None) -> BenchResult:
    """Run the sweep `cfg` describes as one bench run (resuming the folder of the same flags) and return it."""
    names = {f.name for f in fields(BenchConfig)}
    bench = BenchConfig(**{k: v for k, v in vars(cfg).items() if k in names})
    stem = "+".join(s.strip().split("@")[0].replace(":", "-").rsplit("/", 1)[-1].removesuffix(".jsonl")
                    for s in cfg.dataset.split(",") if s.strip())
    bench = replace(bench, methods=sweep_methods(cfg), name=cfg.name or f"sweep_{stem}"[:80])
    return run_bench(bench, argv, config_dump)
