"""whiflash-eval without decoding: presets, the latency profile (file, queries, profile at toy real shapes)
and calibrate's replay mode on a small synthetic router dataset."""
from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import pytest

from whiflash.errors import UsageError
from whiflash.eval.cli import bench_config, main, parse
from whiflash.latency import AFTER_PASS, LatencyProfile
from whiflash.eval.replay import simulate

CATEGORIES = ("code", "math")


pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------- presets


def test_preset_fills_ids_routers_and_thresholds() -> None:
    cfg = bench_config(parse(["bench", "--preset", "qwen3-8b", "--whiflash-router", "neural"])[0].bench)
    assert (cfg.model_name_or_path, cfg.draft_name_or_path, cfg.whiflash_eagle_draft) == (
        "Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "WhiFlash/Qwen3-8B-EAGLE3")
    assert cfg.whiflash_neural_router_path == "WhiFlash/Qwen3-8B-NeuralRouter-df-e3"
    assert (cfg.whiflash_neural_router_threshold, cfg.whiflash_entropy_threshold) == (0.5, 0.2)
    tree = bench_config(parse(["bench", "--preset", "qwen3-8b", "--whiflash-drafters", "ddt-e3",
                               "--ddtree-tree-budget", "128"])[0].bench)
    assert tree.whiflash_neural_router_path.endswith("ddt-e3-b128") and tree.whiflash_neural_router_threshold == 1.0
    e3 = bench_config(parse(["bench", "--preset", "qwen3-4b", "--speculative-algorithm", "EAGLE3"])[0].bench)
    assert e3.draft_name_or_path == "WhiFlash/Qwen3-4B-EAGLE3"  # upstream: the EAGLE-3 draft under EAGLE3


def test_explicit_flags_and_config_files_override_the_preset(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = bench_config(parse(["bench", "--preset", "qwen3-8b", "--model-name-or-path", "my/target",
                              "--whiflash-neural-router-threshold", "0.9"])[0].bench)
    assert cfg.model_name_or_path == "my/target" and cfg.whiflash_neural_router_threshold == 0.9
    assert cfg.whiflash_eagle_draft == "WhiFlash/Qwen3-8B-EAGLE3"
    (tmp_path / "c.yaml").write_text("preset: qwen3-8b\nwhiflash_entropy_threshold: 0.7\n")
    cfg = bench_config(parse(["bench", "--config", str(tmp_path / "c.yaml")])[0].bench)
    assert cfg.model_name_or_path == "Qwen/Qwen3-8B" and cfg.whiflash_entropy_threshold == 0.7
    with pytest.raises(SystemExit):
        main(["bench", "--preset", "qwen3-8b", "--print_config"])
    assert "model_name_or_path: Qwen/Qwen3-8B" in capsys.readouterr().out
    prof = parse(["profile", "--preset", "llama3.1-8b-instruct"])[0].profile
    assert prof.model_name_or_path == "meta-llama/Llama-3.1-8B-Instruct" and prof.whiflash_neural_router_path is None


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"--preset 'qwen9'.*llama3.1-8b-instruct, qwen3-4b, qwen3-8b"):
        parse(["bench", "--preset", "qwen9"])


# ---------------------------------------------------------------- the latency profile


def _profile(path: Path, **rounds: float) -> Path:
    prof = LatencyProfile(ar_step=1.0, verify={7: 1.2, 16: 1.5}, draft={"eagle3": 0.8, "dflash": 0.5},
                          round={"eagle3": 2.0, "dflash": 2.0, **rounds},
                          catchup={"eagle3": {1: 0.1, 4: 0.1, 64: 0.7}, "dflash": {1: 0.2, 64: 0.8}},
                          router={"entropy": 0.01, "neural": 0.05}, meta={"device": "cpu"})
    return prof.write(path)


def test_profile_file_round_trip_and_queries(tmp_path: Path) -> None:
    prof = LatencyProfile.read(_profile(tmp_path / "p.json", **{"ddtree-b7": 3.0}))
    assert prof.round_ms("ddtree", 7) == 3.0 and prof.round_ms("eagle3") == 2.0
    assert prof.catchup_ms("eagle3", 0) == 0.0 and prof.catchup_ms("eagle3", 4) == pytest.approx(0.1)
    assert prof.catchup_ms("eagle3", 34) == pytest.approx(0.4)  # linear between 4 and 64
    assert prof.catchup_ms("eagle3", 124) == pytest.approx(1.3)  # the last segment extended
    assert prof.catchup_ms("ddtree", 1) == 0.2  # DDTree catches up with its DFlash model
    assert prof.ratios()["round eagle3"] == 2.0 and "AR step 1.000 ms" in prof.table()
    with pytest.raises(ValueError, match=r"p.json: no round time for ddtree-b32.*--tree-budgets 32"):
        prof.round_ms("ddtree", 32)
    with pytest.raises(FileNotFoundError, match=r"--whiflash-latency-profile .*missing.json.*whiflash-eval profile"):
        LatencyProfile.read(tmp_path / "missing.json")
    (tmp_path / "other.json").write_text(json.dumps({"kind": "something-else"}))
    with pytest.raises(ValueError, match=r"other.json: expected a latency profile"):
        LatencyProfile.read(tmp_path / "other.json")


def test_profile_random_weights_at_toy_real_shapes(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from whiflash.folders import FolderKindError

    out = tmp_path / "p.json"
    assert main(["profile", "--preset", "qwen3-8b", "--random-weights", "--toy-widths", "--device", "cpu",
                 "--dtype", "float32", "--context", "40", "--repeats", "2", "--backlogs", "1,8",
                 "--tree-budgets", "4", "--loop-new-tokens", "6", "--out", str(tmp_path), "--output", str(out)]) == 0
    prof = LatencyProfile.read(out)
    assert set(prof.round) == {"eagle3", "dflash", "ddtree-b4"} and set(prof.verify) == {7, 16}
    assert set(prof.tree_verify) == {5} and set(prof.catchup["eagle3"]) == {1, 8} and set(prof.router) == {
        "entropy", "neural", "neural-after-pass"} and prof.router["neural-after-pass"] > 0
    assert prof.round["dflash"] == pytest.approx(prof.draft["dflash"] + prof.verify[16])
    assert prof.meta["models"]["random_weights"] == "qwen3-8b" and prof.meta["context"] == 40 and prof.floor > 0
    assert prof.meta["loop_prompts"] == 0 and prof.meta["loop_new_tokens"] == 6  # the flag holds after a random prompt
    (run,) = tmp_path.glob("*_profile-qwen3-8b")
    assert json.loads((run / "profile.json").read_text())["ratios"]["verify 7"] > 0
    assert json.loads((run / "manifest.json").read_text())["tool"] == "whiflash-eval profile"
    # the real loop's wall ms a round, AR, each chain drafter and DDTree at its budget, and what the host adds
    # to the components
    assert set(prof.meta["loop_round_wall_ms"]) == set(prof.meta["loop_host_ms"]) == {
        "ar", "eagle3", "dflash", "ddtree-b4"}
    assert all(ms > 0 for ms in prof.meta["loop_round_wall_ms"].values())
    assert all(ms >= 0 for ms in prof.meta["loop_host_ms"].values())
    # and each chain drafter's round as a slot of a routed drafter that always picks it
    assert set(prof.meta["loop_routed_round_wall_ms"]) == {"eagle3", "dflash"}
    assert all(ms > 0 for ms in prof.meta["loop_routed_round_wall_ms"].values())
    assert prof.meta["loop_routed_decision"] == "neural"  # a random-weights router decides inside the pass
    printed = capsys.readouterr().out
    assert "AR step" in printed and "loop round dflash (wall)" in printed and "loop round routed eagle3" in printed
    with pytest.raises(ValueError, match="--random-weights needs --preset"):
        main(["profile", "--random-weights", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="--context 50000: the target has 40960 positions"):
        main(["profile", "--preset", "qwen3-8b", "--random-weights", "--toy-widths", "--device", "cpu",
              "--context", "50000", "--repeats", "1", "--out", str(tmp_path)])
    loaded = []
    monkeypatch.setattr("whiflash.eval.profile._load", lambda cfg: loaded.append(cfg))  # nothing may be profiled
    with pytest.raises(FolderKindError, match=rf"--out {run}: is a whiflash-eval run"):
        main(["profile", "--preset", "qwen3-8b", "--random-weights", "--out", str(run)])
    with pytest.raises(ValueError, match=rf"--output {tmp_path}: is a folder; expected the path of a JSON file"):
        main(["profile", "--preset", "qwen3-8b", "--random-weights", "--out", str(tmp_path), "--output", str(tmp_path)])
    assert not loaded


def test_profile_times_the_loop_on_real_decodes_of_a_testbeds_prompts(micro: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from whiflash.decoding import loop

    decoded: list[int] = []
    real = loop.generate

    def spy(target, drafter, ids, max_new_tokens, **kw):
        decoded.append(len(ids))
        return real(target, drafter, ids, max_new_tokens, **kw)

    monkeypatch.setattr("whiflash.generate", spy)
    out = tmp_path / "p.json"
    assert main(["profile", "--testbed", str(micro), "--device", "cpu", "--dtype", "float32", "--context", "48",
                 "--repeats", "2", "--backlogs", "1,8", "--loop-prompts", "1", "--loop-new-tokens", "12",
                 "--out", str(tmp_path), "--output", str(out)]) == 0
    prof = LatencyProfile.read(out)
    assert prof.meta["loop_prompts"] == 4 and prof.meta["loop_new_tokens"] == 12  # 1 a category (micro has no dev
    # pool: its heldout prompts)
    assert set(prof.meta["loop_round_wall_ms"]) == {"ar", "eagle3", "dflash", "ddtree-b3"}
    assert set(prof.meta["loop_routed_round_wall_ms"]) == {"eagle3", "dflash"}
    # every method decoded the 4 prompts, each cut to the context: 6 methods x (a warm-up + 3 repeats x 4)
    assert len(decoded) == 6 * (1 + 3 * 4) and max(decoded) <= 48 and len(set(decoded)) > 1
    with pytest.raises(UsageError, match="--loop-prompts: the dev prompts come from a built testbed"):
        main(["profile", "--preset", "qwen3-8b", "--loop-prompts", "2", "--out", str(tmp_path)])
    with pytest.raises(UsageError, match="--loop-prompts: random weights accept nothing on real prompts"):
        main(["profile", "--preset", "qwen3-8b", "--random-weights", "--testbed", str(micro), "--loop-prompts", "1",
              "--out", str(tmp_path)])
    with pytest.raises(UsageError, match="--loop-prompts: expected an integer >= 0"):
        main(["profile", "--testbed", str(micro), "--loop-prompts", "-1", "--out", str(tmp_path)])
    with pytest.raises(UsageError, match="--loop-new-tokens: expected an integer >= 2"):
        main(["profile", "--testbed", str(micro), "--loop-new-tokens", "1", "--out", str(tmp_path)])


def test_the_host_share_of_a_loop_round_is_its_wall_time_less_its_components() -> None:
    from whiflash.eval.profile import host_ms

    prof = LatencyProfile(ar_step=1.0, round={"dflash": 2.0, "eagle3": 1.5},
                          catchup={"dflash": {4: 0.3, 1: 0.1}, "eagle3": {}})
    host = host_ms(prof, {"ar": 1.25, "dflash": 2.5, "eagle3": 1.25})
    assert host == pytest.approx({"ar": 0.25, "dflash": 0.4, "eagle3": 0.0})  # smallest backlog; never below 0
    # the consumers price a round with its host share, from the profile's JSON too (DDTree: DFlash's where the
    # profile has no loop row of its budget, else its own, less DFlash's catch-up, which DDTree's rounds pay)
    prof.round["ddtree-b7"], prof.round["ddtree-b15"] = 3.0, 3.0
    prof.meta["loop_host_ms"] = {**host, **host_ms(prof, {"ddtree-b15": 4.0})}
    back = LatencyProfile.from_json(json.loads(json.dumps(prof.to_json())))
    assert back.round_ms("dflash") == pytest.approx(2.4) and back.round_ms("eagle3") == pytest.approx(1.5)
    assert back.round_ms("ddtree", 7) == pytest.approx(3.4) and back.ar_ms() == pytest.approx(1.25)
    assert back.round_ms("ddtree", 15) == pytest.approx(3.9)
    assert LatencyProfile(ar_step=1.0, round={"dflash": 2.0}).round_ms("dflash") == 2.0  # no loop rows: components


def test_a_routed_round_costs_what_routing_added_to_the_loop_round() -> None:
    prof = LatencyProfile(ar_step=1.0, round={"dflash": 2.0, "eagle3": 1.5, "ddtree-b7": 3.0},
                          meta={"loop_round_wall_ms": {"ar": 1.0, "dflash": 2.0, "eagle3": 1.5},
                                "loop_routed_round_wall_ms": {"dflash": 1.9, "eagle3": 1.9}})
    back = LatencyProfile.from_json(json.loads(json.dumps(prof.to_json())))
    assert back.routed_extra_ms("eagle3") == pytest.approx(0.4) and back.routed_extra_ms("dflash") == 0.0  # >= 0
    assert back.round_ms("eagle3", routed=True) == pytest.approx(1.9) and back.round_ms("eagle3") == 1.5
    back.meta["loop_routed_round_wall_ms"]["dflash"] = 2.25  # DDTree's round pays DFlash's routing
    assert back.round_ms("ddtree", 7, routed=True) == pytest.approx(3.25)
    assert "loop round routed eagle3" in back.table() and "pair +0.400 beside the decision" in back.table()
    assert LatencyProfile(ar_step=1.0, round={"eagle3": 1.5}).round_ms("eagle3", routed=True) == 1.5  # no rows
    # the routed loop decided every round: that decision is the replay's to add, where its policy makes one
    back.router = {"neural": 0.15, AFTER_PASS: 0.3}
    assert back.routed_extra_ms("eagle3") == pytest.approx(0.25)
    back.meta["loop_routed_decision"] = AFTER_PASS  # a profile made with a router that decides after the pass
    assert back.routed_extra_ms("eagle3") == pytest.approx(0.1)
    again = LatencyProfile.from_json(json.loads(json.dumps(back.to_json())))
    assert again.routed_extra_ms("eagle3") == pytest.approx(0.1) and again.routed_extra_ms("dflash") == 0.0
    bad = prof.to_json()
    bad["loop_routed_round_wall_ms"] = {"eagle3": "fast"}
    with pytest.raises(ValueError, match=r"p.json: 'loop_routed_round_wall_ms' must map drafter kinds to milliseconds"):
        LatencyProfile.from_json(bad, "p.json")


# ---------------------------------------------------------------- calibrate --replay


def test_replay_costs_rounds_catch_up_and_router() -> None:
    """One prompt of three rounds (slot 0, 0, 1), pending at position 10: each round costs the router,
    the slot's round and its catch-up of the rows since it last drafted (the prompt's 10 rows none: every
    drafter took them in during the prefill, which the bench does not time)."""
    prof = LatencyProfile(ar_step=1.0, round={"dflash": 2.0, "eagle3": 1.0},
                          catchup={"dflash": {1: 0.1, 10: 1.0}, "eagle3": {1: 0.1, 10: 1.0}})
    cols = {"prompt_id": np.array(["p"] * 3), "position": np.array([10, 14, 17]),
            "tau_0": np.array([4, 3, 1]), "tau_1": np.array([1, 1, 2])}
    tokens, ms, rounds = simulate(np.array([True, True, False]), cols, ("dflash", "eagle3"), (2.0, 1.0), prof, 0.5)
    # dflash: backlog 0, then 4 (0.4); eagle3 at position 17: backlog 7 (0.1 + 6 * 0.1)
    assert (tokens, rounds) == (4 + 3 + 2, 3)
    assert ms == pytest.approx(3 * 0.5 + 2.0 + (2.0 + 0.4) + (1.0 + 0.7))
    # Without Lazy Catch-up the other model catches up every round as well: eagle3 backlog 0 in round 1,
    # 4 in round 2; dflash 3 in round 3.
    _, eager, _ = simulate(np.array([True, True, False]), cols, ("dflash", "eagle3"), (2.0, 1.0), prof, 0.5,
                           lazy=False)
    assert eager == pytest.approx(3 * 0.5 + 2.0 + (2.0 + 0.4 + 0.4) + (1.0 + 0.3 + 0.3))


@pytest.fixture(scope="module")
def router_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from whiflash.train.synthetic import write_synthetic_dataset

    out = tmp_path_factory.mktemp("data") / "rows"
    write_synthetic_dataset(out, num_prompts=8, rounds_per_prompt=12, hidden_size=16, categories=CATEGORIES,
                            progress=False)
    return out


def test_calibrate_replay_writes_thresholds_bench_reads(router_data: Path, tmp_path: Path) -> None:
    from whiflash.eval.bench import read_thresholds

    prof, out = _profile(tmp_path / "p.json"), tmp_path / "thr.json"
    assert main(["calibrate", "--replay", str(router_data), "--latency-profile", str(prof), "--thresholds",
                 "1e-9,1,1000,inf,-inf", "--output", str(out), "--out", str(tmp_path)]) == 0
    thr = read_thresholds(str(out))["whiflash-entropy"]
    assert thr["method"] == "whiflash-entropy" and thr["mode"] == "replay" and set(thr["thresholds"]) == set(CATEGORIES)
    assert thr["rounds"] == 8 * 12 and len(thr["samples"]) == 8 and thr["slots"] == ["dflash", "eagle3"]
    for d in thr["details"].values():
        assert set(d["sweep"]) == {"1e-09", "1.0", "1000.0", "inf", "-inf"} and d["speedup"] == max(d["sweep"].values())
        # an infinite threshold is that slot's drafter alone; a finite one that always picks it still pays its decisions
        assert d["sweep"]["inf"] == pytest.approx(d["fixed"]["slot0"]) and d["sweep"]["-inf"] == pytest.approx(
            d["fixed"]["slot1"])
        assert d["sweep"]["1000.0"] < d["sweep"]["inf"] and d["sweep"]["1e-09"] < d["sweep"]["-inf"]
        # the speed oracle bounds every routing; the share is the router's part of its gain over the better drafter
        best, oracle = d["best_standalone_tokens_per_second"], d["speed_oracle_tokens_per_second"]
        assert oracle >= d["tokens_per_second"] and oracle >= best and d["best_standalone"] in ("slot0", "slot1")
        assert d["share_of_speed_oracle_gain"] == pytest.approx((d["tokens_per_second"] - best) / (oracle - best))
        assert d["speed_oracle_gain"] == pytest.approx(oracle / best - 1)
    assert thr["overall"]["speed_oracle_tokens_per_second"] > 0 and "Dinkelbach" in thr["speed_oracle_definition"]
    assert thr["default"] in (1e-9, 1.0, 1000.0, math.inf, -math.inf)
    manifest = json.loads((Path(thr["run"]) / "manifest.json").read_text())  # a typed run folder
    assert manifest["kind"] == "whiflash.eval" and manifest["tool"] == "whiflash-eval calibrate --replay"


def test_a_min_gain_pins_the_faster_drafter_where_routing_gains_less(router_data: Path, tmp_path: Path) -> None:
    """`calibrate --replay --min-gain G`: a category keeps its fastest finite threshold only where that is at least
    G faster than the faster drafter alone, else it pins that drafter; the sweep itself is unchanged."""
    prof, grid = _profile(tmp_path / "p.json"), "1e-9,0.5,1,2,inf,-inf"
    picks = {}
    for gain in ("0", "0.5"):
        out = tmp_path / f"thr_{gain}.json"
        assert main(["calibrate", "--replay", str(router_data), "--latency-profile", str(prof), "--thresholds", grid,
                     "--min-gain", gain, "--output", str(out), "--out", str(tmp_path)]) == 0
        picks[gain] = json.loads(out.read_text())
    free, held = picks["0"], picks["0.5"]
    assert held["min_gain"] == 0.5 and free["min_gain"] == 0.0
    routed = [c for c, t in free["thresholds"].items() if not math.isinf(t)]
    assert routed, "no category routes at min gain 0: pick a grid where one does"
    assert held["thresholds"] != free["thresholds"], "no category's gain falls short of 50%: raise --min-gain"
    for cat, d in free["details"].items():
        alone = max(d["sweep"]["inf"], d["sweep"]["-inf"])
        assert held["details"][cat]["sweep"] == d["sweep"]
        if cat in routed and d["speedup"] < 1.5 * alone:  # a finite pick short of the margin: the drafter pinned
            assert held["thresholds"][cat] == (math.inf if d["sweep"]["inf"] >= d["sweep"]["-inf"] else -math.inf)
            assert held["details"][cat]["speedup"] == pytest.approx(alone)
        else:
            assert held["thresholds"][cat] == free["thresholds"][cat]
    with pytest.raises(ValueError, match="--min-gain: expected a share >= 0"):
        main(["calibrate", "--replay", str(router_data), "--latency-profile", str(prof), "--min-gain", "-1",
              "--out", str(tmp_path / "bad")])
    assert not (tmp_path / "bad").exists()  # refused before anything is written


def test_a_replayed_policy_pays_the_routed_rounds_the_drafters_alone_do_not(router_data: Path,
                                                                          tmp_path: Path) -> None:
    plain, routed = _profile(tmp_path / "plain.json"), tmp_path / "routed.json"
    prof = LatencyProfile.read(plain)
    prof.meta.update(loop_round_wall_ms={"dflash": 2.0, "eagle3": 2.0},
                     loop_routed_round_wall_ms={"dflash": 2.2, "eagle3": 2.5})
    prof.write(routed)
    grid = "1e-9,1,inf,-inf"
    for name, path in (("plain", plain), ("routed", routed)):
        assert main(["calibrate", "--replay", str(router_data), "--latency-profile", str(path), "--thresholds", grid,
                     "--output", str(tmp_path / f"{name}_thr.json"), "--out", str(tmp_path)]) == 0
    a, b = (json.loads((tmp_path / f"{n}_thr.json").read_text())["details"] for n in ("plain", "routed"))
    for cat in a:
        assert b[cat]["fixed"] == pytest.approx(a[cat]["fixed"])  # a drafter alone decides nothing
        assert b[cat]["speed_oracle_tokens_per_second"] == pytest.approx(a[cat]["speed_oracle_tokens_per_second"])
        for v in ("inf", "-inf"):
            assert b[cat]["sweep"][v] == pytest.approx(a[cat]["sweep"][v])
        for v in ("1e-09", "1.0"):
            assert b[cat]["sweep"][v] < a[cat]["sweep"][v]


def test_calibrate_replay_neural_and_refusals(router_data: Path, tmp_path: Path) -> None:
    from whiflash.router import NeuralRouter, export_single_file

    prof = _profile(tmp_path / "p.json")
    router = export_single_file(NeuralRouter(hidden_size=16, mlp_dim=8), tmp_path / "r.safetensors")
    out = tmp_path / "neural.json"
    assert main(["calibrate", "--replay", str(router_data), "--latency-profile", str(prof),
                 "--calibrate-method", "whiflash-neural", "--whiflash-neural-router-path", str(router),
                 "--thresholds=-inf,-100,0,100", "--output", str(out), "--out", str(tmp_path)]) == 0
    thr = json.loads(out.read_text())
    assert thr["method"] == "whiflash-neural" and set(thr["thresholds"]) == set(CATEGORIES)
    for d in thr["details"].values():  # a predicted gain above -100 everywhere: always slot 0, paying its decisions
        assert d["sweep"]["-inf"] == pytest.approx(d["fixed"]["slot0"]) and d["sweep"]["-100.0"] < d["sweep"]["-inf"]
    with pytest.raises(ValueError, match="--replay needs --latency-profile"):
        main(["calibrate", "--replay", str(router_data), "--out", str(tmp_path)])
    with pytest.raises(ValueError, match=rf"--output {tmp_path}: is a folder"):  # before the replay, not after
        main(["calibrate", "--replay", str(router_data), "--latency-profile", str(prof), "--output", str(tmp_path),
              "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="needs --whiflash-neural-router-path"):
        main(["calibrate", "--replay", str(router_data), "--latency-profile", str(prof), "--calibrate-method",
              "whiflash-neural", "--out", str(tmp_path)])
    bad = LatencyProfile.read(prof)
    bad.round.pop("eagle3")
    with pytest.raises(ValueError, match=r"no round time for eagle3"):
        main(["calibrate", "--replay", str(router_data), "--latency-profile", str(bad.write(tmp_path / "b.json")),
              "--out", str(tmp_path)])


def test_neural_replay_leaves_out_the_prompts_the_router_was_trained_on(router_data: Path, tmp_path: Path) -> None:
    """training_prompts.json beside a router export: those prompts' rows are not replayed; all of them: an error."""
    import pyarrow.parquet as pq

    from whiflash.router import NeuralRouter, export_single_file, write_training_prompts

    prof, out = _profile(tmp_path / "p.json"), tmp_path / "thr.json"
    ids = sorted(set(pq.read_table(sorted(router_data.glob("shard-*.parquet")), columns=["prompt_id"])
                     .column("prompt_id").to_pylist()))
    router = export_single_file(NeuralRouter(hidden_size=16, mlp_dim=8), tmp_path / "r" / "router.safetensors")
    args = ["calibrate", "--replay", str(router_data), "--latency-profile", str(prof), "--calibrate-method",
            "whiflash-neural", "--whiflash-neural-router-path", str(router), "--thresholds=-inf,0,inf",
            "--output", str(out), "--out", str(tmp_path)]
    assert main(args) == 0 and json.loads(out.read_text())["samples"] == ids  # no record: every row
    write_training_prompts(router.parent, ids[2:], "sha")
    assert main(args) == 0
    thr = json.loads(out.read_text())
    assert thr["samples"] == ids[:2] and thr["excluded_training_prompts"] == len(ids) - 2 and thr["rounds"] == 2 * 12
    write_training_prompts(router.parent, ids, "sha")
    with pytest.raises(ValueError, match=r"every prompt of it is one the router .* was trained on"):
        main(args)
    (router.parent / "training_prompts.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"training_prompts.json: expected"):
        main(args)


def test_calibrate_replay_of_a_bench_runs_own_prompts(router_data: Path, tmp_path: Path) -> None:
    """`--replay-run RUN`: only the rows of the run's prompts are replayed (its manifest's sample ids)."""
    import pyarrow.parquet as pq

    from whiflash.errors import UsageError

    prof, out = _profile(tmp_path / "p.json"), tmp_path / "thr.json"
    ids = sorted(set(pq.read_table(sorted(router_data.glob("shard-*.parquet")), columns=["prompt_id"])
                     .column("prompt_id").to_pylist()))
    run = tmp_path / "bench"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"samples": [{"id": i, "category": "?"} for i in [*ids[:3], "x"]]}))
    assert main(["calibrate", "--replay", str(router_data), "--latency-profile", str(prof), "--replay-run", str(run),
                 "--thresholds", "1,inf,-inf", "--output", str(out), "--out", str(tmp_path)]) == 0
    thr = json.loads(out.read_text())
    assert thr["samples"] == ids[:3] and thr["rounds"] == 3 * 12
    (run / "manifest.json").write_text(json.dumps({"samples": [{"id": "elsewhere"}]}))
    with pytest.raises(ValueError, match=r"--replay-run: none of its 1 samples are among the prompts of"):
        main(["calibrate", "--replay", str(router_data), "--latency-profile", str(prof), "--replay-run", str(run),
              "--out", str(tmp_path)])
    with pytest.raises(ValueError, match=rf"--replay-run {tmp_path}: .*lists no samples"):
        main(["calibrate", "--replay", str(router_data), "--latency-profile", str(prof), "--replay-run",
              str(tmp_path), "--out", str(tmp_path)])
    with pytest.raises(UsageError, match="--replay-run RUN goes with --replay"):
        main(["calibrate", "--replay-run", str(run), "--out", str(tmp_path)])


def test_profile_script_smoke_prints_the_engine_options_and_their_goals() -> None:
    """scripts/profile_shapes.py on the CPU at toy widths: the engine-option tables and the summary."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "scripts/profile_shapes.py", "--smoke", "--ctx", "32", "--models", "qwen3-8b",
                           "--options-only"], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    for name in ("sdpa", "decode-kernel", "decode-kernel+compile", "engine figures against their goals"):
        assert name in done.stdout, name


def test_profile_summary_reads_each_figure_from_its_table() -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "profile_shapes.py"
    spec = importlib.util.spec_from_file_location("profile_shapes", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    variant = {"ar_ms": 6.0, "verify16_ms": 6.6, "ar_kernels": 600}
    result = {"model": "m", "layers": 4, "floor_ms": 3.0, "ar_graph_gpu_ms": 8.0,
              "variants": {"sdpa": variant, "decode-kernel": variant, "decode-kernel+compile": variant,
                           "decode-kernel+compile+gemv": dict(variant, ar_ms=4.5, ar_kernels=400)},
              "loop": {"ar": {"outside_kernels": 0.1, "graph_round_ms": 8.0}, "eagle3": {"outside_kernels": 0.2}},
              "profile": {"widths": {"eagle3": 5},
                          "ms": {"ar_step": 8.0, "verify": {"16": 8.8}, "draft": {"eagle3": 4.0},
                                 "round": {"eagle3": 10.0, "dflash": 10.0},
                                 "catchup": {"eagle3": {"4": 0.5, "64": 1.0}, "dflash": {"4": 0.3, "64": 0.4}}}}}
    table = script.summary_table([result])
    lines = {line[:38].strip(): line[38:].strip() for line in table.splitlines()[2:]}
    assert lines["AR step, defaults, ms (x floor)"] == "8.00 = 2.67x"
    assert lines["verify 16 / AR, defaults"] == "1.10" and lines["verify 16 / AR, compiled + GEMV"] == "1.47"
    assert lines["AR step, compiled + GEMV"] == "4.50 = 1.50x" and lines["kernels per step: SDPA / all options"] == "600 / 400"
    assert lines["round outside GPU kernels"] == "10.0%-20.0%"
    # width 5: a chain of 4, whose first step ends the catch-up; the draft's 4 ms are 3 steps, a layer 2 ms
    assert lines["EAGLE-3 step / target layer"] == "0.67"
    assert lines["catch-up / round, EAGLE-3 n=64"] == "10.0%" and lines["catch-up / round, DFlash n<=16"] == "3.0%"
    assert lines["attention 1 row, us: SDPA / kernel"] == "-"  # not measured for this model


def _bench_routing() -> Any:
    """scripts/bench_routing.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_routing", Path(__file__).resolve().parents[1] / "scripts/bench_routing.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_bench_routing_times_a_testbeds_trained_models_on_its_test_prompts(micro: Path, tmp_path: Path) -> None:
    """scripts/bench_routing.py --testbed: every routed variant beside its standalone drafter, on real prompts,
    lossless (the diagnostics take the pair's taps or DFlash's backlog away from a slot-1 router); `--profile`
    writes each profiled method's round figures, operator tables and a first-prompt trace."""
    script = _bench_routing()
    rows, mismatches = script.measure_testbed(micro, "code", 1, "cpu", torch.float32, 8, 1, tmp_path / "prof")
    by = {r["method"]: r for r in rows}
    assert {"ar", "eagle3", "dflash", "neural-1", "neural-1-own-taps", "neural-1-no-backlog", "ddtree"} <= set(by)
    assert mismatches == 0 and all(r["ms_per_round"] > 0 for r in rows)
    # the diagnostics draft as EAGLE-3 alone does
    assert by["neural-1-own-taps"]["rounds"] == by["neural-1-no-backlog"]["rounds"] == by["eagle3"]["rounds"]
    profiled = {r["method"]: r for r in json.loads((tmp_path / "prof" / "profile.json").read_text())}
    assert set(profiled) == set(script.PROFILED)
    for name, r in profiled.items():  # the profiled decode takes the rounds the timed one took
        assert r["rounds"] == by[name]["rounds"] and r["wall_ms_per_round"] > 0, name
        assert "aten::" in (tmp_path / "prof" / f"profile_{name}.txt").read_text()
        with gzip.open(tmp_path / "prof" / f"trace_{name}.json.gz", "rt") as f:
            assert json.load(f)["traceEvents"], name


def test_bench_routing_counts_every_method_where_the_drafters_tap_different_layers(tmp_path: Path) -> None:
    """scripts/bench_routing.py --launches at `tiny`'s layers (EAGLE-3 and DFlash tap different layers): every
    method decodes, the slot-1 diagnostics included (their DFlash member never drafts, so it does not take in the
    prompt either, whose commit holds EAGLE-3's taps only); a routed round pinned to a slot runs its drafter's
    passes, a kept round dispatches no more than a decided one, a switch every round at most two operators more
    than the two slots pinned (the member that takes over joins the two commits it catches up: features and
    tokens), DDTree one pass more than DFlash (its tree)."""
    script = _bench_routing()
    folder = script.testbed_shapes("tiny", tmp_path / "tiny")
    eagle3, dflash = (json.loads((folder / p / "config.json").read_text()) for p in ("eagle3", "dflash"))
    assert eagle3["eagle_config"]["eagle_aux_hidden_state_layer_ids"] != dflash["dflash_config"]["target_layer_ids"]
    by = {r["method"]: r for r in script.count_launches("tiny", "cpu", torch.float32, 6, 16, str(folder), toy=True)}
    assert set(by) == {"ar", "dflash", "eagle3", "ddtree", "sticky-0", "neural-1-own-taps", "neural-1-no-backlog",
                       "switching"} | {f"{kind}-{slot}" for kind in ("fixed", "neural", "neural-after", "scripted")
                                       for slot in (0, 1)}
    assert all(r["rounds"] == 4 for r in by.values())  # random drafts: one token a round after the prefill's
    for name, alone in (("neural-0", "dflash"), ("neural-1", "eagle3"), ("neural-1-own-taps", "eagle3")):
        assert by[name]["passes_per_round"] == by[alone]["passes_per_round"], name
    assert by["sticky-0"]["ops_per_round"] <= by["neural-0"]["ops_per_round"]
    pinned = (by["scripted-0"]["ops_per_round"] + by["scripted-1"]["ops_per_round"]) / 2
    assert pinned < by["switching"]["ops_per_round"] <= pinned + 2
    assert set(by["switching"]["extra_vs_standalone"]) == {"cat"}
    assert by["ddtree"]["passes_per_round"] == by["dflash"]["passes_per_round"] + 1


def test_a_confidence_keeps_a_routing_threshold_only_where_its_prompts_show_the_gain(router_data: Path,
                                                                                      tmp_path: Path) -> None:
    """`calibrate --replay --min-gain-confidence P`: a category keeps its fastest finite threshold only where the
    paired bootstrap over its prompts puts the gain over the faster drafter alone above 0 with probability P (the
    bound is written beside the pick), else it pins that drafter; the sweep is unchanged, a bad P is named."""
    prof, grid = _profile(tmp_path / "p.json"), "1e-9,0.5,1,2,inf,-inf"
    picks = {}
    for p in ("0", "0.9", "0.999999"):
        out = tmp_path / f"thr_{p}.json"
        assert main(["calibrate", "--replay", str(router_data), "--latency-profile", str(prof), "--thresholds", grid,
                     "--min-gain-confidence", p, "--output", str(out), "--out", str(tmp_path)]) == 0
        picks[p] = json.loads(out.read_text())
    free = picks["0"]
    routed = [c for c, t in free["thresholds"].items() if not math.isinf(t)]
    assert routed and free["min_gain_confidence"] == 0 and all("gain_lower_bound" not in d
                                                               for d in free["details"].values())
    for p in ("0.9", "0.999999"):
        held = picks[p]
        assert held["min_gain_confidence"] == float(p)
        for cat, d in free["details"].items():
            mine = held["details"][cat]
            assert mine["sweep"] == d["sweep"]
            if cat not in routed:
                assert mine["threshold"] == d["threshold"] and "gain_lower_bound" not in mine
                continue
            low = mine["gain_lower_bound"][str(d["threshold"])]  # the free pick, tested against the drafter alone
            assert mine["threshold"] == (d["threshold"] if low > 0 else max((math.inf, -math.inf),
                                                                            key=lambda t: d["sweep"][str(t)]))
    # 8 prompts cannot show any gain with near certainty: every category pins a drafter
    assert all(math.isinf(t) for t in picks["0.999999"]["thresholds"].values())
    with pytest.raises(ValueError, match="--min-gain-confidence: expected 0 .off. or a probability"):
        main(["calibrate", "--replay", str(router_data), "--latency-profile", str(prof), "--thresholds", grid,
              "--min-gain-confidence", "1", "--output", str(tmp_path / "bad.json"), "--out", str(tmp_path)])
    assert not (tmp_path / "bad.json").exists()


def test_a_decoded_calibration_pins_a_drafter_where_its_prompts_do_not_show_the_routing_gain() -> None:
    """`pick_thresholds` (calibrate's decoded mode) with a confidence: the same rule as the replay, on each
    sample's measured time per token, the threshold's decode and the drafter's paired by sample."""
    from whiflash.eval.calibrate import pick_thresholds

    def row(sample: str, threshold: float, seconds: float) -> dict:
        return {"category": "code", "method": f"whiflash-neural@{threshold:g}", "threshold": threshold,
                "sample": sample, "turn": 0, "decode_seconds": seconds, "new_tokens": 101, "taus": [2] * 50,
                "ar_decode_seconds": 1.0, "ar_new_tokens": 101, "speedup": 1.0 / seconds}

    # the routed threshold is 5% faster on average, by winning big on two prompts of twenty
    alone = [0.5] * 20
    routed = [0.125] * 2 + [(0.5 * 20 / 1.05 - 0.25) / 18] * 18
    rows = [row(f"s{i}", t, s) for i in range(20) for t, s in ((math.inf, alone[i]), (0.5, routed[i]))]
    assert pick_thresholds(rows)["code"]["threshold"] == 0.5
    held = pick_thresholds(rows, confidence=0.9)["code"]
    assert held["threshold"] == math.inf and held["gain_lower_bound"]["0.5"] < 0
    steady = [row(f"s{i}", t, s) for i in range(20) for t, s in ((math.inf, 0.5), (0.5, 0.5 / 1.05))]
    kept = pick_thresholds(steady, confidence=0.9)["code"]
    assert kept["threshold"] == 0.5 and kept["gain_lower_bound"]["0.5"] == pytest.approx(0.05)
