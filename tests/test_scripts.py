"""scripts/gpu_loop.sh: which steps a call runs, skips and stops before (the steps themselves run on a GPU)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("corpus", "tokenizer", "tokens", "target", "responses", "eagle3", "dflash", "acceptance")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def loop(log: Path, tb: Path, budget: int) -> list[str]:
    out = subprocess.run(["bash", str(ROOT / "scripts/gpu_loop.sh"), str(log), str(tb), str(budget)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [line for line in out.splitlines() if line.startswith("=== ")]


def finished_testbed(tb: Path, log: Path, stages: tuple[str, ...] = STAGES) -> None:
    """The outputs by which the loop tells each step is done, for both pairs."""
    tb.mkdir(parents=True)
    (tb / "manifest.json").write_text(json.dumps({"stages": {s: {"done": True} for s in stages}}))
    (tb / "profile.json").write_text("{}")
    log.mkdir()
    for pair, router in (("df-e3", "router"), ("ddt-e3", "router_ddt-e3")):
        for data in (f"router_data_{pair}", f"router_data_{pair}_test"):
            (tb / data).mkdir()
            (tb / data / "manifest.json").write_text("{}")
        (tb / router).mkdir()
        (tb / router / "config.json").write_text("{}")
        for name in (f"thresholds_{pair}.json", f"thresholds_neural_{pair}.json", f"thresholds_neural_prompts_{pair}.json"):
            (tb / name).write_text("{}")
        for tag in ("routed", "prompts", "t1", "t0"):
            (log / f"eval_{pair}_{tag}_results.md").write_text("|")


def test_a_finished_loop_runs_nothing(tmp_path: Path) -> None:
    finished_testbed(tmp_path / "tb", tmp_path / "log")
    lines = loop(tmp_path / "log", tmp_path / "tb", 600)
    assert all(line.endswith("done before") for line in lines[:-1]) and len(lines) == 20
    assert "=== router-test@df-e3: done before" in lines and "=== eval-routed@ddt-e3: done before" in lines
    assert "=== prompts-calibrate@df-e3: done before" in lines  # the first pair's only


def test_router_data_is_packed_once_into_parts_that_unpack_to_the_dataset(tmp_path: Path) -> None:
    finished_testbed(tmp_path / "tb", tmp_path / "log")
    (tmp_path / "tb/router_data_df-e3/shard-00000.parquet").write_bytes(os.urandom(40_000))
    env = {**os.environ, "PACK_DIR": str(tmp_path / "out")}
    run = lambda: subprocess.run(["bash", str(ROOT / "scripts/gpu_loop.sh"), str(tmp_path / "log"),  # noqa: E731
                                  str(tmp_path / "tb"), "60"], env=env, capture_output=True, text=True, check=True)
    assert "=== router_data_df-e3 packed into" in run().stdout
    parts = sorted((tmp_path / "out").glob("router_data_df-e3.tar.*"))
    assert [p.name for p in parts] == ["router_data_df-e3.tar.00"]
    assert (tmp_path / "out/router_data_ddt-e3_test.tar.00").is_file()  # every pair's datasets
    (tmp_path / "back").mkdir()
    subprocess.run(f"cat {' '.join(map(str, parts))} | tar xf - -C {tmp_path / 'back'}", shell=True, check=True)
    for name in ("manifest.json", "shard-00000.parquet"):
        back, there = tmp_path / "back/router_data_df-e3" / name, tmp_path / "tb/router_data_df-e3" / name
        assert back.read_bytes() == there.read_bytes()
    assert "packed" not in run().stdout  # once


def test_the_loop_stops_before_a_step_that_does_not_fit(tmp_path: Path) -> None:
    lines = loop(tmp_path / "log", tmp_path / "fresh", 5)  # nothing built; the target stage needs 330 s
    assert re.fullmatch(r"=== stop before build-target \([45]s left < 330s\): call again to go on", lines[0])


def test_after_the_routed_benches_come_the_budget_sweep_temperature_1_and_acceptance(tmp_path: Path) -> None:
    tb, log = tmp_path / "tb", tmp_path / "log"
    finished_testbed(tb, log, stages=STAGES[:-1])
    for tag in ("t0", "t1"):
        (log / f"eval_df-e3_{tag}_results.md").unlink()
    lines = loop(log, tb, 150)  # the sweep (200 s) does not fit; T = 1 (120 s) and acceptance are not tried before it
    assert lines[-2].startswith("=== stop before eval-t0") and "eval-t1" not in "".join(lines)
    assert "acceptance" not in "".join(lines)
    (log / "eval_df-e3_t0_results.md").write_text("|")
    env = {**os.environ, "DRY_RUN": "1"}
    out = subprocess.run(["bash", str(ROOT / "scripts/gpu_loop.sh"), str(log), str(tb), "150"], capture_output=True,
                         text=True, timeout=60, check=True, env=env).stdout
    assert re.search(r"=== would run: gpu_budget\.sh \S+ \S+ 1[45]\d eval-t1@df-e3:120", out)


def test_a_routed_bench_with_the_budget_sweep_and_the_oracle_stands_for_the_sweep(tmp_path: Path) -> None:
    tb, log = tmp_path / "tb", tmp_path / "log"
    finished_testbed(tb, log)
    (log / "eval_df-e3_t0_results.md").unlink()
    routed = log / "eval_df-e3_routed_results.md"
    routed.write_text("| code | ddtree-b16 | 8.37× |\n| code | ddtree-b32 | 8.20× |\n")
    assert "=== eval-t0@df-e3: done before" not in loop(log, tb, 150)  # no oracle beside the budgets: not the sweep
    routed.write_text(routed.read_text() + "| code | oracle | 6.72× |\n")
    assert "=== eval-t0@df-e3: done before" in loop(log, tb, 150)


def test_skipped_steps_are_neither_run_nor_waited_for(tmp_path: Path) -> None:
    tb, log = tmp_path / "tb", tmp_path / "log"
    finished_testbed(tb, log, stages=STAGES[:-1])
    for tag in ("prompts", "t1"):
        (log / f"eval_df-e3_{tag}_results.md").unlink()
    env = {**os.environ, "PAIRS": "df-e3", "SKIP": "eval-prompts,build-acceptance"}
    out = subprocess.run(["bash", str(ROOT / "scripts/gpu_loop.sh"), str(log), str(tb), "150"], capture_output=True,
                         text=True, timeout=60, check=True, env={**env, "DRY_RUN": "1"}).stdout
    assert "eval-prompts" not in out and "acceptance" not in out  # T = 1 no longer waits for the acceptance stage
    assert re.search(r"=== would run: gpu_budget\.sh \S+ \S+ 1[45]\d eval-t1@df-e3:120", out)


def test_an_unfinished_stage_and_a_router_older_than_its_data_are_not_done(tmp_path: Path) -> None:
    tb, log = tmp_path / "tb", tmp_path / "log"
    finished_testbed(tb, log, stages=STAGES[:-2])  # dflash (and acceptance) not built
    lines = loop(log, tb, 5)
    assert lines[:3] == [f"=== build-{s}: done before" for s in ("target", "responses", "eagle3")]
    assert lines[3].startswith("=== stop before build-dflash")
    (tb / "manifest.json").write_text(json.dumps({"stages": {s: {"done": True} for s in STAGES}}))
    data = tb / "router_data_df-e3/manifest.json"
    data.write_text("{}")  # written after the router: the router is stale
    router = tb / "router/config.json"
    stamp = data.stat().st_mtime
    os.utime(router, (stamp - 10, stamp - 10))
    lines = loop(log, tb, 5)
    assert "=== gs-router-data@df-e3: done before" in lines
    assert lines[lines.index("=== gs-router-data@df-e3: done before") + 1].startswith("=== stop before gs-router-train@df-e3")


def test_the_second_pair_loops_after_the_first_and_pairs_picks_them(tmp_path: Path) -> None:
    tb, log = tmp_path / "tb", tmp_path / "log"
    finished_testbed(tb, log)
    shutil.rmtree(tb / "router_data_ddt-e3")
    lines = loop(log, tb, 5)
    assert "=== eval-prompts@df-e3: done before" in lines
    assert lines[lines.index("=== eval-prompts@df-e3: done before") + 1].startswith(
        "=== stop before gs-router-data@ddt-e3 (")
    out = subprocess.run(["bash", str(ROOT / "scripts/gpu_loop.sh"), str(log), str(tb), "5"], capture_output=True,
                         text=True, timeout=60, check=True, env={**os.environ, "PAIRS": "df-e3"}).stdout
    assert "ddt-e3" not in out and "=== build-acceptance: done before" in out


def test_dagger_runs_after_calibration_and_its_round_0_router_counts_as_trained(tmp_path: Path) -> None:
    tb, log = tmp_path / "tb", tmp_path / "log"
    finished_testbed(tb, log)
    env = {**os.environ, "DAGGER": "1", "PAIRS": "df-e3"}
    run = lambda: [line for line in subprocess.run(  # noqa: E731
        ["bash", str(ROOT / "scripts/gpu_loop.sh"), str(log), str(tb), "5"], capture_output=True, text=True,
        timeout=60, check=True, env=env).stdout.splitlines() if line.startswith("=== ")]
    lines = run()
    i = lines.index("=== gs-calibrate@df-e3: done before")
    assert lines[i + 1].startswith("=== stop before dagger@df-e3 (")
    # cut after the round-0 router and thresholds were moved aside: the refit is dagger's, not gs-router-train's
    (tb / "router").rename(tb / "router_round0")
    (tb / "thresholds_neural_df-e3.json").rename(tb / "thresholds_neural_round0_df-e3.json")
    lines = run()
    assert {"=== gs-router-train@df-e3: done before", "=== gs-calibrate@df-e3: done before"} <= set(lines)
    assert lines[lines.index("=== gs-calibrate@df-e3: done before") + 1].startswith("=== stop before dagger@df-e3")
    (tb / "thresholds_neural_dagger_df-e3.json").write_text("{}")
    assert "=== dagger@df-e3: done before" in run()


def test_build_stages_that_fit_together_run_in_one_build_process(tmp_path: Path) -> None:
    """Build stages that fit share one build process, each adding its own estimate."""
    def dry(tb: Path, budget: int, **env: str) -> list[str]:
        out = subprocess.run(["bash", str(ROOT / "scripts/gpu_loop.sh"), str(tmp_path / "log"), str(tb), str(budget)],
                             capture_output=True, text=True, timeout=60, check=True,
                             env={**os.environ, "DRY_RUN": "1", **env})
        return [line for line in out.stdout.splitlines() if line.startswith("=== ")]

    lines = dry(tmp_path / "fresh", 540)  # target (330) + responses (80) fit, + eagle3 (140) does not
    assert lines[0] == "=== build-target to responses in one build process (410s estimate)"
    assert re.fullmatch(r"=== would run: gpu_budget\.sh \S+ \S+ 5[34]\d build-responses@df-e3:410", lines[1])
    assert lines[2] == "=== build-target did not finish: call again to go on"
    tb = tmp_path / "tb"
    tb.mkdir()
    (tb / "manifest.json").write_text(json.dumps({"stages": {s: {"done": True} for s in STAGES[:5]}}))
    assert "=== build-eagle3 to dflash in one build process (405s estimate)" in dry(tb, 410)
    assert dry(tb, 300)[-3].endswith(" build-eagle3@df-e3:140")  # alone where the two do not fit
    (tb / "manifest.json").write_text(json.dumps({"stages": {s: {"done": True} for s in STAGES[:6]}}))
    assert dry(tb, 150)[3].startswith("=== stop before build-dflash (")  # alone it takes its own estimate (265 s)


def test_a_chosen_tau_rule_gets_a_bench_of_its_own_after_the_routed_one(tmp_path: Path) -> None:
    """TAU_RULE=auto: eval-rule follows eval-routed, runs once calibrate chose a rule (TESTBED_DIR/tau_rule.txt) and
    is done when it chose none; without TAU_RULE=auto there is no such step."""
    tb, log = tmp_path / "tb", tmp_path / "log"
    finished_testbed(tb, log)
    assert not any("eval-rule" in line for line in loop(log, tb, 600))
    env = {**os.environ, "TAU_RULE": "auto", "PAIRS": "df-e3"}
    run = lambda: subprocess.run(["bash", str(ROOT / "scripts/gpu_loop.sh"), str(log), str(tb), "600"],  # noqa: E731
                                 capture_output=True, text=True, timeout=60, check=True, env={**env, "DRY_RUN": "1"}).stdout
    (tb / "tau_rule.txt").write_text("")
    assert "=== eval-rule@df-e3: done before" in run()
    (tb / "tau_rule.txt").write_text("5,2")
    out = run()
    assert re.search(r"=== would run: gpu_budget\.sh \S+ \S+ \d+ eval-rule@df-e3:120", out)
    assert out.index("eval-routed@df-e3: done before") < out.index("eval-rule@df-e3")
    (log / "eval_df-e3_rule_results.md").write_text("|")
    assert "=== eval-rule@df-e3: done before" in run()


@pytest.mark.parametrize("tau_rule,routed", [("auto", ""), ("5,2", "5,2"), ("", "")])
def test_only_routed_benches_take_a_tau_rule_and_only_eval_rule_the_chosen_one(tmp_path: Path, tau_rule: str,
                                                                               routed: str) -> None:
    """gpu_budget.sh hands TAU_RULE to the eval steps as each can take it: eval-t0 and eval-t1 (no routed method)
    never get one, eval-routed and eval-prompts an explicit ENTER,LEAVE but not `auto`, eval-rule always `auto`
    (the rule calibrate chose). Checked against a gpu_session.sh that prints what it was given."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy(ROOT / "scripts/gpu_budget.sh", scripts)
    (scripts / "gpu_session.sh").write_text('echo "given $3 ${EVAL_TAG:-} rule=${TAU_RULE:-}"\n')
    steps = ["eval-t0:1", "eval-t1:1", "eval-routed:1", "eval-prompts:1", "eval-rule:1"]
    out = subprocess.run(["bash", str(scripts / "gpu_budget.sh"), str(tmp_path / "log"), str(tmp_path / "tb"), "60",
                          *steps], capture_output=True, text=True, timeout=60, check=True,
                         env={**os.environ, "TAU_RULE": tau_rule}).stdout
    given = dict(line.split()[2:] for line in out.splitlines() if line.startswith("given eval"))
    assert given == {"_t0": "rule=", "_t1": "rule=", "_routed": f"rule={routed}", "_prompts": f"rule={routed}",
                     "_rule": "rule=auto"}


@pytest.mark.parametrize("decode, estimate", [("0", 60), ("1", 210)])
def test_a_replayed_calibration_is_budgeted_as_seconds_a_decoded_one_as_minutes(tmp_path: Path, decode: str,
                                                                               estimate: int) -> None:
    tb, log = tmp_path / "tb", tmp_path / "log"
    finished_testbed(tb, log)
    (tb / "thresholds_neural_df-e3.json").unlink()
    out = subprocess.run(["bash", str(ROOT / "scripts/gpu_loop.sh"), str(log), str(tb), "5"], capture_output=True,
                         text=True, timeout=60, check=True,
                         env={**os.environ, "PAIRS": "df-e3", "CALIBRATE_DECODE": decode}).stdout
    assert re.search(rf"=== stop before gs-calibrate@df-e3 \(\d+s left < {estimate}s\)", out)


def test_the_responses_benchmark_runs_between_the_target_and_the_responses_when_asked(tmp_path: Path) -> None:
    """RESPONSES_AB=1 puts bench-responses right after the target stage (it needs the built target and times the
    stage before it runs); without it the loop has no such step; its JSON marks it done."""
    tb = tmp_path / "tb"
    tb.mkdir()
    (tb / "manifest.json").write_text(json.dumps({"stages": {s: {"done": True} for s in STAGES[:4]}}))

    def dry(**env: str) -> list[str]:
        out = subprocess.run(["bash", str(ROOT / "scripts/gpu_loop.sh"), str(tmp_path / "log"), str(tb), "560"],
                             capture_output=True, text=True, timeout=60, check=True,
                             env={**os.environ, "DRY_RUN": "1", **env})
        return [line for line in out.stdout.splitlines() if line.startswith("=== ")]

    lines = dry(RESPONSES_AB="1")
    assert lines[:2] == ["=== build-target: done before", lines[1]]
    assert re.fullmatch(r"=== would run: gpu_budget\.sh \S+ \S+ 5[56]\d bench-responses@df-e3:150", lines[1])
    assert not any("bench-responses" in line for line in dry())
    (tmp_path / "log" / "bench_responses.json").write_text("{}")
    assert "=== bench-responses: done before" in dry(RESPONSES_AB="1")


def test_the_drafter_step_profile_runs_first_when_asked(tmp_path: Path) -> None:
    """PROFILE_DRAFTERS=1 puts profile-drafters before the build (it needs none); without it the loop has no such
    step; its JSON marks it done."""
    tb = tmp_path / "tb"
    tb.mkdir()

    def dry(**env: str) -> list[str]:
        out = subprocess.run(["bash", str(ROOT / "scripts/gpu_loop.sh"), str(tmp_path / "log"), str(tb), "560"],
                             capture_output=True, text=True, timeout=60, check=True,
                             env={**os.environ, "DRY_RUN": "1", **env})
        return [line for line in out.stdout.splitlines() if line.startswith("=== ")]

    assert re.fullmatch(r"=== would run: gpu_budget\.sh \S+ \S+ 5[56]\d profile-drafters@df-e3:60",
                        dry(PROFILE_DRAFTERS="1")[0])
    assert not any("profile-drafters" in line for line in dry())
    (tmp_path / "log").mkdir(exist_ok=True)
    (tmp_path / "log" / "drafter_step.json").write_text("{}")
    assert dry(PROFILE_DRAFTERS="1")[0] == "=== profile-drafters: done before"


def test_testbed_bars_read_off_a_bench_and_a_build(tmp_path: Path) -> None:
    """scripts/testbed_bars.py: each of the testbed's realism bars and the router's met or missed by its distance, from
    a bench results file and a testbed manifest; a file that is no bench result is refused by name."""
    def cell(speedup: float, tau: float, median: float | None = None) -> dict:
        return {"speedup": speedup, "speedup_median_ratio": speedup if median is None else median, "tau": tau}

    cells = {
        "code": {"ar": cell(1, 1), "eagle3": cell(2.0, 5.9), "dflash": cell(4.0, 12.0), "ddtree-b16": cell(3.9, 12.5),
                 "ddtree-b32": cell(4.2, 13.0), "oracle": cell(3.0, 13.5)},
        "prose": {"ar": cell(1, 1), "eagle3": cell(1.9, 3.5), "dflash": cell(1.38, 2.07, median=1.0),
                  "ddtree-b16": cell(1.5, 2.5), "ddtree-b32": cell(1.4, 2.6), "oracle": cell(1.2, 4.0)},
        "all": {"ar": cell(1, 1), "eagle3": cell(0.1, 1)},  # pooled over categories: not a category of its own
    }
    results = tmp_path / "results.json"
    cells["prose"]["whiflash-neural"] = cell(1.87, 3.3)
    gains = {"whiflash-neural": {"prose": {"vs_eagle3": -1.5, "vs_eagle3_ci": [-5.4, 2.9], "vs_dflash": 35.5,
                                           "vs_dflash_ci": [30.0, 41.0], "pinned": None}},
             "oracle": {"prose": {"vs_eagle3": -37.0, "vs_eagle3_ci": [-40.0, -30.0]}}}
    results.write_text(json.dumps({"cells": cells, "gains": gains}))
    tb = tmp_path / "tb"
    tb.mkdir()
    stages = {s: {"done": True, "seconds": 110.0} for s in ("corpus", "tokenizer", "tokens", "target", "responses",
                                                             "eagle3", "dflash")}
    (tb / "manifest.json").write_text(json.dumps({"stages": stages}))
    thresholds = tmp_path / "thresholds_neural_df-e3.json"  # a replayed calibration's per-category figures
    thresholds.write_text(json.dumps({"method": "whiflash-neural", "details": {
        "agentic": {"threshold": 2.0, "speed_oracle_gain": 0.185, "share_of_speed_oracle_gain": 0.33},
        "code": {"threshold": float("-inf"), "speed_oracle_gain": 0.049, "share_of_speed_oracle_gain": 0.0},
        "prose": {"threshold": 1.5, "speed_oracle_gain": 0.169, "share_of_speed_oracle_gain": 0.61}}}))
    out = subprocess.run([sys.executable, str(ROOT / "scripts/testbed_bars.py"), str(results), "--testbed", str(tb),
                          "--thresholds", str(thresholds)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    rows = {line.split(" | ")[0].lstrip("| "): line for line in out.splitlines() if line.startswith("| ")}
    assert "**no**" in rows["T=0 speedup of dflash > 1.5x"] and "prose -0.12" in rows["T=0 speedup of dflash > 1.5x"]
    assert "| yes |" in rows["T=0 speedup of eagle3 > 1.5x"]  # the pooled 'all' row is not a category
    assert "**no**" in rows["median per-prompt ratio of dflash / its speedup >= 0.8"]  # 1.0 of 1.38x: 0.72
    assert "**no**" in rows["tau eagle3 code 3..5"] and "+0.90" in rows["tau eagle3 code 3..5"]
    assert "**no**" in rows["tau dflash prose >= 3"] and "-0.93" in rows["tau dflash prose >= 3"]
    assert "| yes |" in rows["tau dflash code >= 5"] and "| yes |" in rows["eagle3 faster than dflash on prose"]
    assert "| yes |" in rows["oracle tau headroom >= x1.10 in >= 2 categories (bench)"]  # x1.12 code, x1.14 prose
    assert "ddtree-b32 4.20x vs 4.00x" in rows["DDTree (budget <= 64) faster than DFlash on code"]
    assert "**no**" in rows["build stages <= 12 min"] and "+0.8 min" in rows["build stages <= 12 min"]
    neural = rows["whiflash-neural >= the faster of its pair on prose"]  # the faster is EAGLE-3 there, not DFlash
    assert "**no**" in neural and "-1.5% (-5.4..+2.9) vs eagle3" in neural
    assert not any(bar.startswith("oracle >=") for bar in rows)  # an analysis bound, not a router
    share = "whiflash-neural share of the speed oracle's gain >= 0.5 on {} (replayed)"
    assert "**no**" in rows[share.format("agentic")] and "-0.17" in rows[share.format("agentic")]
    assert "| yes |" in rows[share.format("prose")] and "0.61 of +16.9%" in rows[share.format("prose")]
    assert share.format("code") not in rows  # the oracle gains under 5% there: no bar
    bad = subprocess.run([sys.executable, str(ROOT / "scripts/testbed_bars.py"), str(tb / "manifest.json")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "manifest.json: no 'cells'" in bad.stderr
    bad = subprocess.run([sys.executable, str(ROOT / "scripts/testbed_bars.py"), str(results), "--thresholds",
                          str(results)], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "results.json: not a replayed calibration's thresholds JSON" in bad.stderr
