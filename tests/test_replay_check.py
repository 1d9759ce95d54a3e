"""scripts/replay_check.py: the rows priced state for state against a bench run, and the two row estimates."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("replay_check", ROOT / "scripts/replay_check.py")
replay_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(replay_check)

# one prompt logged along EAGLE-3's path (slot 1 advanced 2, 2): rows at positions 10, 12, 14
COLS = {"prompt_id": np.array(["p", "p", "p"]), "position": np.array([10, 12, 14]),
        "tau_0": np.array([4, 2, 1]), "tau_1": np.array([2, 2, 3])}


def test_rounds_on_the_rows_states_are_compared_until_the_decode_leaves_them() -> None:
    run = {"p": {"eagle3": {"prompt_tokens": 10, "taus": [2, 2, 3]},
                 "dflash": {"prompt_tokens": 10, "taus": [3, 5]},  # 3 < the row's 4; then position 13: no row
                 "whiflash-neural": {"prompt_tokens": 10, "taus": [4, 1], "slots": [0, 0]},
                 "ar": {"prompt_tokens": 10, "taus": [1, 1]}},
           "q": {"eagle3": {"prompt_tokens": 5, "taus": [2]}}}  # a prompt without rows
    got = replay_check.state_check(COLS, run, ("dflash", "eagle3"))
    assert got == {"eagle3": [3, 3, 0, 0], "dflash": [1, 0, 1, 0], "whiflash-neural": [2, 2, 0, 0]}


def test_the_walk_stands_where_the_chosen_slot_lands_and_both_estimates_cost_as_the_replay_does() -> None:
    from whiflash.latency import LatencyProfile
    from whiflash.speed_oracle import simulate

    prof = LatencyProfile(ar_step=1.0, round={"dflash": 1.0, "eagle3": 1.0},
                          catchup={"dflash": {1: 0.0, 10: 0.0}, "eagle3": {1: 0.0, 10: 0.0}})
    kinds = ("dflash", "eagle3")
    dflash = np.ones(3, bool)
    idx, gaps = replay_check.walked(COLS, dflash)
    assert idx.tolist() == [0, 2] and gaps.tolist() == [0, 0]  # 4 tokens from 10 land on row 14; row 12 skipped
    idx, gaps = replay_check.walked(COLS, ~dflash)
    assert idx.tolist() == [0, 1, 2] and gaps.tolist() == [0, 0, 0]  # EAGLE-3's own path: every row
    gapped = {**COLS, "tau_0": np.array([1, 2, 1])}  # DFlash's 1 token from 10 lands on 11: next row 12, gap 1
    idx, gaps = replay_check.walked(gapped, dflash)
    assert idx.tolist() == [0, 1, 2] and gaps.tolist() == [1, 0, 0]
    _, walk = replay_check.estimates(gapped, dflash, kinds, (1.0, 1.0), prof, 0.0)
    assert walk == pytest.approx((1 + 1 + 2 + 1) / (3 + 1 / 1))  # the gap token paid at its round's rate
    replay, walk = replay_check.estimates(COLS, dflash, kinds, (1.0, 1.0), prof, 0.0)
    assert replay == pytest.approx(7 / 3)  # 4 + 2 + 1 tokens in three rounds: position 12's round counted too
    assert walk == pytest.approx(5 / 2)  # 4 tokens to position 14, then 1: two rounds
    replay, walk = replay_check.estimates(COLS, ~dflash, kinds, (1.0, 2.0), prof, 0.5)  # own path: both agree
    tokens, ms, _ = simulate(~dflash, COLS, kinds, (1.0, 2.0), prof, 0.5)
    assert replay == walk == pytest.approx(tokens / ms) == pytest.approx(7 / 7.5)
