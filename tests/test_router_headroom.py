"""scripts/router_headroom.py: the round winner's and a cross-fitted linear probe's share of the speed oracle's gain."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from whiflash.latency import LatencyProfile

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("router_headroom", ROOT / "scripts/router_headroom.py")
router_headroom = importlib.util.module_from_spec(spec)
spec.loader.exec_module(router_headroom)

PROFILE = LatencyProfile(ar_step=1.0, round={"dflash": 1.0, "eagle3": 1.0}, router={"neural": 0.01},
                         catchup={"dflash": {1: 0.05, 64: 0.05}, "eagle3": {1: 0.05, 64: 0.05}})


def rows(informative: bool, prompts: int = 40, length: int = 48, seed: int = 0) -> dict[str, np.ndarray]:
    """Rows at every position: where the hidden state's first unit is positive EAGLE-3 (slot 1) accepts 5 and DFlash
    1, elsewhere DFlash 6 and EAGLE-3 2; `informative=False` draws the hidden state apart from that."""
    rng = np.random.default_rng(seed)
    n = prompts * length
    e3_wins = rng.random(n) < 0.3
    hidden = rng.normal(size=(n, 8)).astype(np.float16)
    if informative:
        hidden[:, 0] = np.where(e3_wins, 1.0, -1.0) + 0.1 * rng.normal(size=n)
    return {"prompt_id": np.repeat([f"p{i:02d}" for i in range(prompts)], length),
            "category": np.full(n, "code"), "position": np.tile(np.arange(length), prompts) + 10,
            "tau_0": np.where(e3_wins, 1, 6), "tau_1": np.where(e3_wins, 5, 2),
            "entropy": rng.random(n).astype(np.float32), "hidden": hidden}


def test_a_probe_of_an_informative_state_takes_what_the_round_winner_takes_and_a_blind_one_does_not() -> None:
    kinds = ("dflash", "eagle3")
    good = router_headroom.headroom(rows(True), kinds, PROFILE)["code"]
    blind = router_headroom.headroom(rows(False), kinds, PROFILE)["code"]
    for r in (good, blind):
        assert r["prompts"] == 40 and r["oracle_gain"] > 0.2  # DFlash alone loses a third of the rounds' tokens
        assert r["round_winner_share"] > 0.8  # the rounds' winner is the whole story here
    assert good["probe_auc"] > 0.99 and good["probe_share"] == pytest.approx(good["round_winner_share"], abs=0.02)
    assert 0.4 < blind["probe_auc"] < 0.6 and blind["probe_share"] < 0.2
    assert len(good["probe_thresholds"]) == router_headroom.FOLDS


def test_folds_split_prompts_not_rows_and_follow_the_seed() -> None:
    ids = np.repeat([f"p{i}" for i in range(23)], 3)
    folds = router_headroom.prompt_folds(ids, seed=1)
    assert all(len(set(folds[ids == p])) == 1 for p in set(ids))
    assert sorted(np.bincount(folds[::3]).tolist()) == [4, 4, 5, 5, 5]
    assert (folds == router_headroom.prompt_folds(ids, seed=1)).all()
    assert (folds != router_headroom.prompt_folds(ids, seed=2)).any()


def test_decision_states_are_the_first_row_and_every_row_a_round_of_either_slot_ends_on() -> None:
    cols = {"prompt_id": np.array(["a"] * 4 + ["b"] * 2), "tau_0": np.array([2, 1, 1, 1, 1, 1]),
            "tau_1": np.array([1, 1, 1, 1, 2, 1])}
    rows, prev = router_headroom.decision_states(cols)
    got = {(int(r), float(s), int(t)) for r, (s, t) in zip(rows, prev)}
    assert got == {(0, 0.5, 0), (1, 1.0, 1), (2, 0.0, 2), (2, 0.0, 1), (2, 1.0, 1), (3, 0.0, 1), (3, 1.0, 1),
                   (4, 0.5, 0), (5, 0.0, 1)}  # b's row 4 + slot 1's 2 passes its end; each state once
    assert len(rows) == len(got)


def test_the_previous_round_tells_regimes_apart_that_the_hidden_state_does_not() -> None:
    """Regimes of 48 positions: EAGLE-3 wins (τ 3 against 1) or DFlash does (8 against 6), and the hidden state says
    nothing; a round's τ tells which regime the next round is in, so only the probe that sees it routes."""
    cols = rows(False, prompts=20, length=192)
    regime_e3 = (cols["position"] // 48) % 2 == 1
    cols["tau_0"], cols["tau_1"] = np.where(regime_e3, 1, 8), np.where(regime_e3, 3, 6)
    r = router_headroom.headroom(cols, ("dflash", "eagle3"), PROFILE)["code"]
    assert r["oracle_gain"] > 0.1
    assert r["state_probe_share"] < 0.05 and r["state_probe_prev_share"] > r["state_probe_share"] + 0.25
