"""whiflash-eval: end-to-end evaluation of speculative decoding methods against autoregressive decoding.

Subcommands:
  bench      run methods side by side on the same prompts, with the AR baseline, lossless check, tables and plots
  sweep      datasets x methods x DDTree budgets x router thresholds in one resumable run, with per-category tables
  report     rebuild tables (Markdown, CSV, LaTeX) and plots from one or more run folders
  calibrate  sweep a routing threshold per category on held-out prompts (or replay datagen rows) -> thresholds.json
  profile    time the loaded models' components on this device -> a latency profile JSON and a table
"""
from __future__ import annotations

import logging
import sys
from dataclasses import fields
from typing import Any

from jsonargparse import ActionConfigFile, ActionYesNo, ArgumentParser, Namespace

from whiflash import distributed
from whiflash.engine import ENGINE_FIELDS, engine_defaults
from whiflash.errors import UsageError, run_cli

from .calibrate import DEFAULT_THRESHOLDS
from .checks import parse_thresholds
from .config import BenchConfig, ProfileConfig, SweepConfig, flag

__all__ = ["build_parser", "console", "main", "parse"]

_TYPES = {"str": str, "int": int, "float": float, "str | None": str | None, "int | None": int | None,
          "float | None": float | None}


def _add_flags(parser: ArgumentParser, config: type) -> None:
    """One dashed flag per field of the dataclass `config`, its `help` metadata as help text."""
    for f in fields(config):
        help_text = f.metadata.get("help", "")
        if f.type in (bool, "bool"):
            parser.add_argument(flag(f.name), action="store_true", default=f.default, help=help_text)
        elif f.type in (bool | None, "bool | None"):  # unset = the engine's default: --flag / --no-flag
            parser.add_argument(flag(f.name), action=ActionYesNo(no_prefix="no-"), default=f.default, help=help_text)
        else:
            parser.add_argument(flag(f.name), type=_TYPES[str(f.type)], default=f.default, help=help_text)


def _flags_parser(description: str, config: type) -> ArgumentParser:
    """A subcommand parser taking `--config FILE` and one flag per field of the dataclass `config`."""
    parser = ArgumentParser(description=description)
    parser.add_argument("--config", action=ActionConfigFile, help="YAML/JSON file of these flags")
    _add_flags(parser, config)
    return parser


def build_parser() -> ArgumentParser:
    """The whiflash-eval parser (subcommands bench, report, calibrate, profile; each takes --config)."""
    parser = ArgumentParser(prog="whiflash-eval", description=__doc__)
    sub = parser.add_subcommands(dest="command")

    bench = _flags_parser("Benchmark methods against AR on the same prompts (upstream flags).", BenchConfig)
    sub.add_subcommand("bench", bench, help="run methods side by side against the AR baseline")

    sweep = _flags_parser("Every --dataset source x every method x every DDTree budget (--tree-budget) and router "
                          "threshold (--entropy-thresholds, --neural-thresholds) in one run folder, resumable sample "
                          "by sample, with per-category and per-dataset tables, the best setting per group and "
                          "plots.", SweepConfig)
    sub.add_subcommand("sweep", sweep, help="datasets x methods x budgets/thresholds in one resumable run")

    report = ArgumentParser(description="Rebuild tables and plots from run folders, side by side.")
    report.add_argument("--config", action=ActionConfigFile)
    report.add_argument("runs", nargs="+", type=str, help="run folders (each with results.json)")
    report.add_argument("--out", type=str | None, default=None,
                        help="folder for report.md/.csv/.tex and plots (default: runs/eval/report_<timestamp>)")
    report.add_argument("--replay", type=str | None, default=None,
                        help="a whiflash-datagen dataset folder: with --latency-profile, add every routed method's "
                             "share of the speed oracle's gain over the better standalone drafter")
    report.add_argument("--latency-profile", type=str | None, default=None,
                        help="with --replay: the profile JSON of `whiflash-eval profile` for these models and device")
    sub.add_subcommand("report", report, help="tables and plots from finished runs")

    cal = _flags_parser("Per category, sweep a routing threshold end to end on prompts disjoint from the benchmark "
                        "subset and keep the fastest.", BenchConfig)
    cal.add_argument("--calibrate-method", type=str, default="whiflash-entropy",
                     help="whiflash-entropy or whiflash-neural: the routed method whose threshold is swept")
    cal.add_argument("--thresholds", type=str, default=",".join(map(str, DEFAULT_THRESHOLDS)),
                     help="comma-separated threshold values to try")
    cal.add_argument("--thresholds-around", type=str | None, default=None,
                     help="a thresholds.json (e.g. the replay's): each category decodes only its threshold there plus "
                          "each of --around-steps, and both drafters alone (-inf, inf); --thresholds then serves the "
                          "categories the file has none for")
    cal.add_argument("--around-steps", type=str, default="-0.5,0,0.5",
                     help="with --thresholds-around: the offsets tried around each category's threshold")
    cal.add_argument("--exclude-run", type=str | None, default=None,
                     help="a bench run folder whose sample ids are excluded (disjoint from the benchmark subset)")
    cal.add_argument("--output", type=str | None, default=None,
                     help="where to write thresholds.json (default: inside the calibration run folder)")
    cal.add_argument("--replay", type=str | None, default=None,
                     help="fast mode: a whiflash-datagen dataset folder; estimate tokens/s per threshold from its "
                          "rounds and --latency-profile instead of decoding")
    cal.add_argument("--latency-profile", type=str | None, default=None,
                     help="with --replay: the profile JSON of `whiflash-eval profile` for these models and device")
    cal.add_argument("--min-gain", type=float, default=0.0,
                     help="a category keeps a routing threshold only where it is at least this share faster than "
                          "the faster drafter alone among the swept values (0.02: 2 percent), else it pins that "
                          "drafter: a gain too small to survive other prompts is not worth a decision every round")
    cal.add_argument("--min-gain-confidence", type=float, default=0.0,
                     help="0 (off) or a probability, e.g. 0.9: a category also keeps a routing threshold only where "
                          "its calibration prompts show it faster than that drafter with this probability (a paired "
                          "bootstrap over the prompts, the 1 - p quantile of the gain above 0)")
    cal.add_argument("--replay-run", type=str | None, default=None,
                     help="with --replay: a bench run folder; replay only the rows of its prompts, for estimates on "
                          "exactly the prompts it measured")
    sub.add_subcommand("calibrate", cal, help="sweep routing thresholds per category; write thresholds.json")

    prof = _flags_parser("Time AR step, chain and tree verify, drafter rounds, catch-up per backlog length and "
                         "routers on this device; write a latency profile JSON.", ProfileConfig)
    sub.add_subcommand("profile", prof, help="latency profile of the loaded models (JSON + table)")
    subparsers = {"bench": bench, "sweep": sweep, "report": report, "calibrate": cal, "profile": prof}
    parser.subparsers = subparsers  # type: ignore[attr-defined]
    return parser


def parse(argv: list[str]) -> tuple[Namespace, ArgumentParser]:
    """Parse `argv` twice: the first pass finds the defaults that depend on other flags (a `--preset NAME`'s
    checkpoints and thresholds; the engine of the device, `whiflash.engine`), which become the
    subcommand's defaults for the second, so explicit flags and --config files override them and
    `--print_config` prints what will run."""
    parser = build_parser()
    # --print_config would print and exit before the defaults are applied: leave it to the second pass
    first = [a for a in argv if not a.startswith("--print_config")]
    ns = parser.parse_args(first)
    args = ns[ns.command]
    sub = parser.subparsers[ns.command]  # type: ignore[attr-defined]
    values: dict[str, Any] = {}
    if getattr(args, "preset", None):
        from .presets import bench_defaults

        values.update(bench_defaults(args.preset, algorithm=getattr(args, "speculative_algorithm", "WHIFLASH"),
                                     pair=getattr(args, "whiflash_drafters", "df-e3"),
                                     tree_budget=getattr(args, "ddtree_tree_budget", None)))
    if all(hasattr(args, f) for f in ENGINE_FIELDS):
        values.update(engine_defaults(*(getattr(args, f) for f in ENGINE_FIELDS)))
    if values:
        names = {a.dest for a in sub._actions}
        sub.set_defaults(**{k: v for k, v in values.items() if k in names})
    if values or len(first) != len(argv):
        ns = parser.parse_args(argv)
    return ns, parser


def bench_config(ns: Namespace, config: type = BenchConfig) -> Any:
    """The BenchConfig (or `config`, e.g. SweepConfig) of a parsed bench/calibrate/sweep namespace."""
    names = {f.name for f in fields(config)}
    return config(**{k: v for k, v in vars(ns).items() if k in names})


def console(argv: list[str] | None = None) -> None:
    """The `whiflash-eval` command (and `python -m whiflash.eval`): :func:`main`, ending with exit status 2 (bad
    usage or input) or 1 (a failure while running) and a one-line `error:` message; `--debug` or
    `WHIFLASH_DEBUG=1` adds the traceback."""
    run_cli("whiflash-eval", main, argv)


def main(argv: list[str] | None = None) -> int:
    """Run `whiflash-eval` in-process (errors are raised to the caller) and return the exit status; the
    console script is :func:`console`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s",
                        datefmt="%H:%M:%S")
    for name in ("whiflash.runtime", "whiflash.drafters"):
        logging.getLogger(name).setLevel(logging.WARNING)
    ns, parser = parse(argv)
    cmd = ns.command
    if cmd not in ("bench", "sweep") and distributed.from_env().world > 1:  # one run folder, one process
        parser.error(f"whiflash-eval {cmd} runs in one process: start it without torchrun (bench and sweep are the "
                     "commands that shard over ranks)")
    args: Any = ns[cmd]
    if cmd in ("bench", "sweep"):
        from .bench import run_bench
        from .summary import summary_text
        from .sweep import run_sweep

        dump = parser.subparsers[cmd].dump(args, skip_none=False)
        if cmd == "bench":
            result = run_bench(bench_config(args), ["whiflash-eval", *argv], config_dump=dump)
        else:
            result = run_sweep(bench_config(args, SweepConfig), ["whiflash-eval", *argv], config_dump=dump)
        if result.results:  # rank 0 (the only one holding them under torchrun)
            print(summary_text(result.results, str(result.run_dir)))
        return result.exit_code
    if cmd == "report":
        from .report import report

        report(args.runs, args.out, args.replay, args.latency_profile)
        return 0
    if cmd == "calibrate":
        from .calibrate import calibrate, calibrate_replay

        values = parse_thresholds(args.thresholds)
        if args.replay_run and not args.replay:
            raise UsageError("calibrate: --replay-run RUN goes with --replay DATAGEN_DIR (it picks the rows to replay)")
        if args.replay and args.thresholds_around:
            raise UsageError("calibrate: --thresholds-around decodes around a replayed pick; it does not go with "
                             "--replay (which decodes nothing)")
        if args.replay:
            calibrate_replay(bench_config(args), args.replay, args.latency_profile, method=args.calibrate_method,
                             values=values, output=args.output, replay_run=args.replay_run, min_gain=args.min_gain,
                             confidence=args.min_gain_confidence)
        else:
            calibrate(bench_config(args), method=args.calibrate_method, values=values,
                      exclude_run=args.exclude_run, output=args.output, around=args.thresholds_around,
                      around_steps=tuple(parse_thresholds(args.around_steps, "--around-steps")), min_gain=args.min_gain,
                      confidence=args.min_gain_confidence)
        return 0
    if cmd == "profile":
        from .profile import run_profile

        names = {f.name for f in fields(ProfileConfig)}
        _, prof = run_profile(ProfileConfig(**{k: v for k, v in vars(args).items() if k in names}),
                              ["whiflash-eval", *argv])
        print(prof.table())
        return 0
    parser.error(f"unknown command {cmd!r}")
    return 2


if __name__ == "__main__":
    console()
