"""whiflash-eval: end-to-end evaluation of speculative decoding methods against autoregressive decoding.

Subcommands:
  bench      run methods side by side on the same prompts, with the AR baseline, lossless check, tables and plots
  report     rebuild tables (Markdown, CSV, LaTeX) and plots from one or more run folders
  calibrate  sweep a routing threshold per category on held-out prompts and write thresholds.json
"""
from __future__ import annotations

import logging
import sys
from dataclasses import fields
from typing import Any

from jsonargparse import ActionConfigFile, ArgumentParser, Namespace

from whiflash import distributed

from .config import BenchConfig, flag

__all__ = ["build_parser", "main", "parse"]


def _add_bench_flags(parser: ArgumentParser) -> None:
    for f in fields(BenchConfig):
        help_text = f.metadata.get("help", "")
        if f.type in (bool, "bool"):
            parser.add_argument(flag(f.name), action="store_true", default=f.default, help=help_text)
        else:
            typ = {"str": str, "int": int, "float": float, "str | None": str | None, "int | None": int | None,
                   "float | None": float | None}[str(f.type)]
            parser.add_argument(flag(f.name), type=typ, default=f.default, help=help_text)


def build_parser() -> ArgumentParser:
    """The whiflash-eval parser (subcommands bench, report, calibrate; each takes --config)."""
    parser = ArgumentParser(prog="whiflash-eval", description=__doc__)
    sub = parser.add_subcommands(dest="command")

    bench = ArgumentParser(description="Benchmark methods against AR on the same prompts (upstream flags).")
    bench.add_argument("--config", action=ActionConfigFile, help="YAML/JSON file of these flags")
    _add_bench_flags(bench)
    sub.add_subcommand("bench", bench, help="run methods side by side against the AR baseline")

    report = ArgumentParser(description="Rebuild tables and plots from run folders, side by side.")
    report.add_argument("--config", action=ActionConfigFile)
    report.add_argument("runs", nargs="+", type=str, help="run folders (each with results.json)")
    report.add_argument("--out", type=str | None, default=None,
                        help="folder for report.md/.csv/.tex and plots (default: runs/eval/report_<timestamp>)")
    sub.add_subcommand("report", report, help="tables and plots from finished runs")

    cal = ArgumentParser(description="Per category, sweep a routing threshold end to end on prompts disjoint "
                                     "from the benchmark subset and keep the fastest.")
    cal.add_argument("--config", action=ActionConfigFile)
    _add_bench_flags(cal)
    cal.add_argument("--calibrate-method", type=str, default="whiflash-entropy",
                     help="whiflash-entropy or whiflash-neural: the routed method whose threshold is swept")
    cal.add_argument("--thresholds", type=str, default="0.05,0.1,0.2,0.4,0.8,1.6",
                     help="comma-separated threshold values to try")
    cal.add_argument("--exclude-run", type=str | None, default=None,
                     help="a bench run folder whose sample ids are excluded (disjoint from the benchmark subset)")
    cal.add_argument("--output", type=str | None, default=None,
                     help="where to write thresholds.json (default: inside the calibration run folder)")
    sub.add_subcommand("calibrate", cal, help="sweep routing thresholds per category; write thresholds.json")
    parser.subparsers = {"bench": bench, "report": report, "calibrate": cal}  # type: ignore[attr-defined]
    return parser


def parse(argv: list[str]) -> tuple[Namespace, ArgumentParser]:
    parser = build_parser()
    return parser.parse_args(argv), parser


def bench_config(ns: Namespace) -> BenchConfig:
    """The BenchConfig of a parsed bench/calibrate namespace."""
    names = {f.name for f in fields(BenchConfig)}
    return BenchConfig(**{k: v for k, v in vars(ns).items() if k in names})


def main(argv: list[str] | None = None) -> int:
    """Entry point of `whiflash-eval` and `python -m whiflash.eval`; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s",
                        datefmt="%H:%M:%S")
    for name in ("whiflash.runtime", "whiflash.drafters"):
        logging.getLogger(name).setLevel(logging.WARNING)
    ns, parser = parse(argv)
    cmd = ns.command
    if cmd != "bench" and distributed.from_env().world > 1:  # one run folder, written by one process
        parser.error(f"whiflash-eval {cmd} runs in one process: start it without torchrun (bench is the command "
                     "that shards over ranks)")
    args: Any = ns[cmd]
    if cmd == "bench":
        from .bench import run_bench

        dump = parser.subparsers["bench"].dump(args, skip_none=False)
        return run_bench(bench_config(args), ["whiflash-eval", *argv], config_dump=dump).exit_code
    if cmd == "report":
        from .report import report

        report(args.runs, args.out)
        return 0
    if cmd == "calibrate":
        from .calibrate import calibrate

        calibrate(bench_config(args), method=args.calibrate_method,
                  values=[float(v) for v in str(args.thresholds).split(",") if v.strip()],
                  exclude_run=args.exclude_run, output=args.output)
        return 0
    parser.error(f"unknown command {cmd!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
