"""Seeded percentile bootstrap intervals over samples: the bench's speedup intervals (`whiflash.eval.metrics`) and the
calibration's confidence test (`whiflash.calibration.gain_lower_bound`) resample prompts the same way."""
from __future__ import annotations

import math
import random

__all__ = ["bootstrap_ci", "ratio_of_means_ci"]


def bootstrap_ci(values: list[float], iterations: int = 1000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` (NaN, NaN when empty)."""
    if not values:
        return math.nan, math.nan
    if len(values) == 1:
        return values[0], values[0]
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choice(values) for _ in range(n)) / n for _ in range(iterations))
    lo = means[int((1 - level) / 2 * (iterations - 1))]
    hi = means[int((1 + level) / 2 * (iterations - 1))]
    return lo, hi


def ratio_of_means_ci(num: list[float], den: list[float], iterations: int = 1000, seed: int = 0,
                      level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of sum(num) / sum(den) over resampled pairs (num[i], den[i]) (NaN, NaN when
    empty): the interval of the speedup, resampling samples with their AR and method TPOTs together."""
    n = len(num)
    if not n:
        return math.nan, math.nan
    if n == 1:
        return num[0] / den[0], num[0] / den[0]
    rng = random.Random(seed)
    stats = []
    for _ in range(iterations):
        pick = [rng.randrange(n) for _ in range(n)]
        stats.append(sum(num[i] for i in pick) / sum(den[i] for i in pick))
    stats.sort()
    return stats[int((1 - level) / 2 * (iterations - 1))], stats[int((1 + level) / 2 * (iterations - 1))]
