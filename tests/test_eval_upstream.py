"""whiflash-eval as upstream measures: the speedup as a ratio of mean TPOTs, the console summary, upstream's
flags (`--tree-budget LIST`, `--block-size`, `--save-path`, `--flash-attn`), the sweep and its resumption,
older run folders in `report`, and the fast engine as the CUDA default."""
from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import statistics
from pathlib import Path

import pytest
import torch

import whiflash
from whiflash.eval.cli import bench_config, main, parse
from whiflash.eval.families import parse_method, parse_values
from whiflash.eval.metrics import aggregate, decode_tokens
from whiflash.eval.outputs import markdown_table

FAST = ["--max-new-tokens", "12", "--warmup-tokens", "4", "--bootstrap", "200", "--dtype", "float32",
        "--device", "cpu"]
QUICK_START = ("--speculative-algorithm WHIFLASH --model-name-or-path Qwen/Qwen3-8B --draft-name-or-path "
               "z-lab/Qwen3-8B-DFlash-b16 --whiflash-eagle-draft WhiFlash/Qwen3-8B-EAGLE3 --whiflash-router neural "
               "--whiflash-neural-router-path WhiFlash/Qwen3-8B-NeuralRouter-df-e3 --whiflash-neural-router-threshold "
               "0.5 --dataset mt-bench --max-samples 10 --max-new-tokens 2048").split()

pytestmark = pytest.mark.usefixtures("one_thread")


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]


def _row(method: str, seconds: float, ar_seconds: float, cat: str = "c", tokens: int = 11) -> dict:
    return {"method": method, "category": cat, "dataset": "d", "new_tokens": tokens, "decode_seconds": seconds,
            "taus": [2] * 5, "ar_decode_seconds": ar_seconds, "ar_new_tokens": 11, "slots": [], "catchup_seconds": 0.0,
            "speedup": (ar_seconds / 10) / (seconds / decode_tokens(tokens))}


# ---------------------------------------------------------------- metrics


def test_speedup_is_the_ratio_of_mean_tpots_beside_the_per_sample_ratios() -> None:
    # a short prompt on which the method is 4x and a long one on which it is 1x: the mean of ratios says 2.5x,
    # upstream's ratio of mean TPOTs weighs each sample's TPOT and says (0.1 + 1.0) / (0.025 + 1.0) = 1.07x
    rows = [_row("ar", 1.0, 1.0), _row("ar", 10.0, 10.0), _row("dflash", 0.25, 1.0), _row("dflash", 10.0, 10.0)]
    d = aggregate(rows, ["ar", "dflash"], iterations=300)["cells"]["c"]["dflash"]
    assert d["speedup"] == pytest.approx(1.1 / 1.025)
    assert d["speedup_mean_ratio"] == pytest.approx(2.5) and d["speedup_median_ratio"] == pytest.approx(2.5)
    assert d["speedup_ci_low"] <= d["speedup"] <= d["speedup_ci_high"] and d["speedup_ci_high"] <= 4.0
    assert d["tau"] == 2.0 and d["ar_tpot_ms"] == pytest.approx(550.0) and d["tpot_ms"] == pytest.approx(512.5)
    three = [*rows, _row("ar", 1.0, 1.0), _row("dflash", 0.5, 1.0)]
    assert aggregate(three, ["ar", "dflash"])["cells"]["c"]["dflash"]["speedup_median_ratio"] == pytest.approx(2.0)


def test_best_budget_per_group_and_gains_against_it() -> None:
    rows = [_row("ar", 1.0, 1.0, "a"), _row("ar", 1.0, 1.0, "b"),
            _row("ddtree-b4", 0.5, 1.0, "a"), _row("ddtree-b4", 0.2, 1.0, "b"),
            _row("ddtree-b8", 0.4, 1.0, "a"), _row("ddtree-b8", 0.25, 1.0, "b"),
            _row("whiflash-entropy@0.1", 0.2, 1.0, "a"), _row("whiflash-entropy@0.1", 0.2, 1.0, "b")]
    res = aggregate(rows, ["ar", "ddtree-b4", "ddtree-b8", "whiflash-entropy@0.1"], iterations=50)
    best = res["best"]["categories"]["ddtree"]
    assert (best["a"]["method"], best["a"]["value"], best["b"]["method"]) == ("ddtree-b8", 8, "ddtree-b4")
    assert res["gains"]["whiflash-entropy@0.1"]["a"]["vs_ddtree"] == pytest.approx(100.0)  # 5x vs the best, 2.5x
    assert res["best"]["datasets"]["ddtree"]["d"]["method"] == "ddtree-b8"  # pooled over a and b
    assert parse_method("ddtree-b32") == ("ddtree", 32.0) and parse_method("whiflash-neural@1.5") == (
        "whiflash-neural", 1.5) and parse_method("dflash") == ("dflash", None)
    assert parse_values("16, 32,16", "--tree-budget", int) == [16, 32]
    with pytest.raises(ValueError, match=r"--tree-budget '16,x': 'x' is not an integer; expected comma-separated"):
        parse_values("16,x", "--tree-budget", int)


def test_gains_carry_a_paired_interval_that_the_spread_between_prompts_does_not_widen() -> None:
    # prompts from 1x to 10x for DFlash; the router is 5% faster than DFlash on every prompt, exactly: the gain's
    # paired interval is that 5% alone, while each method's own speedup interval spans the prompts' spread
    rows = []
    for i in range(12):
        ar, df = 1.0 + i, (1.0 + i) / (1 + i % 10)
        for m, sec in (("ar", ar), ("dflash", df), ("whiflash-neural", df / 1.05)):
            rows.append({**_row(m, sec, ar), "sample": f"s{i}", "turn": 0})
    res = aggregate(rows, ["ar", "dflash", "whiflash-neural"], iterations=200)
    g = res["gains"]["whiflash-neural"]["c"]
    assert g["vs_dflash"] == pytest.approx(5.0)
    assert g["vs_dflash_ci"] == pytest.approx((5.0, 5.0))
    df = res["cells"]["c"]["dflash"]
    assert df["speedup_ci_high"] / df["speedup_ci_low"] > 1.2
    assert "+5.0% (+5.0 to +5.0)" in markdown_table(res)
    # a twin of DFlash timed with +-2% noise: the interval holds 0 and is about that wide
    for r in rows:
        if r["method"] == "whiflash-neural":
            d = next(x for x in rows if x["method"] == "dflash" and x["sample"] == r["sample"])
            r["decode_seconds"] = d["decode_seconds"] * (1.02 if int(r["sample"][1:]) % 2 else 0.98)
    lo, hi = aggregate(rows, ["ar", "dflash", "whiflash-neural"], iterations=200)["gains"]["whiflash-neural"]["c"][
        "vs_dflash_ci"]
    assert -2.5 < lo < 0 < hi < 2.5


def test_a_decode_far_slower_a_round_than_its_method_is_reported_as_a_timing_outlier() -> None:
    # every decode 5 rounds at ~1.7 ms a round (a little more on longer prompts), but one routed decode
    # paid 125 ms once inside its timing (a graph captured on its first use): it alone is named, with its excess
    rows = []
    for i in range(8):
        for m, ms in (("ar", 1.2), ("eagle3", 1.7 + 0.05 * i), ("whiflash-neural", 1.75 + 0.1 * i)):
            rows.append({**_row(m, ms * 5e-3, 6e-3), "sample": f"s{i}", "turn": 0})
    for r in rows:  # what each decode paid for once (the bench counts it): one graph, inside the slow decode
        r.update(graphs_captured=0, passes_compiled=0, segments_reserved=0)
    rows[-1]["decode_seconds"] += 0.125
    rows[-1]["graphs_captured"] = 1
    res = aggregate(rows, ["ar", "eagle3", "whiflash-neural"], iterations=50)
    (o,) = res["timing_outliers"]
    assert (o["sample"], o["method"], o["rounds"], o["graphs_captured"]) == ("s7", "whiflash-neural", 5, 1)
    assert o["ms_per_round"] == pytest.approx(27.45) and o["excess_ms"] == pytest.approx(125.0 + 5 * (2.45 - 2.1), abs=0.1)
    md = markdown_table(res)
    assert "Timing outliers (1;" in md and "whiflash-neural on s7" in md
    assert "inside the timing: graphs captured 1" in md
    rows[-1]["decode_seconds"] -= 0.125
    assert aggregate(rows, ["ar", "eagle3", "whiflash-neural"], iterations=50)["timing_outliers"] == []
    # a stall of 10 ms in a short decode (5 rounds of ~2 ms: 1.9x its method's median a round), with nothing
    # captured, compiled or reserved, is named as a stall
    rows[-1]["decode_seconds"] += 0.010
    rows[-1]["graphs_captured"] = 0
    (o,) = aggregate(rows, ["ar", "eagle3", "whiflash-neural"], iterations=50)["timing_outliers"]
    assert o["sample"] == "s7" and "a host or device stall" in markdown_table(
        aggregate(rows, ["ar", "eagle3", "whiflash-neural"], iterations=50))


# ---------------------------------------------------------------- the fast engine by default


def _printed(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--print_config"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_the_fast_engine_is_the_cuda_default(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from whiflash.runtime import decode_attention

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(decode_attention, "triton", object())  # Triton installed
    fast = "device: cuda\ndtype: bfloat16\n"
    for argv in (["bench", *QUICK_START], ["calibrate", *QUICK_START], ["sweep", *QUICK_START],
                 ["bench", *QUICK_START, "--device", "cuda", "--dtype", "bfloat16", "--cuda-graphs"]):
        text = _printed(argv, capsys)
        assert fast in text and "cuda_graphs: true" in text and "compile_layers: true" in text, argv[0]
    text = _printed(["bench", *QUICK_START, "--no-compile-layers"], capsys)
    assert "cuda_graphs: true" in text and "compile_layers: false" in text
    text = _printed(["bench", *QUICK_START, "--no-cuda-graphs"], capsys)  # compiled layers live inside the graphs
    assert "cuda_graphs: false" in text and "compile_layers: false" in text and "dtype: bfloat16" in text
    text = _printed(["bench", *QUICK_START, "--device", "cpu"], capsys)
    assert "dtype: float32" in text and "cuda_graphs: false" in text and "compile_layers: false" in text
    text = _printed(["profile", "--preset", "qwen3-8b", "--random-weights"], capsys)
    assert fast in text and "cuda_graphs: true" in text and "compile_layers: true" in text
    text = _printed(["profile", "--preset", "qwen3-8b", "--random-weights", "--no-cuda-graphs"], capsys)
    assert "cuda_graphs: false" in text
    monkeypatch.setattr(decode_attention, "triton", None)  # where torch.compile cannot run, layers stay eager
    text = _printed(["bench", *QUICK_START], capsys)
    assert "cuda_graphs: true" in text and "compile_layers: false" in text
    ns, _ = parse(["bench", *QUICK_START, "--cuda-graphs", "--compile-layers"])  # asked for: kept (and refused
    assert bench_config(ns.bench).compile_layers is True                          # at run time with the reason)


def test_the_cpu_default_is_float32_eager(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    text = _printed(["bench", *QUICK_START], capsys)
    assert "device: cpu\ndtype: float32\n" in text and "cuda_graphs: false" in text and "compile_layers: false" in text


# ---------------------------------------------------------------- bench on micro: budgets, flags, summary


@pytest.fixture(scope="module")
def budgets_run(micro: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path]:
    out = tmp_path_factory.mktemp("eval")
    saved = out / "upstream" / "run.pt"  # upstream's suffix: written as JSON all the same
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["bench", "--out", str(out), *FAST, "--testbed", str(micro), "--max-samples", "3", "--name", "tb",
                     "--methods", "dflash", "--tree-budget", "4,8", "--block-size", "3", "--flash-attn",
                     "--save-path", str(saved)])
    assert code == 0
    (run,) = sorted(out.glob("*_tb"))
    return run, stdout.getvalue(), saved


def test_tree_budgets_run_in_one_bench_with_upstream_figures(budgets_run: tuple[Path, str, Path]) -> None:
    run, _, _ = budgets_run
    rows = _rows(run)
    assert sorted({r["method"] for r in rows}) == ["ar", "ddtree-b4", "ddtree-b8", "dflash"] and len(rows) == 3 * 4
    assert all(t <= 3 for r in rows if r["method"] == "dflash" for t in r["taus"])  # --block-size 3: 2 drafts + 1
    assert all(r["mismatch"] is None for r in rows)
    res = json.loads((run / "results.json").read_text())
    assert res["metrics_version"] == 2 and "mean over samples of AR time per output token" in res["speedup_definition"]
    for cat, per in res["cells"].items():
        for method, fig in per.items():
            sel = [r for r in rows if r["method"] == method and (cat == "all" or r["category"] == cat)]
            ar = statistics.mean(r["ar_decode_seconds"] / decode_tokens(r["ar_new_tokens"]) for r in sel)
            mine = statistics.mean(r["decode_seconds"] / decode_tokens(r["new_tokens"]) for r in sel)
            assert fig["speedup"] == pytest.approx(ar / mine)  # upstream's speedup
            assert fig["speedup_median_ratio"] == pytest.approx(statistics.median(r["speedup"] for r in sel))
            assert fig["tau"] == pytest.approx(statistics.mean(statistics.mean(r["taus"]) for r in sel))
    best = res["best"]["categories"]["ddtree"]
    assert set(best) == {"code", "math", "prose", "all"} and all(b["method"] in ("ddtree-b4", "ddtree-b8")
                                                               for b in best.values())
    md = (run / "results.md").read_text()
    assert "| speedup (95% CI) | tau | tau pooled | mean ratio | median ratio |" in md and "Best setting per group" in md
    assert "mean over the same samples of the method's time per output token" in md
    assert (run / "plots" / "sweep.png").is_file()
    man = json.loads((run / "manifest.json").read_text())
    (sel,) = man["selection"]
    assert sel["source"] == "testbed:test" and sel["rule"] == "balanced" and len(sel["indices"]) == 3
    assert sel["ids"] == [s["id"] for s in man["samples"]] and all(s["row"] is not None for s in man["samples"])
    options = whiflash.EngineOptions.from_environment().to_dict()  # the target's options, every field
    assert man["engine"] == {"device": "cpu", "dtype": "float32", **options, "cuda_graphs": False,
                             "compiled_layers": False, "attention_kernel_available": man["engine"][
                                 "attention_kernel_available"], "flash_attn_flag": True,
                             "requested": {"cuda_graphs": False, "compile_layers": False}}


def test_console_summary_and_save_path(budgets_run: tuple[Path, str, Path]) -> None:
    run, printed, saved = budgets_run
    res = json.loads((run / "results.json").read_text())
    lines = printed.splitlines()
    for cat in ("code", "math", "prose", "all"):
        assert any(line.startswith(f"[{cat}] AR throughput ") for line in lines), cat
        for method in ("dflash", "ddtree-b4", "ddtree-b8"):
            fig = res["cells"][cat][method]
            assert f"[{cat}] {method}: speedup {fig['speedup']:.2f}x" in printed and f"tau {fig['tau']:.2f}" in printed
    assert "[all] dflash: tau histogram " in printed and lines[-1] == f"Results: {run}"
    assert lines[-3].startswith("best ddtree: code ddtree-b")
    data = json.loads(saved.read_text())  # upstream's --save-path: the run's data, as JSON
    assert data["results"]["cells"] == res["cells"] and len(data["rows"]) == 12 and data["args"]["tree_budget"] == "4,8"


def test_report_recomputes_older_run_folders(budgets_run: tuple[Path, str, Path], tmp_path: Path) -> None:
    run, _, _ = budgets_run
    old = tmp_path / run.name
    shutil.copytree(run, old)
    res = json.loads((old / "results.json").read_text())
    for per in res["cells"].values():  # as the earlier bench wrote it: 'speedup' was the mean of ratios
        for fig in per.values():
            fig["speedup"] = fig.pop("speedup_mean_ratio")
            del fig["speedup_median_ratio"]
    for key in ("metrics_version", "speedup_definition", "best", "datasets"):
        res.pop(key)
    (old / "results.json").write_text(json.dumps(res))
    assert main(["report", str(old), "--out", str(tmp_path / "rep")]) == 0
    now = json.loads((run / "results.json").read_text())["cells"]["all"]["dflash"]
    md = (tmp_path / "rep" / "report.md").read_text()
    assert f"| all | dflash | {now['speedup']:.2f}× (" in md and "median ratio" in md
    assert "mean ratio & median ratio" in (tmp_path / "rep" / "report.tex").read_text()
    (old / "samples.jsonl").unlink()
    with pytest.raises(ValueError, match=r"results.json: written by an older whiflash-eval .* no samples.jsonl"):
        main(["report", str(old), "--out", str(tmp_path / "rep2")])


def test_bad_flag_values_are_named(micro: Path, tmp_path: Path) -> None:
    args = ["bench", "--out", str(tmp_path), *FAST, "--testbed", str(micro), "--max-samples", "1"]
    with pytest.raises(ValueError, match=r"--tree-budget '4,big': 'big' is not an integer"):
        main([*args, "--tree-budget", "4,big"])
    with pytest.raises(ValueError, match=r"--block-size: expected an integer >= 2 .*got 1"):
        main([*args, "--block-size", "1"])
    with pytest.raises(ValueError, match=r"--save-path .*: is a folder"):
        main([*args, "--save-path", str(tmp_path)])
    with pytest.raises(ValueError, match=r"--methods: unknown method 'ddtree-bx'.*ddtree-bN"):
        main([*args, "--methods", "ddtree-bx"])
    assert not list(tmp_path.glob("*_*"))  # refused before a run folder exists


# ---------------------------------------------------------------- sweep


def test_sweep_resumes_after_a_kill_without_redoing_samples(micro: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["sweep", "--out", str(tmp_path), *FAST, "--testbed", str(micro), "--max-samples", "2", "--methods",
            "dflash", "--tree-budget", "2,4", "--entropy-thresholds", "0.05,50", "--name", "sw", "--no-plots"]
    real = whiflash.generate
    timed: list[int] = []

    def killed_after(limit: int):
        def generate(*a, **kw):
            if a[3] == 12:  # a timed decode (warm-ups decode 4 tokens)
                if len(timed) == limit:
                    raise KeyboardInterrupt("killed")
                timed.append(1)
            return real(*a, **kw)
        return generate

    monkeypatch.setattr(whiflash, "generate", killed_after(8))  # 6 methods a sample: dies in the second
    with pytest.raises(KeyboardInterrupt):
        main(args)
    (run,) = sorted(tmp_path.glob("*_sw"))
    done = _rows(run)
    assert len(done) == 6 and {r["sample"] for r in done} == {done[0]["sample"]}  # the first sample whole
    timed.clear()
    monkeypatch.setattr(whiflash, "generate", killed_after(10 ** 6))
    assert main(args) == 0
    assert sorted(tmp_path.glob("*_sw")) == [run]  # the same folder, resumed
    assert len(timed) == 6  # only the unfinished sample decodes again
    rows = _rows(run)
    names = {"ar", "dflash", "ddtree-b2", "ddtree-b4", "whiflash-entropy@0.05", "whiflash-entropy@50"}
    assert len(rows) == 12 and {r["method"] for r in rows} == names and rows[:6] == done
    res = json.loads((run / "results.json").read_text())
    assert set(res["best"]["categories"]) == {"ddtree", "whiflash-entropy"}
    assert {r["threshold"] for r in rows if r["method"] == "whiflash-entropy@50"} == {50.0}
    assert "Best setting per group" in (run / "results.md").read_text()


def test_a_routed_method_pinned_to_one_drafter_is_named_so_beside_its_gain_over_it() -> None:
    # prose: the calibrated threshold pins WhiFlash-Neural to EAGLE-3 (slot 1), so it ran EAGLE-3 itself and its gain
    # over EAGLE-3 is timing noise; code: a finite threshold, so the same gain is the router's
    rows = []
    for i in range(6):
        for cat, threshold, slots in (("prose", math.inf, [1] * 5), ("code", 0.5, [0, 1, 1, 0, 1])):
            for m, sec in (("ar", 1.0), ("eagle3", 0.5), ("dflash", 0.6), ("whiflash-neural", 0.49)):
                row = {**_row(m, sec, 1.0, cat), "sample": f"{cat}{i}", "turn": 0}
                if m == "whiflash-neural":
                    row.update(threshold=threshold, slots=slots, slot_methods=["dflash", "eagle3"], switch_rate=0.0)
                rows.append(row)
    res = aggregate(rows, ["ar", "eagle3", "dflash", "whiflash-neural"], iterations=50)
    assert res["gains"]["whiflash-neural"]["prose"]["pinned"] == "eagle3"
    assert "pinned" not in res["gains"]["whiflash-neural"]["code"]
    assert "pinned" not in res["gains"]["whiflash-neural"]["all"]  # the code decodes could decide
    text = markdown_table(res)
    prose = next(line for line in text.splitlines() if line.startswith("| whiflash-neural | prose |"))
    assert prose.split(" | ")[2].endswith("pinned") and not prose.split(" | ")[3].endswith("pinned")
    assert "Pinned: in that category every decode of the routed method was that drafter itself" in text
