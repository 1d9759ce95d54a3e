"""Which training label routes faster: one `whiflash-train fit` per `--data.label`, compared on the replay.

    python -m whiflash.train.compare DATA --latency-profile FILE [--out runs/train/labels] [-- FIT FLAGS...]

Every fit gets the same data, split, seed and flags (anything after `--` goes to each fit), plus
`--data.latency_profile FILE` and its label. The table (Markdown on stdout, `labels.json` in `--out`)
gives per label the validation τ share, the replayed tokens/s at the exported threshold and at the
fastest threshold of the grid, and the share of the speed oracle's gain over the better standalone
drafter at each (docs/train.md, "Tokens per second"). The label with the larger share at the fastest
threshold is the one to calibrate and ship.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from whiflash.io import atomic_write_json

from .speed import LABELS

__all__ = ["compare_labels", "labels_table"]


def compare_labels(data: str, latency_profile: str, out: str, fit_args: Sequence[str] = (),
                   labels: Sequence[str] = LABELS) -> dict[str, Any]:
    """Fit one router per label into `out` and return the figures of each (also written to `out/labels.json`)."""
    from .cli import run

    rows: dict[str, Any] = {}
    for label in labels:
        cli = run(["fit", "--data.path", data, "--data.latency_profile", latency_profile, "--data.label", label,
                   "--trainer.default_root_dir", out, "--run_name", f"label-{label}", *fit_args])
        run_dir = Path(cli.trainer.log_dir)
        res = json.loads((run_dir / "results.json").read_text())
        o = res["speed"]["overall"]
        rows[label] = {"run": str(run_dir), "tau_share": res["routing"]["share"],
                       "threshold": o["threshold"], "router_tokens_per_second": o["router_tokens_per_second"],
                       "share_of_speed_oracle_gain": o["share_of_speed_oracle_gain"],
                       "speed_best_threshold": o["speed_best_threshold"],
                       "speed_best_tokens_per_second": o["speed_best_tokens_per_second"],
                       "speed_best_share_of_speed_oracle_gain": o["speed_best_share_of_speed_oracle_gain"],
                       "best_standalone_tokens_per_second": o["best_standalone_tokens_per_second"],
                       "speed_oracle_tokens_per_second": o["speed_oracle_tokens_per_second"],
                       "per_category": {c: v["share_of_speed_oracle_gain"]
                                        for c, v in res["speed"]["per_category"].items()}}
    result = {"data": data, "latency_profile": latency_profile, "fit_args": list(fit_args), "labels": rows}
    Path(out).mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(out) / "labels.json", result)
    return result


def labels_table(result: dict[str, Any]) -> str:
    """The comparison as a Markdown table (shares as fractions; — where the oracle gains nothing)."""
    f = lambda x, d=3: "—" if x is None else f"{x:.{d}f}"  # noqa: E731
    lines = ["| label | val tau share | tok/s (exported threshold) | share of speed oracle gain | fastest threshold | "
             "tok/s there | share there | better standalone tok/s | speed oracle tok/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, r in result["labels"].items():
        lines.append(f"| {label} | {f(r['tau_share'])} | {f(r['router_tokens_per_second'], 1)} | "
                     f"{f(r['share_of_speed_oracle_gain'])} | {r['speed_best_threshold']:g} | "
                     f"{f(r['speed_best_tokens_per_second'], 1)} | {f(r['speed_best_share_of_speed_oracle_gain'])} | "
                     f"{f(r['best_standalone_tokens_per_second'], 1)} | {f(r['speed_oracle_tokens_per_second'], 1)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Compare the training labels of whiflash-train on one router dataset (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m whiflash.train.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="router dataset folder (whiflash-datagen output)")
    parser.add_argument("--latency-profile", required=True, help="latency profile JSON (whiflash-eval profile)")
    parser.add_argument("--out", default="runs/train/labels", help="folder for the fits' run folders and labels.json")
    parser.epilog = "Flags after -- go to every whiflash-train fit."
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    print(labels_table(compare_labels(args.data, args.latency_profile, args.out, argv[cut + 1 :])))


if __name__ == "__main__":
    main()
