"""One session for datagen and eval: the same paths, stop ids and threshold rule."""
from __future__ import annotations

import math

import json
from pathlib import Path

import numpy as np
import pytest

from whiflash.calibration import best_threshold, gain_lower_bound, pick_threshold, picks_slot0
from whiflash.session import model_paths, stop_ids


def test_paths_come_from_the_flags_else_the_testbed(tmp_path: Path) -> None:
    assert model_paths(tmp_path, dflash="z-lab/x") == {"target": str(tmp_path / "target"),
                                                        "eagle3": str(tmp_path / "eagle3"), "dflash": "z-lab/x"}
    assert model_paths(None, target="t") == {"target": "t", "eagle3": None, "dflash": None}
    with pytest.raises(TypeError, match="unknown checkpoint ddtree; expected target, eagle3, dflash"):
        model_paths(None, ddtree="d")


def test_datagen_and_eval_share_the_stop_ids_of_the_generation_config(tmp_path: Path) -> None:
    from whiflash.datagen import cli as datagen_cli
    from whiflash.eval import bench

    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 3]}))

    class Tok:
        eos_token_id = 5

    assert stop_ids(Tok(), str(tmp_path)) == [3, 5, 7]
    assert stop_ids(None, None) == []
    # both tools open their models through the one session
    assert datagen_cli.Session is bench.Session


def test_one_threshold_rule() -> None:
    entropy = np.array([0.1, 0.5, 0.9])
    assert picks_slot0("whiflash-entropy", entropy, 0.5).tolist() == [True, False, False]
    assert picks_slot0("whiflash-neural", entropy, 0.5).tolist() == [False, False, True]
    assert best_threshold({0.4: 2.0, 0.2: 2.0, 0.8: 1.0}) == 0.2  # ties: the smaller threshold
    assert best_threshold({0.1: float("nan")}) is None
    # a finite threshold has to beat the faster drafter alone by min_gain, or that drafter is pinned
    sweep = {-math.inf: 1.0, 0.5: 1.02, math.inf: 1.01}
    assert best_threshold(sweep) == best_threshold(sweep, 0.009) == 0.5
    assert best_threshold(sweep, 0.02) == math.inf and best_threshold({**sweep, -math.inf: 1.1}, 0.0) == -math.inf
    assert best_threshold({0.5: 1.02, 1.0: 1.0}, 0.5) == 0.5  # no drafter alone swept: nothing to fall back on
    for bad in (-0.1, math.inf, "2%", True):
        with pytest.raises(ValueError, match="--min-gain: expected a share >= 0"):
            best_threshold(sweep, bad)
    # and, with a confidence test, pass it against that drafter
    assert best_threshold(sweep, 0.0, lambda finite, pinned: (finite, pinned) != (0.5, math.inf)) == math.inf
    assert best_threshold(sweep, 0.0, lambda finite, pinned: True) == 0.5
    with pytest.raises(ValueError, match="--calibrate-method: expected one of"):
        picks_slot0("oracle", entropy, 0.5)


def test_a_gain_its_prompts_show_by_chance_has_a_lower_bound_below_zero() -> None:
    """`gain_lower_bound`: a paired bootstrap over prompts of the headline ratio (mean TPOT alone / mean TPOT
    routed - 1). A routed method faster on every prompt has a bound above 0 and below its gain; one that wins big
    on a few prompts and loses on most, with the same mean gain, does not clear 0; a higher confidence lowers it."""
    rng = np.random.default_rng(1)
    alone = rng.uniform(0.2, 0.4, 30)
    steady = alone / 1.05  # 5% faster on every prompt
    lucky = alone.copy()
    lucky[:2] /= 4  # two prompts far faster, the rest a little slower: the same mean gain
    lucky[2:] *= (alone.sum() / 1.05 - lucky[:2].sum()) / lucky[2:].sum()
    assert alone.mean() / lucky.mean() - 1 == pytest.approx(0.05)
    low = gain_lower_bound(steady, alone, 0.9)
    assert 0.0 < low <= 0.05 + 1e-9
    assert gain_lower_bound(lucky, alone, 0.9) < 0 < gain_lower_bound(lucky, alone, 0.2)
    bounds = [gain_lower_bound(lucky, alone, p) for p in (0.99, 0.9, 0.5)]
    assert bounds[0] <= bounds[1] < bounds[2]
    assert gain_lower_bound(steady, alone, 0.9) == low  # seeded: the same figure every time
    with pytest.raises(ValueError, match="the same prompts' times per token"):
        gain_lower_bound(steady[:-1], alone, 0.9)
    # `pick_threshold`: the test over the prompts both decoded, paired by prompt (one only the drafter decoded is
    # left out), its bound written by threshold
    sweep = {0.5: 1.05, math.inf: 1.0}
    tpots = {math.inf: {**dict(enumerate(alone)), "extra": 9.0}}
    assert pick_threshold(sweep, 0.0, 0.9, {**tpots, 0.5: dict(enumerate(steady))}) == (0.5, {"0.5": low})
    best, bounds = pick_threshold(sweep, 0.0, 0.9, {**tpots, 0.5: dict(enumerate(lucky))})
    assert best == math.inf and bounds["0.5"] < 0
    assert pick_threshold(sweep, 0.0, 0.0, {**tpots, 0.5: dict(enumerate(lucky))}) == (0.5, {})  # 0: no test
    for bad in (1.0, -0.1, True, "90%"):
        with pytest.raises(ValueError, match="--min-gain-confidence: expected 0"):
            gain_lower_bound(steady, alone, bad)
