"""whiflash-eval on the micro testbed: CLI parsing, bench outputs, lossless check, datasets, resume,
report and calibrate."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

import whiflash
from whiflash.decoding.stats import TAU_DEFINITION
from whiflash.eval.cli import bench_config, main, parse
from whiflash.eval.datasets import load_samples
from whiflash.eval.methods import method_names, model_paths
from whiflash.eval.metrics import aggregate, bootstrap_ci
from whiflash.eval.outputs import markdown_table
from whiflash.errors import UsageError
from whiflash.folders import FolderKindError
from whiflash.pairs import Pair
from whiflash.prompts import encode_chat

SHARED_PROMPTS = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "prompts"
FAST = ["--max-new-tokens", "12", "--warmup-tokens", "4", "--bootstrap", "200", "--dtype", "float32",
        "--device", "cpu"]

QUICK_START = {
    "neural-df-e3": """--speculative-algorithm WHIFLASH --model-name-or-path Qwen/Qwen3-8B
        --draft-name-or-path z-lab/Qwen3-8B-DFlash-b16 --whiflash-eagle-draft WhiFlash/Qwen3-8B-EAGLE3
        --whiflash-router neural --whiflash-neural-router-path WhiFlash/Qwen3-8B-NeuralRouter-df-e3
        --whiflash-neural-router-threshold 0.5 --dataset mt-bench --max-samples 10 --max-new-tokens 2048""",
    "neural-ddt-e3": """--speculative-algorithm WHIFLASH --model-name-or-path Qwen/Qwen3-8B
        --draft-name-or-path z-lab/Qwen3-8B-DFlash-b16 --whiflash-eagle-draft WhiFlash/Qwen3-8B-EAGLE3
        --whiflash-drafters ddt-e3 --ddtree-tree-budget 128 --whiflash-router neural
        --whiflash-neural-router-path WhiFlash/Qwen3-8B-NeuralRouter-ddt-e3-b128
        --whiflash-neural-router-threshold 1.0 --dataset mt-bench --max-samples 10 --max-new-tokens 2048""",
    "entropy": """--speculative-algorithm WHIFLASH --model-name-or-path Qwen/Qwen3-8B
        --draft-name-or-path z-lab/Qwen3-8B-DFlash-b16 --whiflash-eagle-draft WhiFlash/Qwen3-8B-EAGLE3
        --whiflash-router entropy --whiflash-entropy-threshold 0.2 --dataset mt-bench --max-samples 10
        --max-new-tokens 2048""",
}


pytestmark = pytest.mark.usefixtures("one_thread")


def _bench(tmp: Path, *extra: str) -> int:
    return main(["bench", "--out", str(tmp), *FAST, *extra])


def _run_dir(tmp: Path, name: str) -> Path:
    (run,) = sorted(tmp.glob(f"*_{name}"))
    return run


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- CLI


@pytest.mark.parametrize("which", list(QUICK_START))
def test_quick_start_commands_parse(which: str) -> None:
    ns, _ = parse(["bench", *QUICK_START[which].split()])
    cfg = bench_config(ns.bench)
    paths = model_paths(cfg.speculative_algorithm, cfg.model_name_or_path, cfg.draft_name_or_path,
                        cfg.whiflash_eagle_draft, None)
    assert paths == {"target": "Qwen/Qwen3-8B", "eagle3": "WhiFlash/Qwen3-8B-EAGLE3",
                     "dflash": "z-lab/Qwen3-8B-DFlash-b16"}
    assert (cfg.dataset, cfg.max_samples, cfg.max_new_tokens) == ("mt-bench", 10, 2048)
    assert not cfg.whiflash_no_lazy_catchup
    names = method_names(cfg.speculative_algorithm, cfg.methods, cfg.whiflash_router)
    pair = Pair.parse(cfg.whiflash_drafters)
    if which == "entropy":
        assert names == ["ar", "whiflash-entropy"] and cfg.whiflash_entropy_threshold == 0.2 and str(pair) == "df-e3"
    elif which == "neural-df-e3":
        assert names == ["ar", "whiflash-neural"] and cfg.whiflash_neural_router_threshold == 0.5
        assert cfg.whiflash_neural_router_path.endswith("df-e3") and not pair.uses_tree
    else:
        assert names == ["ar", "whiflash-neural"] and cfg.whiflash_neural_router_threshold == 1.0
        assert pair.uses_tree and pair.needs_eagle3 and cfg.ddtree_tree_budget == 128


def test_eagle3_algorithm_takes_draft_path_as_eagle3() -> None:
    ns, _ = parse(["bench", "--speculative-algorithm", "EAGLE3", "--draft-name-or-path", "e3-draft",
                   "--whiflash-no-lazy-catchup", "--methods", "eagle3,whiflash,dflash"])
    cfg = bench_config(ns.bench)
    assert model_paths("EAGLE3", "t", cfg.draft_name_or_path, None, None)["eagle3"] == "e3-draft"
    assert model_paths("DFLASH", "t", "df", None, None) == {"target": "t", "eagle3": None, "dflash": "df"}
    assert cfg.whiflash_no_lazy_catchup
    assert method_names("EAGLE3", cfg.methods, "oracle") == ["ar", "eagle3", "oracle", "dflash"]
    with pytest.raises(ValueError, match="--speculative-algorithm"):
        method_names("MEDUSA", None, "entropy")
    with pytest.raises(ValueError, match="--methods"):
        method_names("AR", "ar,medusa", "entropy")


def test_module_entry_point() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "whiflash.eval", "bench", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "--whiflash-neural-router-path" in done.stdout


def test_config_and_print_config(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--whiflash-drafters", "ddt-e3", "--max-samples", "3", "--print_config"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "whiflash_drafters: ddt-e3" in text and "max_samples: 3" in text
    cfg_file = tmp_path / "bench.yaml"
    cfg_file.write_text(text)
    ns, _ = parse(["bench", "--config", str(cfg_file), "--max-new-tokens", "7"])
    cfg = bench_config(ns.bench)
    assert (cfg.whiflash_drafters, cfg.max_samples, cfg.max_new_tokens) == ("ddt-e3", 3, 7)


# ---------------------------------------------------------------- bench on micro


@pytest.fixture(scope="module")
def bench_run(micro: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("eval")
    # --compile-layers on the CPU: ignored with a warning (it compiles the CUDA graphs' passes)
    code = _bench(out, "--testbed", str(micro), "--max-samples", "3", "--name", "all",
                  "--methods", "ar,eagle3,dflash,ddtree,whiflash-entropy,oracle", "--whiflash-time-catchup",
                  "--compile-layers")
    assert code == 0
    return _run_dir(out, "all")


def test_every_category_sees_every_method_order() -> None:
    from whiflash.eval.bench import rotations
    from whiflash.eval.datasets import Sample

    # four categories interleaved, as the testbed's test split is: rotating by the sample's index alone would
    # give every sample of a category the same order when there are four methods
    samples = [Sample(id=f"{c}-{i}", category=c, turns=("x",)) for i in range(4) for c in ("a", "b", "c", "d")]
    rot = rotations(samples)
    for c in "abcd":
        assert sorted(rot[f"{c}-{i}"] % 4 for i in range(4)) == [0, 1, 2, 3]
    assert rotations(samples[1::4]) == {f"b-{i}": i for i in range(4)}


@pytest.mark.parametrize("n", [2, 3, 4, 7, 9])
def test_method_orders_balance_positions_and_predecessors(n: int) -> None:
    """Over one cycle of orders every method runs at every position and right after every other method equally
    often (a rotation balances positions only: each method then always follows the same one)."""
    from collections import Counter

    from whiflash.eval.bench import method_order

    names = [f"m{i}" for i in range(n)]
    cycle = n if n % 2 == 0 else 2 * n
    orders = [method_order(names, k) for k in range(cycle)]
    assert all(sorted(o) == names for o in orders) and method_order(names, 0)[0] == names[0]
    assert method_order(names, cycle + 1) == orders[1]
    positions = Counter((pos, m) for o in orders for pos, m in enumerate(o))
    assert set(positions.values()) == {cycle // n} and len(positions) == n * n
    follows = Counter((a, b) for o in orders for a, b in zip(o, o[1:]))
    assert len(follows) == n * (n - 1) and set(follows.values()) == {cycle // n}


def test_bench_writes_every_output_and_is_lossless(bench_run: Path) -> None:
    for name in ("config.json", "config.yaml", "manifest.json", "samples.jsonl", "results.json", "results.csv",
                 "results.md", "plots/speedup.png", "plots/tau_hist.png", "plots/slots.png"):
        assert (bench_run / name).is_file(), name
    res = json.loads((bench_run / "results.json").read_text())
    assert res["mismatches"] == [] and res["samples"] == 3
    assert sorted(res["categories"]) == ["code", "math", "prose"]
    rows = _rows(bench_run)
    assert len(rows) == 3 * 6 and all(r["mismatch"] is None for r in rows)
    assert {r["order"] for r in rows if r["method"] == "ar"} == {0}  # one sample a category: no rotation yet
    # what each decode paid for once: eager passes on the CPU capture and compile nothing, and reserve no CUDA memory
    assert all(r["graphs_captured"] == r["passes_compiled"] == 0 and "segments_reserved" not in r for r in rows)
    cell = res["cells"]["all"]
    assert cell["ar"]["tau"] == 1.0 and cell["ar"]["speedup"] == pytest.approx(1.0)
    assert cell["eagle3"]["tau"] > 1.0 and cell["eagle3"]["speedup_ci_low"] <= cell["eagle3"]["speedup_ci_high"]
    assert 0.0 <= cell["oracle"]["slot0_share"] <= 1.0 and cell["oracle"]["catchup_share"] is not None
    assert cell["eagle3"]["slot0_share"] is None
    assert "vs_eagle3" in res["gains"]["whiflash-entropy"]["all"]
    md = (bench_run / "results.md").read_text()
    assert TAU_DEFINITION in md and "vs EAGLE-3" in md
    # the entropy router's rounds on states its drafters' own decodes also stood on (fp32: lossless, so every
    # state up to the end is shared): each drafted as its drafter alone did there, catch-up included
    judged = res["decisions"]["whiflash-entropy"]["all"]
    assert sum(f["rounds"] for f in judged.values()) > 0 and "Decisions on shared states" in md
    assert all(f["same_as_alone"] == 1.0 for f in judged.values())
    man = json.loads((bench_run / "manifest.json").read_text())
    assert man["kind"] == "whiflash.eval" and man["argv"][:2] == ["whiflash-eval", "bench"] and man["seed"] == 0
    assert man["models"]["target"].endswith("target") and man["hardware"]["device"] == "cpu"
    assert len(man["samples"]) == 3 and man["versions"]["torch"] and "git" in man
    assert man["tau_definition"] == TAU_DEFINITION and man["cache_max_len"] > 12
    assert man["compiled_layers"] is False and man["cuda_graphs"] is False


def test_wrong_drafter_is_a_mismatch_and_fails_strict(micro: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    real = whiflash.generate

    def corrupt(target, drafter, ids, max_new_tokens, **kw):
        out, st = real(target, drafter, ids, max_new_tokens, **kw)
        if drafter is not None and len(out) > 3:
            out = [*out[:3], (out[3] + 1) % target.config.vocab_size, *out[4:]]
        return out, st

    monkeypatch.setattr(whiflash, "generate", corrupt)
    args = ["--testbed", str(micro), "--max-samples", "1", "--methods", "dflash", "--no-plots"]
    assert _bench(tmp_path, *args, "--name", "lenient") == 0
    assert _bench(tmp_path, *args, "--name", "strict", "--strict") == 1
    assert _bench(tmp_path, *args, "--name", "tolerant", "--strict", "--strict-tolerance", "1e9") == 0
    res = json.loads((_run_dir(tmp_path, "strict") / "results.json").read_text())
    (m,) = res["mismatches"]
    assert m["method"] == "dflash" and m["position"] == 3 and m["ar_token"] != m["method_token"]
    assert m["margin_fp32"] > 0 and m["logit_gap_fp32"] > 0  # AR's token is the fp32 argmax
    assert res["cells"]["all"]["dflash"]["mismatches"] == 1


def test_resume_skips_done_rows(micro: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["--testbed", str(micro), "--max-samples", "2", "--methods", "dflash", "--name", "r", "--no-plots"]
    assert _bench(tmp_path, *args) == 0
    run = _run_dir(tmp_path, "r")
    rows = (run / "samples.jsonl").read_text().splitlines()
    assert len(rows) == 4
    (run / "samples.jsonl").write_text("\n".join(rows[:2]) + "\n" + rows[2][:20])  # killed mid-write
    calls = []
    real = whiflash.generate
    monkeypatch.setattr(whiflash, "generate", lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    assert _bench(tmp_path, *args) == 0
    assert _run_dir(tmp_path, "r") == run  # same folder, resumed
    assert calls.count(12) == 2  # only the unfinished sample's two methods decode again (the rest is warm-up)
    again = _rows(run)
    assert len(again) == 4 and len({(r["sample"], r["method"]) for r in again}) == 4
    assert _bench(tmp_path, *args[:-3], "--name", "r", "--no-plots", "--seed", "1") == 0  # other config: new folder
    assert len(sorted(tmp_path.glob("*_r"))) == 2
    monkeypatch.setattr("whiflash.eval.bench.checkpoint_stamp", lambda path: "rewritten")  # a retrained checkpoint
    assert _bench(tmp_path, *args) == 0
    assert len(sorted(tmp_path.glob("*_r"))) == 3  # in the same folders: a new run, not the old one's rows


# ---------------------------------------------------------------- datasets


def test_warm_up_drafts_with_every_slot_of_a_routed_method(micro: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A routed method may route its whole warm-up to one slot (here: an entropy threshold no round is below,
    so slot 1 every round); it is warmed up again with each slot forced, so neither member's passes nor the
    target's verify at a slot's width with the policy deciding inside it (a graph keyed by the policy) is
    captured inside a timed sample. DDTree + EAGLE-3, with no standalone EAGLE-3 to warm EAGLE-3 up."""
    calls: list[tuple[str, set[int]]] = []
    real, draft = whiflash.generate, whiflash.RoutedDrafter._draft

    def spy(target, drafter, ids, max_new_tokens, **kw):
        calls.append(("ar" if drafter is None else "routed" if hasattr(drafter, "members") else drafter.kind, set()))
        return real(target, drafter, ids, max_new_tokens, **kw)

    def spy_draft(self, slot, pending, pos):  # the slot that really drafts
        calls[-1][1].add(slot)
        return draft(self, slot, pending, pos)

    monkeypatch.setattr(whiflash, "generate", spy)
    monkeypatch.setattr(whiflash.RoutedDrafter, "_draft", spy_draft)
    args = ["--testbed", str(micro), "--max-samples", "1", "--methods", "ar,ddtree,whiflash-entropy",
            "--whiflash-drafters", "ddt-e3", "--whiflash-entropy-threshold", "1e-9", "--name", "w", "--no-plots"]
    assert _bench(tmp_path, *args) == 0
    assert len(calls) == 5 + 3  # warm-ups, then one timed decode per method
    warm = [c for c in calls[:5] if c[0] == "routed"]
    assert [sorted(kinds) for _, kinds in warm] == [[1], [0], [1]]  # the policy's slot, then each slot forced
    assert calls[-3:][[c[0] for c in calls[-3:]].index("routed")][1] == {1}  # the timed decode: the policy again


@pytest.mark.parametrize("policy", ["entropy-stick", "entropy-switching", "neural", "ddt-e3-stick", "tau-rule"])
def test_warm_up_runs_every_fixed_shape_pass_a_timed_decode_runs(micro: Path, tmp_path: Path, policy: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Every fixed-shape pass a timed decode runs (a CUDA graph on the GPU, captured on its first use: ~0.1 s
    inside a sample of a few ms) has run in the warm-up. A round `stick_tau` keeps verifies with no decision
    inside the pass, under a key of its own, which a warm-up whose slot-0 rounds never reach `stick_tau` did not
    run (chat prompts, where DFlash accepts little): the first kept round of the timed samples captured it. Here
    the warm-up runs under a `stick_tau` no round reaches and the timed decodes keep every round they can; the
    other policies switch slots (an entropy threshold inside `micro`'s entropies), decide with a neural router, draft
    trees, or follow a tau rule."""
    from whiflash.eval.bench import Runner
    from whiflash.router import NeuralRouter, export_single_file
    from whiflash.runtime.graphs import FixedShapePasses

    timed = False
    keys: dict[bool, set] = {False: set(), True: set()}
    real_run, real_prepare = FixedShapePasses.run_fixed, Runner.prepare

    def spy_run(self, key, fn, *inputs, **kw):
        keys[timed].add((type(self).__name__, key))
        return real_run(self, key, fn, *inputs, **kw)

    def spy_prepare(self, samples):
        nonlocal timed
        out = real_prepare(self, samples)
        timed = True
        for m in self._methods.values():
            if isinstance(m.drafter, whiflash.RoutedDrafter) and m.drafter.stick_tau is not None:
                m.drafter.stick_tau = 1  # the bench's --whiflash-stick-tau 1000 until now
        return out

    monkeypatch.setattr(FixedShapePasses, "fixed_shapes", property(lambda self: True))  # as under CUDA graphs
    monkeypatch.setattr(FixedShapePasses, "run_fixed", spy_run)
    monkeypatch.setattr(Runner, "prepare", spy_prepare)
    # 8 warm-up tokens take at least two rounds of DFlash's blocks of 4
    args = ["--testbed", str(micro), "--max-samples", "2", "--warmup-tokens", "8", "--name", "k", "--no-plots"]
    stick = ["--whiflash-stick-tau", "1000"]
    if policy == "neural":
        router = export_single_file(NeuralRouter(hidden_size=128, mlp_dim=8, drafters="df-e3"), tmp_path / "r.safetensors")
        args += ["--methods", "whiflash-neural", "--whiflash-neural-router-path", str(router),
                 "--whiflash-neural-router-threshold", "0.0", *stick]
    elif policy == "entropy-switching":
        args += ["--methods", "whiflash-entropy", "--whiflash-entropy-threshold", "5", *stick]
    elif policy == "tau-rule":
        args += ["--methods", "whiflash-entropy", "--whiflash-entropy-threshold", "1e9", "--whiflash-tau-rule", "3,1"]
    else:  # slot 0 (DFlash, or DDTree) every round
        args += ["--methods", "whiflash-entropy", "--whiflash-entropy-threshold", "1e9", *stick]
        if policy == "ddt-e3-stick":
            args += ["--whiflash-drafters", "ddt-e3", "--ddtree-tree-budget", "3"]
    assert _bench(tmp_path, *args) == 0
    rows = [r for r in _rows(_run_dir(tmp_path, "k")) if r["method"].startswith("whiflash")]
    assert any(len(r["taus"]) > 2 for r in rows)  # the timed decodes had rounds to keep
    if policy == "entropy-switching":
        assert any(len(set(r["slots"])) == 2 for r in rows)  # and switched
    assert keys[True] and not keys[True] - keys[False], f"first run in a timed decode: {keys[True] - keys[False]}"


def test_every_decode_runs_with_the_collector_off(micro: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A garbage collection the methods before made due lands in no decode's timing (as `timeit` times)."""
    import gc

    real_generate = whiflash.generate
    enabled: list[bool] = []

    def spy_generate(*args, **kw):
        enabled.append(gc.isenabled())
        return real_generate(*args, **kw)

    monkeypatch.setattr(whiflash, "generate", spy_generate)
    assert gc.isenabled()
    assert _bench(tmp_path, "--testbed", str(micro), "--max-samples", "2", "--methods", "eagle3,dflash",
                  "--warmup-tokens", "4", "--name", "g", "--no-plots") == 0
    assert len(enabled) >= 2 * 3 and not any(enabled)  # warm-up and two samples of AR, EAGLE-3, DFlash
    assert gc.isenabled()


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_dataset_formats(tmp_path: Path) -> None:
    mt = _write(tmp_path / "mt_bench.jsonl", [{"question_id": 81, "category": "writing", "turns": ["Hi.", "More."]},
                                              {"question_id": 82, "category": "roleplay", "turns": ["One turn."]}])
    pr = _write(tmp_path / "mine.jsonl", [{"id": "a", "prompt": "def f(x):"}])
    ids = _write(tmp_path / "ids.jsonl", [{"input_ids": [5, 6, 7]}])
    samples = load_samples(f"{mt},{pr}@coding,{ids}", seed=0)
    by_id = {s.id: s for s in samples}
    assert by_id["mt_bench-81"].category == "chat" and by_id["mt_bench-81"].subcategory == "writing"
    assert by_id["mt_bench-81"].n_turns == 2 and by_id["mt_bench-81"].turns == ("Hi.", "More.")
    assert by_id["mine-a"].category == "coding" and by_id["mine-a"].turns == ("def f(x):",)
    assert by_id["ids-1"].input_ids == (5, 6, 7) and by_id["ids-1"].category == "ids"
    bad = _write(tmp_path / "bad.jsonl", [{"text": "no known field"}])
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_samples(str(bad))
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_samples(str(tmp_path / "missing.jsonl"))


def test_testbed_source_errors_name_the_spec(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--dataset 'testbed:nosuch': unknown testbed split 'nosuch'; expected one "
                                         r"of testbed:train, testbed:validation, testbed:test"):
        load_samples("testbed:nosuch", testbed=tmp_path)
    with pytest.raises(FileNotFoundError, match=rf"--dataset 'testbed:test': --testbed {tmp_path / 'nope'}: no such "
                                                r"folder \(expected a built testbed: python -m whiflash.testbed build"):
        load_samples("testbed:", testbed=tmp_path / "nope")


def test_run_folders_of_another_kind_are_never_used(tmp_path: Path) -> None:
    from whiflash.eval.outputs import prepare_run_dir

    testbed = tmp_path / "tb"
    testbed.mkdir()
    (testbed / "manifest.json").write_text('{"stages": {}}')
    with pytest.raises(FolderKindError, match=rf"--out {testbed}: is a testbed build .*; expected a folder to hold run"):
        prepare_run_dir(testbed, "x", {"a": 1})
    assert [p.name for p in testbed.iterdir()] == ["manifest.json"]
    other = tmp_path / "20250101-000000_x"  # named like a run with this config, but another tool's folder
    other.mkdir()
    (other / "config.json").write_text('{"a": 1}')
    (other / "manifest.json").write_text('{"kind": "whiflash.train"}')
    run, resumed = prepare_run_dir(tmp_path, "x", {"a": 1})
    assert not resumed and run != other
    assert prepare_run_dir(tmp_path, "x", {"a": 1}) == (run, True)  # its own run, killed before its manifest


def test_named_benchmark_offline_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"local JSONL.*\.jsonl"):
        load_samples("gsm8k")
    assert time.perf_counter() - t0 < 2.0
    with pytest.raises(ValueError, match="not a known benchmark"):
        load_samples("no-such-benchmark")


@pytest.mark.skipif(not (SHARED_PROMPTS / "mt_bench.jsonl").is_file(), reason="shared prompt files absent")
def test_shared_prompt_files_upstream_subset_per_file() -> None:
    import numpy as np

    files = ",".join(str(SHARED_PROMPTS / f) for f in ("mt_bench.jsonl", "gsm8k.jsonl", "humaneval.jsonl"))
    a = load_samples(files, max_samples=6, seed=0)
    assert [s.category for s in a] == ["chat"] * 6 + ["math"] * 6 + ["coding"] * 6  # 6 of every file
    for name in ("mt_bench", "gsm8k", "humaneval"):  # upstream's dataset.shuffle(seed=0).select(range(6))
        rows = sum(1 for line in (SHARED_PROMPTS / f"{name}.jsonl").read_text().splitlines() if line.strip())
        assert [s.row for s in a if s.dataset == name] == list(np.random.default_rng(0).permutation(rows)[:6])
    assert [s.id for s in a] == [s.id for s in load_samples(files, max_samples=6, seed=0)]
    assert [s.id for s in a] != [s.id for s in load_samples(files, max_samples=6, seed=1)]
    assert all(s.n_turns == 2 for s in a if s.category == "chat")


def test_chat_template_history_and_thinking_off() -> None:
    class Tok:
        chat_template = "{{ messages }}"

        def apply_chat_template(self, messages, **kw):
            self.seen = (messages, kw)
            return list(range(len(messages)))

    tok = Tok()
    ids = encode_chat(tok, ["q1", "q2"], ["a1"])
    messages, kw = tok.seen
    assert [m["role"] for m in messages] == ["user", "assistant", "user"] and messages[1]["content"] == "a1"
    assert kw["enable_thinking"] is False and kw["add_generation_prompt"] and ids == [0, 1, 2]
    encode_chat(tok, ["q"], enable_thinking=True)
    assert tok.seen[1]["enable_thinking"] is True
    with pytest.raises(ValueError, match="earlier replies"):
        encode_chat(tok, ["q1", "q2"], [])


def test_multi_turn_bench_replays_ar_reply(micro: Path, tmp_path: Path) -> None:
    f = _write(tmp_path / "conv.jsonl", [{"question_id": 1, "turns": ["def add(a, b):", "def sub(a, b):"]},
                                         {"question_id": 2, "prompt": "Question: What is 2 plus 3?\nAnswer:"},
                                         {"question_id": 3, "input_ids": [10, 11, 12, 13]}])
    assert _bench(tmp_path, "--testbed", str(micro), "--dataset", f"{f}@coding", "--methods", "eagle3",
                  "--name", "mt", "--no-plots", "--strict") == 0
    rows = _rows(_run_dir(tmp_path, "mt"))
    assert len(rows) == (2 + 1 + 1) * 2 and {r["category"] for r in rows} == {"coding"}
    t0, t1 = ([r for r in rows if r["sample"] == "conv-1" and r["turn"] == t and r["method"] == "ar"][0]
              for t in (0, 1))
    assert t1["prompt_tokens"] > t0["prompt_tokens"] + t0["new_tokens"] - 2  # turn 2 carries AR's reply
    assert [r["prompt_tokens"] for r in rows if r["sample"] == "conv-3"] == [4, 4]


# ---------------------------------------------------------------- metrics, report, calibrate


def test_metrics_speedup_ratios_pooled_and_interval() -> None:
    def row(method: str, sec: float, cat: str = "c") -> dict:
        return {"method": method, "category": cat, "new_tokens": 11, "decode_seconds": sec, "taus": [1] * 10,
                "ar_decode_seconds": 1.0, "ar_new_tokens": 11, "speedup": 1.0 / sec, "slots": [],
                "catchup_seconds": 0.0}

    rows = [row("ar", 1.0), row("ar", 1.0), row("dflash", 0.5), row("dflash", 0.25)]
    res = aggregate(rows, ["ar", "dflash"], iterations=200)
    d = res["cells"]["c"]["dflash"]
    assert d["speedup"] == pytest.approx(2 / 0.75) and d["speedup_pooled"] == pytest.approx(2 / 0.75)  # same tokens
    assert d["speedup_mean_ratio"] == pytest.approx(3.0) and d["speedup_median_ratio"] == pytest.approx(3.0)
    assert d["speedup_ci_low"] >= 2.0 and d["speedup_ci_high"] <= 4.0
    assert bootstrap_ci([2.0, 2.0, 2.0]) == (2.0, 2.0)


def test_routed_rounds_are_costed_against_their_drafters_own_rounds_on_the_same_prompts() -> None:
    def row(method: str, sample: str, sec: float, slots: list[int], pair: bool = True) -> dict:
        return {"method": method, "sample": sample, "turn": 0, "category": "c", "new_tokens": 11, "decode_seconds": sec,
                "taus": [2] * len(slots or [0] * 5), "ar_decode_seconds": 1.0, "ar_new_tokens": 11, "speedup": 1.0 / sec,
                "slots": slots, "switch_rate": 0.0, "catchup_seconds": 0.0,
                "slot_methods": ["dflash", "eagle3"] if pair else None}

    rows = [row("ar", p, 1.0, [], False) for p in "ab"]
    rows += [row("dflash", "a", 0.5, [], False), row("eagle3", "a", 1.0, [], False)]  # 0.1 / 0.2 s a round on a
    rows += [row("dflash", "b", 0.3, [], False)]  # b has no EAGLE-3 row: it is left out of the column
    rows += [row("whiflash-neural", "a", 0.77, [0, 0, 1, 1, 0]), row("whiflash-neural", "b", 0.5, [0] * 5)]
    res = aggregate(rows, ["ar", "dflash", "eagle3", "whiflash-neural"], iterations=50)
    cell = res["cells"]["c"]
    # a: 3 DFlash rounds (0.3 s) + 2 EAGLE-3 rounds (0.4 s) = 0.7 s alone, 0.77 s routed
    assert cell["whiflash-neural"]["round_cost_vs_alone"] == pytest.approx(0.1)
    assert cell["dflash"]["round_cost_vs_alone"] is None and cell["ar"]["round_cost_vs_alone"] is None
    table = markdown_table(res)
    assert "| +10.0% |" in table and "Routed rounds: vs alone = " in table


def test_routed_decisions_are_judged_on_the_states_both_drafters_also_started_from() -> None:
    from whiflash.eval.decisions import decisions_markdown, shared_state_decisions

    def row(method: str, taus: list[int], slots: list[int] | None = None, mismatch: int | None = None) -> dict:
        return {"method": method, "sample": "a", "turn": 0, "category": "c", "taus": taus, "slots": slots or [],
                "slot_methods": ["dflash", "eagle3"] if slots else None,
                "mismatch": {"position": mismatch} if mismatch is not None else None}

    # rounds start at: DFlash 0, 3, 6, 9; EAGLE-3 0, 2, 6, 8; the router 0 (DFlash), 3 (DFlash), 6 (EAGLE-3), 8
    rows = [row("ar", [1] * 12), row("dflash", [3, 3, 3, 3]), row("eagle3", [2, 4, 2, 4]),
            row("whiflash-neural", [3, 3, 2, 4], [0, 0, 1, 1]), row("oracle", [3, 3, 2, 4], [0, 0, 1, 1])]
    got = shared_state_decisions(rows)
    assert set(got) == {"whiflash-neural"}  # the oracle does not decide
    c = got["whiflash-neural"]["c"]
    assert got["whiflash-neural"]["all"] == c
    # at 0 it took DFlash (3) where EAGLE-3 had 2; at 6 EAGLE-3 (2) where DFlash had 3; 3 and 8 are not shared
    assert c["dflash"] == {"rounds": 1, "tau": 3.0, "tau_alone": {"dflash": 3.0, "eagle3": 2.0}, "same_as_alone": 1.0,
                           "other_better": 0.0, "other_worse": 1.0}
    assert c["eagle3"] == {"rounds": 1, "tau": 2.0, "tau_alone": {"dflash": 3.0, "eagle3": 2.0}, "same_as_alone": 1.0,
                           "other_better": 1.0, "other_worse": 0.0}
    assert "| whiflash-neural | c | eagle3 | 1 | 2.00 | dflash 3.00, eagle3 2.00 | 100% | 100% / 0% |" in \
        decisions_markdown(got)
    # DFlash's output leaves AR's at token 5: the state at 6 is no longer the router's
    rows[1] = row("dflash", [3, 3, 3, 3], mismatch=5)
    assert set(shared_state_decisions(rows)["whiflash-neural"]["c"]) == {"dflash"}
    rows.remove(rows[2])  # no EAGLE-3 alone: nothing to judge against
    assert shared_state_decisions(rows) == {}


def test_report_side_by_side(bench_run: Path, tmp_path: Path) -> None:
    assert main(["report", str(bench_run), str(bench_run), "--out", str(tmp_path / "rep")]) == 0
    for name in ("report.md", "report.csv", "report.tex", "plots/speedup.png"):
        assert (tmp_path / "rep" / name).is_file(), name
    assert (tmp_path / "rep" / "report.md").read_text().count(f"## {bench_run.name}") == 2
    assert "\\toprule" in (tmp_path / "rep" / "report.tex").read_text()
    manifest = json.loads((tmp_path / "rep" / "manifest.json").read_text())
    assert manifest["kind"] == "whiflash.eval" and manifest["tool"] == "whiflash-eval report"
    with pytest.raises(FileNotFoundError, match="results.json"):
        main(["report", str(tmp_path)])
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "todo.txt").write_text("mine")
    with pytest.raises(FolderKindError, match="holds files"):  # a folder the toolkit did not write is left alone
        main(["report", str(bench_run), "--out", str(foreign)])
    assert sorted(p.name for p in foreign.iterdir()) == ["todo.txt"]


def test_calibrate_then_bench_uses_thresholds(micro: Path, bench_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "thr.json"
    assert main(["calibrate", "--out", str(tmp_path), *FAST, "--testbed", str(micro), "--max-samples", "3",
                 "--thresholds", "0.01,100", "--exclude-run", str(bench_run), "--output", str(out)]) == 0
    thr = json.loads(out.read_text())
    bench_ids = {s["id"] for s in json.loads((bench_run / "manifest.json").read_text())["samples"]}
    assert thr["method"] == "whiflash-entropy" and set(thr["thresholds"]) == {"code", "math", "prose"}
    assert not bench_ids & set(thr["samples"]) and len(thr["samples"]) == 3
    assert set(thr["details"]["math"]["sweep"]) == {"0.01", "100.0"}
    assert json.loads((Path(thr["run"]) / "manifest.json").read_text())["tool"] == "whiflash-eval calibrate"
    thr["thresholds"] = {"code": 0.01, "math": 100.0, "prose": 0.01}
    out.write_text(json.dumps(thr))
    # one file per routed method: the neural router's thresholds beside the entropy router's
    from whiflash.router import NeuralRouter, export_single_file

    router = export_single_file(NeuralRouter(hidden_size=128, mlp_dim=8), tmp_path / "r.safetensors")
    neural = tmp_path / "neural.json"
    neural.write_text(json.dumps({"method": "whiflash-neural", "thresholds": {"code": -50.0, "math": math.inf},
                                  "default": 1.5}))
    assert _bench(tmp_path, "--testbed", str(micro), "--max-samples", "3", "--methods", "whiflash-entropy,whiflash-neural",
                  "--whiflash-neural-router-path", str(router), "--whiflash-thresholds", f"{out},{neural}",
                  "--name", "thr", "--no-plots") == 0
    used = {(r["method"], r["category"]): r["threshold"] for r in _rows(_run_dir(tmp_path, "thr")) if r["method"] != "ar"}
    assert used == {("whiflash-entropy", "code"): 0.01, ("whiflash-entropy", "math"): 100.0,
                    ("whiflash-entropy", "prose"): 0.01, ("whiflash-neural", "code"): -50.0,
                    ("whiflash-neural", "math"): math.inf, ("whiflash-neural", "prose"): 1.5}
    # an infinite threshold pins slot 1: EAGLE-3 alone drafts every math round, its output and taus EAGLE-3's own
    rows = {(r["method"], r["category"]): r for r in _rows(_run_dir(tmp_path, "thr"))}
    pinned, ar = rows[("whiflash-neural", "math")], rows[("ar", "math")]
    assert pinned["slots"] == [1] * len(pinned["taus"]) and pinned["switch_rate"] == 0.0
    assert pinned["backlogs"] == [] and rows[("whiflash-neural", "code")]["backlogs"]  # no routed drafter ran
    assert pinned["tokens"] == ar["tokens"] and len(pinned["taus"]) > 1
    assert 0 in rows[("whiflash-neural", "code")]["slots"]  # -50: the router still decides (slot 0 here)
    with pytest.raises(ValueError, match="two files for whiflash-entropy"):
        main(["bench", "--out", str(tmp_path), *FAST, "--testbed", str(micro), "--methods", "whiflash-entropy",
              "--whiflash-thresholds", f"{out},{out}", "--name", "thr2", "--no-plots"])


def test_calibrate_around_a_replayed_pick_decodes_each_categorys_own_grid(micro: Path, bench_run: Path,
                                                                          tmp_path: Path) -> None:
    replayed = tmp_path / "replayed.json"
    replayed.write_text(json.dumps({"method": "whiflash-entropy", "thresholds": {"code": 0.5, "math": math.inf}}))
    out = tmp_path / "thr.json"
    assert main(["calibrate", "--out", str(tmp_path), *FAST, "--testbed", str(micro), "--max-samples", "3",
                 "--thresholds-around", str(replayed), "--around-steps=-0.5,0,0.5", "--thresholds", "0.01",
                 "--exclude-run", str(bench_run), "--output", str(out)]) == 0
    thr = json.loads(out.read_text())
    grid = {"code": ["-inf", "0.0", "0.5", "1.0", "inf"], "math": ["-inf", "inf"], "prose": ["0.01"]}
    assert thr["grid"] == grid  # prose is not in the file: the --thresholds values
    ran = {}
    for r in _rows(Path(thr["run"])):
        ran.setdefault(r["category"], set()).add(r["method"])
    assert ran == {c: {"ar", *(f"whiflash-entropy@{float(v):g}" for v in vs)} for c, vs in grid.items()}
    assert {c: set(d["sweep"]) for c, d in thr["details"].items()} == {
        c: {str(float(v)) for v in vs} for c, vs in grid.items()}
    replayed.write_text(json.dumps({"method": "whiflash-neural", "thresholds": {"code": 0.5}}))
    with pytest.raises(UsageError, match="--thresholds-around .*its method is whiflash-neural; expected whiflash-entropy"):
        main(["calibrate", "--out", str(tmp_path), *FAST, "--testbed", str(micro), "--thresholds-around", str(replayed)])
    with pytest.raises(UsageError, match="does not go with --replay"):
        main(["calibrate", "--out", str(tmp_path), "--replay", str(tmp_path), "--thresholds-around", str(replayed)])


def test_calibrate_of_a_router_refitted_in_place_starts_a_new_run(micro: Path, bench_run: Path, tmp_path: Path) -> None:
    import torch

    from whiflash.router import NeuralRouter, export_single_file

    path = tmp_path / "r.safetensors"
    args = ["calibrate", "--out", str(tmp_path / "runs"), *FAST, "--testbed", str(micro), "--max-samples", "1",
            "--calibrate-method", "whiflash-neural", "--whiflash-neural-router-path", str(path), "--thresholds", "0",
            "--exclude-run", str(bench_run), "--output", str(tmp_path / "thr.json")]
    run = lambda: (main(args), json.loads((tmp_path / "thr.json").read_text())["run"])[1]  # noqa: E731
    torch.manual_seed(0)
    export_single_file(NeuralRouter(hidden_size=128, mlp_dim=8), path)
    first = run()
    assert run() == first  # nothing changed: the run resumes (its rows are all there)
    torch.manual_seed(1)
    export_single_file(NeuralRouter(hidden_size=128, mlp_dim=8), path)  # refitted at the same path
    assert run() != first


def test_a_benchmark_category_takes_the_threshold_of_the_testbed_category_it_stands_for() -> None:
    from whiflash.eval.bench import threshold_for

    calibrated = {"thresholds": {"code": 1.0, "prose": math.inf, "chat": 2.0}, "default": 0.5}
    assert threshold_for(calibrated, "coding") == 1.0 and threshold_for(calibrated, "code") == 1.0
    assert threshold_for(calibrated, "chat") == 2.0  # its own first
    assert threshold_for({**calibrated, "thresholds": {"prose": math.inf}}, "chat") == math.inf
    assert threshold_for(calibrated, "math") == 0.5 and threshold_for(calibrated, None) == 0.5


def test_neural_router_file_and_tree_pair(micro: Path, tmp_path: Path) -> None:
    from whiflash.router import NeuralRouter, export_single_file

    router = export_single_file(NeuralRouter(hidden_size=128, mlp_dim=8, drafters="df-e3"), tmp_path / "r.safetensors")
    assert _bench(tmp_path, "--testbed", str(micro), "--max-samples", "1", "--speculative-algorithm", "WHIFLASH",
                  "--whiflash-router", "neural", "--whiflash-neural-router-path", str(router),
                  "--whiflash-neural-router-threshold", "0.0", "--name", "neural", "--no-plots", "--strict") == 0
    assert {r["method"] for r in _rows(_run_dir(tmp_path, "neural"))} == {"ar", "whiflash-neural"}
    assert _bench(tmp_path, "--testbed", str(micro), "--max-samples", "1", "--whiflash-drafters", "ddt-e3",
                  "--ddtree-tree-budget", "3", "--methods", "whiflash,oracle", "--name", "tree", "--no-plots",
                  "--strict") == 0
    rows = _rows(_run_dir(tmp_path, "tree"))
    assert {r["method"] for r in rows} == {"ar", "whiflash-entropy", "oracle"}
    assert all(r["label"].endswith("(ddt-e3)") for r in rows if r["method"] != "ar")
    with pytest.raises(ValueError, match="ddt-e3"):  # a df-e3 router refused for another pair, naming both
        _bench(tmp_path, "--testbed", str(micro), "--max-samples", "1", "--whiflash-drafters", "ddt-e3",
               "--methods", "whiflash-neural", "--whiflash-neural-router-path", str(router), "--name", "bad")
    assert not list(tmp_path.glob("*_bad"))


def test_profile_of_the_testbed_drives_the_utility_oracle(micro: Path, tmp_path: Path) -> None:
    from whiflash.latency import LatencyProfile

    prof = tmp_path / "profile.json"
    assert main(["profile", "--testbed", str(micro), "--device", "cpu", "--dtype", "float32", "--context", "32",
                 "--repeats", "2", "--backlogs", "1,8", "--out", str(tmp_path), "--output", str(prof)]) == 0
    p = LatencyProfile.read(prof)
    block = json.loads((micro / "dflash" / "config.json").read_text())["block_size"]
    assert set(p.round) == {"eagle3", "dflash", f"ddtree-b{block - 1}"} and block in p.verify
    args = ["--testbed", str(micro), "--max-samples", "2", "--no-plots", "--strict"]
    with pytest.raises(ValueError, match="utility-oracle method needs --whiflash-latency-profile"):
        _bench(tmp_path, *args, "--methods", "utility-oracle", "--name", "noprof")
    assert _bench(tmp_path, *args, "--whiflash-router", "utility-oracle", "--speculative-algorithm", "WHIFLASH",
                  "--whiflash-latency-profile", str(prof), "--name", "util") == 0
    rows = [r for r in _rows(_run_dir(tmp_path, "util")) if r["method"] != "ar"]
    assert {r["method"] for r in rows} == {"utility-oracle"} and all(r["mismatch"] is None for r in rows)
    assert all(len(r["slots"]) == len(r["taus"]) for r in rows)
    man = json.loads((_run_dir(tmp_path, "util") / "manifest.json").read_text())
    assert man["models"]["latency_profile"] == str(prof)


@pytest.mark.parametrize("pair", ["df-e3", "ddt-e3"])
def test_a_pinned_routed_method_decodes_with_its_standalone_drafters_own_object(micro: Path, pair: str) -> None:
    """An infinite threshold pins a slot, and the method then runs that slot's standalone drafter object itself
    (the one its standalone method and the routed pair use): its gain over that drafter is one decoder timed twice,
    and no checkpoint is loaded a second time (DDTree's default budget once made a copy of its own)."""
    from whiflash.eval.methods import MethodFactory

    factory = MethodFactory(whiflash.load_target(micro / "target"), model_paths("DFLASH", None, None, None, micro),
                            pair=pair)
    slot0 = "ddtree" if pair == "ddt-e3" else "dflash"
    for threshold, kind in ((-math.inf, slot0), (math.inf, "eagle3")):
        pinned = factory.build("whiflash-neural", threshold)
        assert pinned.pinned is not None and pinned.drafter is factory.build(kind).drafter
    assert len(factory._drafters) == 2  # the pair's two drafters, each loaded once
