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


def test_the_walk_advances_by_the_chosen_slots_tau_where_the_replay_sums_it_over_the_path() -> None:
    dflash = np.ones(3, bool)
    replay, walk = replay_check.estimates(COLS, dflash, (1.0, 1.0), 0.0)
    assert replay == pytest.approx(7 / 3)  # 4 + 2 + 1 tokens in three rounds: position 12's round counted too
    assert walk == pytest.approx(5 / 2)  # 4 tokens to position 14, then 1: two rounds
    replay, walk = replay_check.estimates(COLS, ~dflash, (1.0, 2.0), 0.5)  # EAGLE-3's own path: both agree
    assert replay == walk == pytest.approx(7 / 7.5)
