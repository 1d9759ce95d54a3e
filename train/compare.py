"""Which router variant routes faster: one `whiflash-train fit` per variant, compared on the replay.

    python -m whiflash.train.compare DATA --latency-profile FILE [--variants tau,speed,speed/decision,speed+entropy]
        [--out runs/train/variants] [-- FIT FLAGS...]

A variant is a training label (`--data.label`: `tau` or `speed`), optionally a loss after a slash
(`--model.loss`: `mse`, `huber` or `decision`), then optionally context features the router reads beside
the hidden state (`--model.context`; `whiflash.router_context`): `speed+entropy+prev_tau` is the speed
label with two features, `speed/decision` the speed label fitted with the decision loss. A feature `hN` is
the hidden states of the N positions before the decision point (`--data.history N`; rows at every position
only): `speed/decision+h2`. The feature `starts` (rows at every position only) draws each row as often as
decodes start a round there (`--data.balance starts`): `speed/decision+starts`. Every fit gets the same data,
split, seed and flags (anything after `--` goes to each fit), plus `--data.latency_profile FILE`. The table
(Markdown on stdout, `variants.json` in `--out`) gives per variant the validation τ share, the
replayed tokens/s at the exported threshold, at the fastest threshold of the grid and with a threshold per
category (each category's fastest, or a drafter alone, as `whiflash-eval calibrate` picks them), the share
of the speed oracle's gain over the better standalone drafter at each, and per category the share at its
own threshold (docs/train.md, "Tokens per second"): an ablation table. Keep a feature only where it raises
the share: `kept_variant` takes the first variant (list them plainest first) and moves to a later one only
where that one's replayed tokens/s, a threshold per category, are higher by more than `KEEP_MARGIN`.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from whiflash.data import read_manifest
from whiflash.errors import UsageError
from whiflash.io import atomic_write_json
from whiflash.router_context import check_context

from .speed import LABELS
from .task import LOSSES

__all__ = ["DEFAULT_VARIANTS", "KEEP_MARGIN", "compare_variants", "kept_variant", "parse_variant", "variants_table"]

DEFAULT_VARIANTS = ("tau", "speed")
KEEP_MARGIN = 0.01
"""How much faster (relative replayed tokens/s) a later variant must be to be kept over an earlier one: a
feature other than the entropy moves the decision after the verify pass (`whiflash.routers.decides_in_pass`),
and a replay on a validation split of a few hundred prompts does not tell apart gains much smaller than this."""
_HISTORY = re.compile(r"h[1-9][0-9]*")
"""A variant feature `hN`: the router reads N positions of history (`--data.history N`)."""
STARTS = "starts"
"""A variant feature: rows drawn as often as decodes start a round there (`--data.balance starts`)."""


def parse_variant(text: str) -> tuple[str, str | None, list[str], int, bool]:
    """`LABEL[/LOSS][+FEATURE...]` as (label, loss or None for the fit's default, context features, history,
    whether `starts` is named); `UsageError` naming `--variants` otherwise."""
    head, *features = text.strip().split("+")
    label, _, loss = head.partition("/")
    starts = STARTS in features
    features = [f for f in features if f != STARTS]
    history = [int(f[1:]) for f in features if _HISTORY.fullmatch(f)]
    context = [f for f in features if not _HISTORY.fullmatch(f)]
    if len(history) > 1:
        raise UsageError(f"--variants: {text!r} names a history (hN) more than once")
    if label not in LABELS:
        raise UsageError(f"--variants: {text!r} should start with a label ({', '.join(LABELS)}), got {label!r}")
    if loss and loss not in LOSSES:
        raise UsageError(f"--variants: {text!r} names the loss {loss!r}; expected one of {', '.join(LOSSES)}")
    try:
        return (label, loss or None, list(check_context(context, f"--variants {text!r}")),
                history[0] if history else 0, starts)
    except ValueError as err:
        raise UsageError(str(err)) from None


def compare_variants(data: str, latency_profile: str, out: str, fit_args: Sequence[str] = (),
                     variants: Sequence[str] = DEFAULT_VARIANTS) -> dict[str, Any]:
    """Fit one router per variant into `out` and return the figures of each (also written to `out/variants.json`)."""
    from .cli import run

    parsed = {v: parse_variant(v) for v in variants}  # every variant checked before the first fit
    every = read_manifest(data, "DATA").every_position
    for variant, (_, _, context, history, starts) in parsed.items():
        previous = [f for f in context if f.startswith("prev_")]
        if every and previous:  # a row at a position has no previous round (train/task.py refuses it in the fit)
            raise UsageError(f"--variants {variant!r}: {', '.join(previous)} need rows of rounds, and {data} has a "
                             "row at every position (whiflash-datagen --path every)")
        if not every and (history or starts):
            raise UsageError(f"--variants {variant!r}: hN and starts need rows at every position "
                             f"(whiflash-datagen --path every); {data} has rows of rounds")
    rows: dict[str, Any] = {}
    for variant, (label, loss, context, history, starts) in parsed.items():
        flags = ["--model.context", json.dumps(context)] if context else []
        flags += ["--model.loss", loss] if loss else []
        flags += ["--data.history", str(history)] if history else []
        flags += ["--data.balance", STARTS] if starts else []
        name = "variant-" + variant.replace("+", "-").replace("/", "-")
        cli = run(["fit", "--data.path", data, "--data.latency_profile", latency_profile, "--data.label", label,
                   *flags, "--trainer.default_root_dir", out, "--run_name", name, *fit_args])
        run_dir = Path(cli.trainer.log_dir)
        res = json.loads((run_dir / "results.json").read_text())
        o = res["speed"]["overall"]
        rows[variant] = {"run": str(run_dir), "label": label, "loss": loss, "context": context, "history": history,
                         "balance": STARTS if starts else "none",
                         "tau_share": res["routing"]["share"],
                         "threshold": o["threshold"], "router_tokens_per_second": o["router_tokens_per_second"],
                         "share_of_speed_oracle_gain": o["share_of_speed_oracle_gain"],
                         "speed_best_threshold": o["speed_best_threshold"],
                         "speed_best_tokens_per_second": o["speed_best_tokens_per_second"],
                         "speed_best_share_of_speed_oracle_gain": o["speed_best_share_of_speed_oracle_gain"],
                         "best_standalone_tokens_per_second": o["best_standalone_tokens_per_second"],
                         "speed_oracle_tokens_per_second": o["speed_oracle_tokens_per_second"],
                         "calibrated_tokens_per_second": o["calibrated_tokens_per_second"],
                         "calibrated_share_of_speed_oracle_gain": o["calibrated_share_of_speed_oracle_gain"],
                         "per_category": {c: v["share_of_speed_oracle_gain"]
                                          for c, v in res["speed"]["per_category"].items()},
                         "per_category_calibrated": {c: v["calibrated_share_of_speed_oracle_gain"]
                                                     for c, v in res["speed"]["per_category"].items()}}
    result = {"data": data, "latency_profile": latency_profile, "fit_args": list(fit_args), "variants": rows}
    Path(out).mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(out) / "variants.json", result)
    return result


def kept_variant(result: dict[str, Any], margin: float = KEEP_MARGIN) -> str:
    """The variant of `compare_variants`' result to keep: the first one listed, replaced by each later one whose
    replayed tokens/s with a threshold per category (as it will run) beat the kept one's by more than `margin`."""
    rows = result["variants"]
    if not rows:
        raise ValueError("no variants to keep from: compare at least one")
    kept = next(iter(rows))
    for name, row in rows.items():
        if row["calibrated_tokens_per_second"] > rows[kept]["calibrated_tokens_per_second"] * (1 + margin):
            kept = name
    return kept


def variants_table(result: dict[str, Any]) -> str:
    """The comparison as a Markdown table (shares as fractions; — where the oracle gains nothing)."""
    f = lambda x, d=3: "—" if x is None else f"{x:.{d}f}"  # noqa: E731
    cats = sorted({c for r in result["variants"].values() for c in r["per_category_calibrated"]})
    lines = ["| variant | val tau share | tok/s (exported threshold) | share of speed oracle gain | "
             "fastest threshold | tok/s there | share there | tok/s (a threshold per category) | share there | "
             + " | ".join(f"share {c} (its threshold)" for c in cats) + " |",
             "|---|---|---|---|---|---|---|---|---|" + "---|" * len(cats)]
    for variant, r in result["variants"].items():
        lines.append(f"| {variant} | {f(r['tau_share'])} | {f(r['router_tokens_per_second'], 1)} | "
                     f"{f(r['share_of_speed_oracle_gain'])} | {r['speed_best_threshold']:g} | "
                     f"{f(r['speed_best_tokens_per_second'], 1)} | {f(r['speed_best_share_of_speed_oracle_gain'])} | "
                     f"{f(r['calibrated_tokens_per_second'], 1)} | {f(r['calibrated_share_of_speed_oracle_gain'])} | "
                     + " | ".join(f(r["per_category_calibrated"].get(c)) for c in cats) + " |")
    first = next(iter(result["variants"].values()), None)
    if first is not None:
        lines.append(f"\nbetter standalone {f(first['best_standalone_tokens_per_second'], 1)} tok/s, speed oracle "
                     f"{f(first['speed_oracle_tokens_per_second'], 1)} tok/s (validation split, replayed)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Compare router variants (label, loss, context features, history) of whiflash-train on one router dataset (see the
    module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m whiflash.train.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="router dataset folder (whiflash-datagen output)")
    parser.add_argument("--latency-profile", required=True, help="latency profile JSON (whiflash-eval profile)")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help="comma-separated LABEL[/LOSS][+FEATURE...], e.g. tau,speed,speed/decision,speed+entropy,"
                             "speed/decision+h2")
    parser.add_argument("--out", default="runs/train/variants",
                        help="folder for the fits' run folders and variants.json")
    parser.epilog = "Flags after -- go to every whiflash-train fit."
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    variants = [v for v in args.variants.split(",") if v.strip()]
    result = compare_variants(args.data, args.latency_profile, args.out, argv[cut + 1 :], variants)
    print(variants_table(result))
    print(f"\nkept: {kept_variant(result)} (the first listed, unless a later one replays more than "
          f"{KEEP_MARGIN:.0%} faster with a threshold per category)")


if __name__ == "__main__":
    main()
