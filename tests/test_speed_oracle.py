"""The speed oracle: hand-computed small cases, and the dynamic programme against brute force."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from whiflash.latency import LatencyProfile
from whiflash.eval.replay import simulate
from whiflash.speed_oracle import headline_rate, oracle_gain_share, round_starts, simulate_prompts, speed_oracle

KINDS = ("dflash", "eagle3")


def _profile(catchup: dict[str, dict[int, float]] | None = None, **rounds: float) -> LatencyProfile:
    """Rounds of 1 ms and a catch-up of 0.1 ms a row for both models (unless given)."""
    return LatencyProfile(ar_step=0.5, round={"dflash": 1.0, "eagle3": 1.0, "ddtree-b4": 1.0, **rounds},
                          catchup=catchup or {"dflash": {10: 1.0}, "eagle3": {10: 1.0}})


def _cols(taus: list[tuple[list[int], list[int]]], starts: list[int], cats: list[str] | None = None) -> dict:
    cats = cats or ["code"] * len(taus)
    pid, cat, pos, t0, t1 = [], [], [], [], []
    for i, ((a, b), p, c) in enumerate(zip(taus, starts, cats)):
        pid += [f"p{i}"] * len(a)
        cat += [c] * len(a)
        pos += [p] * len(a)  # only a prompt's first position matters: later ones follow the routing
        t0 += a
        t1 += b
    return {"prompt_id": np.array(pid), "category": np.array(cat), "position": np.array(pos),
            "tau_0": np.array(t0), "tau_1": np.array(t1)}


def test_switching_not_worth_its_catch_up() -> None:
    # round 2 has the larger tau on slot 1 (6 > 5), but switching there and back costs 1.0 + 1.1 ms of catch-up:
    # always slot 0: 20 tokens in 1 + 3 * (1 + 0.5) = 5.5 ms; via slot 1 in round 2: 21 tokens in 6.6 ms
    cols = _cols([([5, 5, 5, 5], [1, 1, 6, 1])], [0])
    res = speed_oracle(cols, KINDS, _profile())["categories"]["code"]
    assert res["tokens_per_second"] == pytest.approx(20 / 5.5 * 1e3)
    assert res["best_standalone"] == "slot0" and res["oracle_gain"] == pytest.approx(0.0, abs=1e-12)
    assert res["slot0_rounds"] == 1.0 and res["tau"] == 5.0
    assert oracle_gain_share(3000.0, res["best_standalone_tokens_per_second"], res["tokens_per_second"]) is None


def test_switching_worth_its_catch_up() -> None:
    # slot 0, 0, then slot 1 twice: 20 tokens; 1 + (1 + 0.5) + (1 + 1.0: slot 1's backlog of 10) + (1 + 0.5) = 6 ms.
    # Standalone: slot 0 12 tokens in 5.1 ms, slot 1 12 tokens in 4.7 ms.
    cols = _cols([([5, 5, 1, 1], [1, 1, 5, 5])], [0])
    res = speed_oracle(cols, KINDS, _profile())["categories"]["code"]
    assert res["tokens_per_second"] == pytest.approx(20 / 6.0 * 1e3)
    assert res["standalone"] == pytest.approx({"slot0": 12 / 5.1 * 1e3, "slot1": 12 / 4.7 * 1e3})
    assert res["best_standalone"] == "slot1"
    assert res["oracle_gain"] == pytest.approx((20 / 6.0) / (12 / 4.7) - 1)
    assert res["speedup"] == pytest.approx(20 / 6.0 * 0.5) and res["slot0_rounds"] == 0.5
    best, oracle = res["best_standalone_tokens_per_second"], res["tokens_per_second"]
    assert oracle_gain_share(best, best, oracle) == pytest.approx(0.0)
    assert oracle_gain_share(oracle, best, oracle) == pytest.approx(1.0)
    assert oracle_gain_share((best + oracle) / 2, best, oracle) == pytest.approx(0.5)


def _brute(cols: dict, kinds: tuple[str, str], prof: LatencyProfile, lazy: bool, budget: int | None = None) -> float:
    """The best headline tokens/s (1 / mean over prompts of ms per token) over every slot choice of every round of
    every prompt at once (through the replay's own costs)."""
    rounds = tuple(prof.round_ms(k, budget) for k in kinds)
    best = 0.0
    for choice in itertools.product((True, False), repeat=len(cols["tau_0"])):
        tok, ms, _ = simulate_prompts(np.array(choice), cols, kinds, rounds, prof, 0.0, lazy)
        best = max(best, headline_rate(tok, ms) * 1e3)
    return best


@pytest.mark.parametrize("lazy", [True, False])
@pytest.mark.parametrize("case", ["linear", "falling", "shared"])
def test_dynamic_programme_matches_brute_force(lazy: bool, case: str) -> None:
    rng = np.random.default_rng(7)
    kinds: tuple[str, str] = ("ddtree", "dflash") if case == "shared" else KINDS
    catchup = {"dflash": {1: 0.3, 8: 0.2, 20: 1.5}, "eagle3": {4: 0.9, 30: 0.4}} if case == "falling" else None
    prof = _profile(catchup, dflash=1.3, eagle3=0.8)
    for _ in range(4):
        taus = [(rng.integers(1, 9, 5).tolist(), rng.integers(1, 9, 5).tolist()),
                (rng.integers(1, 9, 4).tolist(), rng.integers(1, 9, 4).tolist())]
        cols = _cols(taus, rng.integers(0, 40, 2).tolist())
        res = speed_oracle(cols, kinds, prof, tree_budget=4, lazy=lazy)["categories"]
        assert res["all"]["tokens_per_second"] == pytest.approx(_brute(cols, kinds, prof, lazy, 4), rel=1e-12)
        assert res["all"]["oracle_gain"] >= -1e-12


@pytest.mark.parametrize("lazy", [True, False])
@pytest.mark.parametrize("case", ["linear", "falling"])
def test_every_position_programme_matches_brute_force(lazy: bool, case: str) -> None:
    """Rows at every position (`--path every`): the oracle walks, and is the best pooled tokens/s over every slot
    choice at every row, each replayed along its own walk; every standalone drafter is one of those walks."""
    rng = np.random.default_rng(11)
    catchup = {"dflash": {1: 0.3, 8: 0.2, 20: 1.5}, "eagle3": {4: 0.9, 30: 0.4}} if case == "falling" else None
    prof = _profile(catchup, dflash=1.3, eagle3=0.8)
    rounds = (1.3, 0.8)
    for _ in range(4):
        rows = rng.integers(8, 12)
        t0, t1 = rng.integers(1, 6, rows), rng.integers(1, 4, rows)
        start = int(rng.integers(3, 30))
        cols = {"prompt_id": np.array(["p"] * rows), "category": np.array(["code"] * rows),
                "position": start + np.arange(rows), "tau_0": t0, "tau_1": t1}
        res = speed_oracle(cols, KINDS, prof, lazy=lazy, every=True)["categories"]["all"]
        brute = max(tok / ms * 1e3 for choice in itertools.product((True, False), repeat=int(rows))
                    for tok, ms, _ in [simulate(np.array(choice), cols, KINDS, rounds, prof, 0.0, lazy, every=True)])
        assert res["tokens_per_second"] == pytest.approx(brute, rel=1e-12)
        assert res["oracle_gain"] >= -1e-12 and res["rounds"] <= rows


def test_round_starts_are_the_chance_a_fair_coin_decode_starts_a_round_there() -> None:
    """Against enumerating every coin sequence; the rows' order does not matter, and a prompt's first row is 1."""
    rng = np.random.default_rng(5)
    pid, pos, t0, t1, expected = [], [], [], [], []
    for p in range(3):
        rows = int(rng.integers(6, 11))
        a, b = rng.integers(1, 5, rows), rng.integers(1, 4, rows)
        visits = np.zeros(rows)

        def walk(i: int, prob: float) -> None:
            if i < rows:
                visits[i] += prob
                walk(i + int(a[i]), prob / 2)
                walk(i + int(b[i]), prob / 2)

        walk(0, 1.0)
        pid += [f"p{p}"] * rows
        pos += list(10 * p + np.arange(rows))
        t0 += list(a)
        t1 += list(b)
        expected += list(visits)
    cols = [np.array(c) for c in (pid, pos, t0, t1)]
    assert round_starts(*cols) == pytest.approx(np.array(expected), abs=1e-12)
    shuffle = rng.permutation(len(pid))
    assert round_starts(*(c[shuffle] for c in cols)) == pytest.approx(np.array(expected)[shuffle], abs=1e-12)
    with pytest.raises(ValueError, match="prompt p0: its rows are not one per position"):
        round_starts(np.array(["p0", "p0"]), np.array([3, 5]), np.array([1, 1]), np.array([1, 1]))


def test_categories_are_separate_and_weigh_prompts_as_the_bench_does() -> None:
    cols = _cols([([5, 5, 1, 1], [1, 1, 5, 5]), ([5, 5, 5, 5], [1, 1, 6, 1])], [0, 0], ["math", "prose"])
    res = speed_oracle(cols, KINDS, _profile())
    assert set(res["categories"]) == {"math", "prose", "all"} and res["slots"] == ["dflash", "eagle3"]
    assert res["categories"]["math"]["tokens_per_second"] == pytest.approx(20 / 6.0 * 1e3)
    # 1 / the mean of the two prompts' ms per token (6.0 / 20 and 5.5 / 20), not 40 tokens / 11.5 ms pooled
    assert res["categories"]["all"]["tokens_per_second"] == pytest.approx(1e3 / ((6.0 / 20 + 5.5 / 20) / 2))
    assert res["categories"]["all"]["rounds"] == 8


def test_headline_rate_weighs_every_prompt_the_same() -> None:
    """A short fast prompt counts as much as a long slow one (the bench's mean TPOT), and one prompt is its own
    tokens per ms; prompts of no tokens are left out, and none at all is an error."""
    assert headline_rate(np.array([10, 90]), np.array([1.0, 30.0])) == pytest.approx(1 / ((0.1 + 1 / 3) / 2))
    assert headline_rate(np.array([7]), np.array([2.0])) == pytest.approx(3.5)
    assert headline_rate(np.array([0, 7]), np.array([0.0, 2.0])) == pytest.approx(3.5)
    with pytest.raises(ValueError, match="no prompt has tokens"):
        headline_rate(np.array([0]), np.array([0.0]))


def test_report_shares_of_measured_routers(tmp_path) -> None:
    from whiflash.errors import UsageError
    from whiflash.eval.oracle_share import oracle_shares, shares_markdown
    from whiflash.eval.report import report
    from whiflash.train.synthetic import write_synthetic_dataset

    data = tmp_path / "rows"
    write_synthetic_dataset(data, num_prompts=6, rounds_per_prompt=8, hidden_size=8, categories=("code", "math"),
                            progress=False)
    prof = _profile().write(tmp_path / "p.json")
    cells = {"code": {"ar": {"speedup": 1.0}, "dflash": {"speedup": 2.0}, "eagle3": {"speedup": 1.6},
                      "whiflash-neural": {"speedup": 2.1}, "whiflash-entropy": {"speedup": 1.9}},
             "prose": {"dflash": {"speedup": 2.0}}}  # no such category in the rows: left out
    shares = oracle_shares({"cells": cells}, data, prof)
    code = shares["categories"]["code"]
    assert set(shares["categories"]) == {"code"} and code["best_standalone"] == "dflash"
    gain = code["speed_oracle_gain"]
    assert gain > 0 and code["speed_oracle_speedup"] == pytest.approx(2.0 * (1 + gain))
    assert code["share_of_speed_oracle_gain"]["whiflash-neural"] == pytest.approx((2.1 / 2.0 - 1) / gain)
    assert code["share_of_speed_oracle_gain"]["whiflash-entropy"] < 0  # slower than DFlash alone
    assert "| code | whiflash-neural | dflash (2.000×) |" in shares_markdown(shares)
    parts = code["gain_by_prompt"]  # the code rows' 3 prompts (the synthetic data's categories take turns)
    assert len(parts) == 3 and sum(e["share"] for e in parts) == pytest.approx(1.0)
    half = 1 + int(np.searchsorted(np.cumsum([e["share"] for e in parts]), 0.5 - 1e-9))
    assert f"| code | {half} of 3 | `{parts[0]['prompt_id']}` {parts[0]['share']:.2f} (" in shares_markdown(shares)
    with pytest.raises(UsageError, match="--replay DATA and --latency-profile FILE go together"):
        report([str(tmp_path)], str(tmp_path / "out"), replay=str(data))


def test_report_replays_only_the_runs_own_prompts_where_the_rows_hold_them(tmp_path) -> None:
    import pyarrow.parquet as pq

    from whiflash.eval.oracle_share import oracle_shares, shares_markdown
    from whiflash.eval.outputs import run_sample_ids
    from whiflash.train.synthetic import write_synthetic_dataset

    data = tmp_path / "rows"
    write_synthetic_dataset(data, num_prompts=6, rounds_per_prompt=8, hidden_size=8, categories=("code", "math"),
                            progress=False)
    rows = pq.read_table(sorted(data.glob("shard-*.parquet")),
                         columns=["prompt_id", "category", "tau_0", "tau_1"]).to_pandas()
    code = rows[rows.category == "code"]
    mine = sorted(set(code.prompt_id))[:2]
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"samples": [{"id": s, "category": "code", "turns": 1}
                                                               for s in [*mine, "not-in-the-rows"]]}))
    assert run_sample_ids(run, "report") == dict.fromkeys([*mine, "not-in-the-rows"], "code")
    with pytest.raises(ValueError, match=rf"report {tmp_path}: .*manifest.json lists no samples"):
        run_sample_ids(tmp_path, "report")
    cells = {"code": {"dflash": {"speedup": 2.0, "tau": 3.5}, "eagle3": {"speedup": 1.6, "tau": 2.5},
                      "whiflash-neural": {"speedup": 2.1}}}
    prof = _profile().write(tmp_path / "p.json")
    every, own = oracle_shares({"cells": cells}, data, prof), oracle_shares({"cells": cells}, data, prof,
                                                                             samples=run_sample_ids(run, "report"))
    assert every["categories"]["code"]["prompts"] == len(set(code.prompt_id)) > 2
    assert not every["categories"]["code"]["runs_own_prompts"]
    c = own["categories"]["code"]
    assert c["prompts"] == 2 and c["run_prompts"] == 3 and c["runs_own_prompts"]
    assert c["tau_measured"] == {"dflash": 3.5, "eagle3": 2.5}
    kept = code[code.prompt_id.isin(mine)]
    for i, kind in enumerate(("dflash", "eagle3")):  # the synthetic pair's slots
        assert c["tau_replayed"][kind] == pytest.approx(kept.groupby("prompt_id")[f"tau_{i}"].mean().mean())
    text = shares_markdown(own)
    assert "| 2 (of the run's 3) |" in text and f"| code | dflash | {c['tau_replayed']['dflash']:.2f} | 3.50 |" in text


def test_prompt_gains_say_which_prompts_the_oracles_gain_comes_from() -> None:
    from whiflash.speed_oracle import prompt_gains

    # p0 and p2 gain by switching (test_switching_worth_its_catch_up), p1 does not
    # (test_switching_not_worth_its_catch_up); prose's two prompts: the oracle gains nothing there
    taus = [([5, 5, 1, 1], [1, 1, 5, 5]), ([5, 5, 5, 5], [1, 1, 6, 1]), ([5, 5, 1, 1], [1, 1, 5, 5]),
            ([5, 5, 5, 5], [1, 1, 1, 1]), ([4, 4, 4, 4], [1, 1, 1, 1])]
    cols = _cols(taus, [0] * 5, ["code"] * 3 + ["prose"] * 2)
    res = speed_oracle(cols, KINDS, _profile())["categories"]
    gains = prompt_gains(cols, KINDS, _profile())
    code = {e["prompt_id"]: e for e in gains["code"]}
    assert res["code"]["oracle_gain"] > 0 and set(code) == {"p0", "p1", "p2"}
    assert sum(e["share"] for e in gains["code"]) == pytest.approx(1.0)
    assert code["p0"]["share"] == pytest.approx(0.5) and code["p2"]["share"] == pytest.approx(0.5)
    assert code["p1"]["share"] == pytest.approx(0.0, abs=1e-12) and code["p1"]["gain"] == pytest.approx(0.0, abs=1e-12)
    assert code["p0"]["gain"] == pytest.approx((20 / 6.0) / (12 / 5.1) - 1)  # against slot 0, code's better drafter
    assert code["p0"]["tokens"] == 12 and [e["prompt_id"] for e in gains["code"]][-1] == "p1"  # largest share first
    assert res["prose"]["oracle_gain"] == pytest.approx(0.0, abs=1e-12) and gains["prose"] == []
    assert {e["prompt_id"] for e in gains["all"]} == {"p0", "p1", "p2", "p3", "p4"}


def test_prompt_gains_on_rows_at_every_position_add_up_to_the_oracles_gain() -> None:
    """Each prompt's share is >= 0, the shares sum to 1, the prompt with the largest share gains on its own, and each
    prompt is held against the category's better drafter walking its own path over that prompt's rows."""
    from whiflash.speed_oracle import prompt_gains

    rng = np.random.default_rng(5)
    pid, pos, t0, t1 = [], [], [], []
    for p in range(6):
        rows = int(rng.integers(10, 20))
        pid += [f"p{p}"] * rows
        pos += list(range(7, 7 + rows))
        t0 += rng.integers(1, 7, rows).tolist()
        t1 += (rng.integers(1, 4, rows) if p % 2 else rng.integers(1, 7, rows)).tolist()
    cols = {"prompt_id": np.array(pid), "category": np.array(["math"] * len(pid)), "position": np.array(pos),
            "tau_0": np.array(t0), "tau_1": np.array(t1)}
    prof = _profile(dflash=1.3, eagle3=0.8)
    assert speed_oracle(cols, KINDS, prof, every=True)["categories"]["math"]["oracle_gain"] > 0
    gains = prompt_gains(cols, KINDS, prof, every=True)["math"]
    assert len(gains) == 6 and sum(e["share"] for e in gains) == pytest.approx(1.0)
    assert all(e["share"] >= -1e-12 for e in gains) and gains[0]["gain"] > 0
    slot0 = speed_oracle(cols, KINDS, prof, every=True)["categories"]["math"]["best_standalone"] == "slot0"
    for e in gains:
        sel = cols["prompt_id"] == e["prompt_id"]
        rows = {k: v[sel] for k, v in cols.items()}
        tok, _, _ = simulate(np.full(int(sel.sum()), slot0), rows, KINDS, (1.3, 0.8), prof, 0.0, every=True)
        assert e["tokens"] == tok
