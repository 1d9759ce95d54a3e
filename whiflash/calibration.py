"""The threshold rule every calibration shares: which slot a threshold picks, and which threshold wins.

A threshold router drafts with slot 0 (the pair's parallel drafter) when its score clears the
threshold: WhiFlash-Entropy when the target's next-token entropy is below θ, WhiFlash-Neural when the
predicted gain τ(slot 0) − τ(slot 1) is above θ. A calibration sweeps θ, scores each value (pooled τ
of logged rounds in `whiflash-train`, replayed or measured speedup in `whiflash-eval calibrate`) and
keeps the best one; ties go to the smaller θ. An infinite θ pins a slot: the method then decodes with
that slot's drafter alone and pays no decision (`pinned_slot`), so a category where one drafter is
always faster loses nothing to routing. A routing θ has to beat that drafter by a margin, a share of its
speed (`min_gain`) and, where the calibration knows each prompt's time per token, with a confidence over
its prompts (`gain_lower_bound`): a gain its few prompts show by chance is not worth a decision a round.
`whiflash.train.calibrate`, `whiflash.train.speed` (the speed report's thresholds per category),
`whiflash.eval.replay` and `whiflash.eval.calibrate` all decide through these functions.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np

from whiflash.bootstrap import ratio_of_means_ci

__all__ = ["METHODS", "best_threshold", "check_confidence", "check_min_gain", "gain_lower_bound", "pick_threshold",
           "picks_slot0", "pinned_slot"]

BOOTSTRAP_ITERATIONS = 2000
"""Resamples of the calibration's prompts behind `gain_lower_bound`."""

METHODS = ("whiflash-entropy", "whiflash-neural")
"""The threshold routers."""


def picks_slot0(method: str, values: np.ndarray, threshold: float) -> np.ndarray:
    """Per round, True where `method` at `threshold` drafts with slot 0: entropy `values` below it
    (whiflash-entropy), predicted gains above it (whiflash-neural)."""
    if method == "whiflash-entropy":
        return np.asarray(values) < threshold
    if method == "whiflash-neural":
        return np.asarray(values) > threshold
    raise ValueError(f"--calibrate-method: expected one of {', '.join(METHODS)}, got {method!r}")


def pinned_slot(method: str, threshold: float | None) -> int | None:
    """The slot an infinite `threshold` always picks (entropy: +inf slot 0, -inf slot 1; neural the other way
    round); None for a finite one (or none)."""
    if threshold is None or not math.isinf(threshold):
        return None
    return 0 if bool(picks_slot0(method, np.zeros(1), threshold)[0]) else 1


def check_min_gain(min_gain: float) -> None:
    """`ValueError` naming `--min-gain` unless it is a finite share >= 0."""
    if isinstance(min_gain, bool) or not isinstance(min_gain, (int, float)) or not 0 <= min_gain < math.inf:
        raise ValueError(f"--min-gain: expected a share >= 0 (0.02: 2% faster), got {min_gain!r}")


def check_confidence(confidence: float) -> None:
    """`ValueError` naming `--min-gain-confidence` unless it is 0 (off) or a probability below 1."""
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 <= confidence < 1:
        raise ValueError(f"--min-gain-confidence: expected 0 (off) or a probability in (0, 1), e.g. 0.9; "
                         f"got {confidence!r}")


def gain_lower_bound(routed_tpot: Sequence[float], alone_tpot: Sequence[float], confidence: float,
                     iterations: int = BOOTSTRAP_ITERATIONS, seed: int = 0) -> float:
    """The gain of a routed method over a drafter alone (mean TPOT of the drafter / mean TPOT of the method - 1,
    the bench's headline ratio) that its prompts show with probability `confidence`: the `1 - confidence`
    quantile of the bench's paired bootstrap over the prompts (`ratio_of_means_ci`: each prompt's two times per
    output token resampled together). Both hold one time per token per prompt, in the same prompt order."""
    check_confidence(confidence)
    routed, alone = [float(x) for x in routed_tpot], [float(x) for x in alone_tpot]
    if len(routed) != len(alone) or not routed:
        raise ValueError(f"gain_lower_bound: expected the same prompts' times per token for both methods, got "
                         f"{len(routed)} and {len(alone)}")
    # a two-sided interval at level 2p - 1 has its lower end at the 1 - p quantile
    return ratio_of_means_ci(alone, routed, iterations, seed, level=2 * confidence - 1)[0] - 1


def best_threshold(sweep: Mapping[float, float], min_gain: float = 0.0,
                   confident: Callable[[float, float], bool] | None = None) -> float | None:
    """The threshold of the highest finite score in `sweep` (threshold -> score); ties: the smaller threshold.
    None when no score is finite. `min_gain`: a finite threshold wins only when its score is at least
    `1 + min_gain` times the best infinite one's (a drafter alone), else that infinite threshold does: a
    gain smaller than what separates the calibration's prompts from others is not worth a decision a round.
    `confident(finite, infinite)`: a finite threshold must also pass this test against that drafter (the
    calibrations' `gain_lower_bound` above 0)."""
    check_min_gain(min_gain)
    valid = {t: s for t, s in sweep.items() if not math.isnan(s)}
    if not valid:
        return None
    best = max(sorted(valid), key=lambda t: valid[t])
    alone = {t: s for t, s in valid.items() if math.isinf(t)}
    if alone and not math.isinf(best):
        pinned = max(sorted(alone), key=lambda t: alone[t])
        if valid[best] < alone[pinned] * (1 + min_gain) or (confident is not None and not confident(best, pinned)):
            return pinned
    return best


def pick_threshold(sweep: Mapping[float, float], min_gain: float = 0.0, confidence: float = 0.0,
                   tpots: Mapping[float, Mapping[Hashable, float]] | None = None
                   ) -> tuple[float | None, dict[str, float]]:
    """`best_threshold` with the confidence test a calibration runs where it knows each prompt's time per token
    (`tpots[threshold][prompt]`): with `confidence`, the fastest finite threshold must show a gain over the
    drafter alone (the prompts both decoded, paired) whose `gain_lower_bound` is above 0. Returns the pick and
    the bound of each finite threshold tested, by `str(threshold)` (empty when none was)."""
    bounds: dict[str, float] = {}
    table = tpots or {}

    def confident(finite: float, pinned: float) -> bool:
        both = sorted(table[finite].keys() & table[pinned].keys())
        bounds[str(finite)] = gain_lower_bound([table[finite][k] for k in both], [table[pinned][k] for k in both],
                                               confidence)
        return bounds[str(finite)] > 0

    return best_threshold(sweep, min_gain, confident if confidence and table else None), bounds
