"""End-to-end ``micro`` testbed build (once per session), its contracts and resumability."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from whiflash.testbed.build import STAGES, build
from whiflash.testbed.presets import CATEGORIES, get_preset


def _manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


def test_manifest_records_every_stage(micro: Path) -> None:
    m = _manifest(micro)
    assert m["preset"] == "micro" and len(m["corpus_sha256"]) == 64
    assert [e["stage"] for e in m["log"]] == list(STAGES)
    for name in STAGES:
        rec = m["stages"][name]
        assert rec["done"] and rec["fingerprint"] and len(rec["output_sha256"]) == 64
        assert (micro / name).is_dir() and not (micro / f".tmp-{name}").exists()
    assert m["versions"]["torch"] and m["config"]["target"]["hidden_size"] == 128


def test_target_loads_with_transformers_and_beats_unigram(micro: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from whiflash.testbed.target import evaluate_target

    model = AutoModelForCausalLM.from_pretrained(str(micro / "target"))
    tok = AutoTokenizer.from_pretrained(str(micro / "target"))
    assert model.config.model_type == "qwen3" and model.config.vocab_size == len(tok)
    assert tok.model_max_length == model.config.max_position_embeddings == get_preset("micro").target.max_position_embeddings
    figures = evaluate_target(model, micro / "tokens", seq_len=64, n_windows=4)
    for cat in CATEGORIES:
        f = figures[cat]
        assert math.isfinite(f["loss"]) and f["loss"] < f["unigram_loss"] - 0.3, (cat, f)
    recorded = _manifest(micro)["stages"]["target"]["test"]
    assert all(recorded[c]["loss"] < recorded[c]["unigram_loss"] for c in CATEGORIES)
    # Math is templated: it must be the most predictable category.
    assert recorded["math"]["loss"] < min(recorded["code"]["loss"], recorded["prose"]["loss"])


def test_runtime_matches_transformers_on_the_target(micro: Path) -> None:
    from transformers import AutoModelForCausalLM

    import whiflash

    hf = AutoModelForCausalLM.from_pretrained(str(micro / "target")).eval()
    ours = whiflash.load_target(micro / "target")
    ids = torch.tensor(json.loads((micro / "responses" / "responses.jsonl").open().readline())["prompt_ids"])
    ours.setup_cache(ids.numel())
    with torch.no_grad():
        ref = hf(input_ids=ids[None]).logits[0]
    got = ours(ids, 0).logits
    assert torch.allclose(got, ref, atol=1e-3, rtol=1e-3)
    assert _manifest(micro)["stages"]["responses"]["runtime_argmax_agreement"] >= 0.99


def test_drafters_load_and_accept_more_than_one_token(micro: Path) -> None:
    from transformers import AutoTokenizer

    import whiflash
    from whiflash.testbed.prompts import eval_prompts

    tok = AutoTokenizer.from_pretrained(str(micro / "target"))
    target = whiflash.load_target(micro / "target")
    e3 = whiflash.load_drafter("eagle3", micro / "eagle3", target)
    df = whiflash.load_drafter("dflash", micro / "dflash", target)
    assert df.mask_token_id == tok.mask_token_id
    assert int(e3.d2t.abs().sum()) > 0  # a reduced vocabulary with real offsets
    taus = {"eagle3": [], "dflash": []}
    for cat in CATEGORIES:
        for prompt in eval_prompts(micro, cat, 2):
            ids = tok(prompt)["input_ids"][-256:]  # agentic prompts outgrow micro's 1024 positions
            ref, _ = whiflash.generate(target, None, ids, 24)
            for name, drafter in (("eagle3", e3), ("dflash", df)):
                out, stats = whiflash.generate(target, drafter, ids, 24)
                assert out == ref  # lossless: the drafters only change speed
                taus[name].append(stats.mean_tau)
    for name, values in taus.items():
        assert sum(values) / len(values) > 1.0, (name, values)
    acc = _manifest(micro)["stages"]["acceptance"]
    assert acc["lossless_mismatches"] == 0
    assert set(acc["tau"]) == {"eagle3", "dflash", "ddtree", "oracle"}
    assert all(set(v) == set(CATEGORIES) for v in acc["tau"].values())
    assert set(acc["switching"]) == set(CATEGORIES) == {"code", "math", "prose", "agentic"}
    assert all(0 <= v["switching_sequences"] <= 1 for v in acc["switching"].values())
    # Every oracle round advances with the longer of its two slots' acceptances. (Its mean tau is not bound to
    # beat each drafter's own: a drafter alone starts its rounds at other positions, and on micro's few,
    # short sequences one phase of a repetition loop can decide a category.)
    rows = [json.loads(line) for line in (micro / "acceptance" / "acceptance.jsonl").open()]
    assert rows and all(len(r["oracle"]) == len(r["oracle_slot_taus"]) > 0 for r in rows)
    assert all(t == max(pair) for r in rows for t, pair in zip(r["oracle"], r["oracle_slot_taus"]))


def test_eval_prompts_come_from_the_test_split(micro: Path) -> None:
    from whiflash.testbed.corpus import read_corpus
    from whiflash.testbed.prompts import held_out_prompts

    for cat in CATEGORIES:
        test_ids = {r["id"] for r in read_corpus(micro / "corpus", "test", cat)}
        prompts = held_out_prompts(micro, cat, 5)
        assert len(prompts) == 5 and len({p.id for p in prompts}) == 5
        assert all(p.id.rsplit("@", 1)[0] in test_ids for p in prompts)
        assert held_out_prompts(micro, cat, 5) == prompts  # deterministic


def test_code_prompts_take_further_cuts_when_documents_run_out(micro: Path) -> None:
    from whiflash.testbed.corpus import read_corpus
    from whiflash.testbed.prompts import held_out_prompts

    docs = list(read_corpus(micro / "corpus", "test", "code"))
    prompts = held_out_prompts(micro, "code", 3 * len(docs))
    assert len(prompts) > len(docs)  # source files have many def/class headers to cut at
    assert len({p.id for p in prompts}) == len(prompts) == len({(p.id.split("@")[0], p.prompt) for p in prompts})
    texts = {d["id"]: d["text"] for d in docs}
    for p in prompts:  # ids are `<document>@<cut offset>`
        doc, offset = p.id.rsplit("@", 1)
        assert texts[doc][int(offset):] == p.reference and texts[doc][:int(offset)].endswith(p.prompt)
    assert held_out_prompts(micro, "code", len(docs)) == prompts[:len(docs)]  # the first pass is unchanged
    math_docs = list(read_corpus(micro / "corpus", "test", "math"))
    assert len(held_out_prompts(micro, "math", 2 * len(math_docs))) == len(math_docs)  # one cut per problem
    prose = {d["id"]: d["text"] for d in read_corpus(micro / "corpus", "test", "prose")}
    first = held_out_prompts(micro, "prose", len(prose))
    more = held_out_prompts(micro, "prose", 2 * len(prose))
    assert more[:len(first)] == first and len(more) > len(first)  # later passes cut at other sentence ends
    assert len({p.id for p in more}) == len(more)
    for p in more[len(first):]:
        doc, offset = p.id.rsplit("@", 1)
        assert prose[doc][:int(offset)] == p.prompt and p.prompt[-1] in ".:;!?"


def test_responses_continue_prompts_of_the_configured_split(micro: Path, tmp_path: Path) -> None:
    from whiflash.testbed.corpus import read_corpus
    from whiflash.testbed.drafter_data import generate_responses
    from whiflash.testbed.presets import ResponsesConfig

    stats = generate_responses(micro, ResponsesConfig(prompts_per_category=2, split="validation", max_new_tokens=3,
                                                       max_prompt_tokens=32), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "responses.jsonl").open()]
    held = {r["id"] for cat in CATEGORIES for r in read_corpus(micro / "corpus", "validation", cat)}
    assert len(rows) == 2 * len(CATEGORIES) and all(r["id"].rsplit("@", 1)[0] in held for r in rows)
    assert {s["split"] for s in stats["per_category"].values()} == {"validation"}
    assert _manifest(micro)["stages"]["responses"]["per_category"]["math"]["split"] == "train"  # micro's default
    stats = generate_responses(micro, ResponsesConfig(prompts_per_category=1, split={"prose": "validation"},
                                                       max_new_tokens=2, max_prompt_tokens=32), tmp_path)
    assert {c: s["split"] for c, s in stats["per_category"].items()} == {c: "validation" if c == "prose" else "train"
                                                                          for c in CATEGORIES}


def test_batched_target_features_equal_the_runtime_forward(micro: Path) -> None:
    """Drafters train on features of right-padded batches; they must be what the engine's forward gives."""
    import whiflash
    from whiflash.testbed.drafter_data import load_features, pad_batch, response_samples

    samples = response_samples(micro)[:5]
    features = load_features(micro, [1, 0])  # taps in any order; the last layer's tap is the post-norm state
    batch = pad_batch(samples, pad_id=1)
    feats, hidden = features(batch["ids"])
    target = whiflash.load_target(micro / "target")
    for i, s in enumerate(samples):
        n = s.ids.numel()
        target.setup_cache(n)
        ref = target.forward(s.ids, 0, taps=(0, 1), logits="none")
        torch.testing.assert_close(feats[i, :n], ref.feats[:, [1, 0]], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(hidden[i, :n], ref.hidden, atol=1e-4, rtol=1e-4)
    assert features.train().training is False  # a training module's .train() leaves the target in eval mode


def test_cached_features_train_the_drafters_as_features_computed_each_step(micro: Path, monkeypatch, caplog) -> None:
    """The drafter stages compute the target's features once per sequence: their losses must be the on-the-fly
    ones, a sequence a mix repeats is computed once, and features that do not fit are left to the steps."""
    import whiflash
    from whiflash.testbed import drafter_data
    from whiflash.testbed.dflash_train import DFlashModule, sample_anchors
    from whiflash.testbed.drafter_data import cache_features, load_features, pad_batch, response_samples
    from whiflash.testbed.eagle3_train import Eagle3Module
    from whiflash.testbed.presets import get_preset

    samples = response_samples(micro)[:6]
    samples = samples + samples[:2]  # a mix repeats sequences by reference
    fresh = [type(s)(s.ids, s.loss_mask, s.category) for s in samples[:6]]
    target = whiflash.load_target(micro / "target")
    cfg = get_preset("micro")
    stages = _manifest(micro)["stages"]
    dflash = whiflash.load_drafter("dflash", micro / "dflash", target)
    eagle3 = whiflash.load_drafter("eagle3", micro / "eagle3", target)
    embed, head = target.model.embed_tokens.weight, target.lm_head.weight
    used = torch.nonzero(eagle3.t2d).flatten()
    for drafter, kind in ((dflash, "dflash"), (eagle3, "eagle3")):
        features = load_features(micro, stages[kind]["taps"])
        figures = cache_features(samples, features, batch_size=4)
        assert figures["features_cached"] and all(s.feats is not None for s in samples)
        batch, plain = pad_batch(samples[:6], pad_id=0), pad_batch(fresh, pad_id=0)
        assert "feats" in batch and "feats" not in plain
        if drafter is dflash:
            module = DFlashModule(drafter, features, embed, head, cfg.dflash)
            anchors, keep = sample_anchors(batch["loss_mask"], 8, torch.Generator().manual_seed(0))
            cached, computed = (module.block_loss(b, anchors, keep)[0] for b in (batch, plain))
        else:
            module = Eagle3Module(drafter, features, embed, head, used, cfg.eagle3, 0)
            cached, computed = (module.ttt(b)[0] for b in (batch, plain))
        torch.testing.assert_close(cached, computed, atol=1e-5, rtol=1e-5)
        for s in samples:
            s.feats = s.hidden = None
    calls = []
    monkeypatch.setattr(drafter_data.TargetFeatures, "forward", lambda self, ids: calls.append(ids.shape[0]) or
                        (torch.zeros(ids.shape[0], ids.shape[1], 1, 2), torch.zeros(ids.shape[0], ids.shape[1], 2)))
    cache_features(samples, features, batch_size=4)
    assert sum(calls) == 6  # the two repeated sequences once
    monkeypatch.setattr(drafter_data, "FEATURE_CACHE_SHARE", 0.0)
    with caplog.at_level("WARNING"):
        figures = cache_features(fresh, features, batch_size=4, desc="dflash features")
    assert not figures["features_cached"] and fresh[0].feats is None
    assert "dflash features" in caplog.text and "computed in every training step" in caplog.text


def test_eagle3_ttt_loss_equals_the_masked_loss_over_every_row(micro: Path) -> None:
    """EAGLE-3's TTT runs its head and loss on the rows each step scores only: its loss and accuracies must equal
    the soft cross-entropy over every row, masked to those rows (each step's pre-head states captured by hooks)."""
    import whiflash
    from whiflash.testbed.drafter_data import load_features, pad_batch, response_samples
    from whiflash.testbed.eagle3_train import Eagle3Module, _shift
    from whiflash.testbed.presets import get_preset

    target = whiflash.load_target(micro / "target")
    drafter = whiflash.load_drafter("eagle3", micro / "eagle3", target)
    features = load_features(micro, _manifest(micro)["stages"]["eagle3"]["taps"])
    cfg = get_preset("micro").eagle3
    used = torch.nonzero(drafter.t2d).flatten()
    module = Eagle3Module(drafter, features, target.model.embed_tokens.weight, target.lm_head.weight, used, cfg, 0)
    batch = pad_batch(response_samples(micro)[:6], pad_id=0)
    pre, mlp = [], []  # h before the MLP and the MLP's output, every step: the step's state is their sum
    layer = drafter.midlayer
    hooks = [layer.post_attention_layernorm.register_forward_hook(lambda m, a, o: pre.append(a[0])),
             layer.mlp.register_forward_hook(lambda m, a, o: mlp.append(o))]
    loss, accs = module.ttt(batch)
    for h in hooks:
        h.remove()
    _, hidden = features(batch["ids"])
    full = hidden.float() @ target.lm_head.weight.float().T
    in_vocab, teacher = drafter.t2d[full.argmax(-1)], full[..., used].softmax(-1)
    want, want_accs = 0.0, []
    for k, (a, b) in enumerate(zip(pre, mlp)):
        logits = drafter.lm_head(drafter.norm(a + b)).float()
        p = _shift(teacher, k + 1, 0.0)
        valid = _shift(batch["loss_mask"], k + 2, False) & _shift(in_vocab, k + 1, False)
        n = valid.sum().clamp(min=1)
        want = want + cfg.step_decay ** k * (-(p * logits.log_softmax(-1)).sum(-1) * valid).sum() / n
        want_accs.append(float(((logits.argmax(-1) == p.argmax(-1)) & valid).sum() / n))
    assert len(pre) == cfg.ttt_length
    torch.testing.assert_close(loss, want, atol=1e-5, rtol=1e-5)
    assert accs == pytest.approx(want_accs, abs=1e-6)


def test_dflash_scores_only_kept_blocks_and_slots_past_the_anchor(micro: Path) -> None:
    """DFlash's loss runs its head on the scored rows only and drops blocks past the most any row keeps: padding
    the anchors with dropped blocks changes neither loss nor hits, and slot 0 (the anchor itself) is never scored."""
    import whiflash
    from whiflash.testbed.dflash_train import DFlashModule, sample_anchors
    from whiflash.testbed.drafter_data import load_features, pad_batch, response_samples
    from whiflash.testbed.presets import get_preset

    target = whiflash.load_target(micro / "target")
    drafter = whiflash.load_drafter("dflash", micro / "dflash", target)
    features = load_features(micro, _manifest(micro)["stages"]["dflash"]["taps"])
    module = DFlashModule(drafter, features, target.model.embed_tokens.weight, target.lm_head.weight,
                          get_preset("micro").dflash)
    batch = pad_batch(response_samples(micro)[:6], pad_id=0)
    anchors, keep = sample_anchors(batch["loss_mask"], 4, torch.Generator().manual_seed(0))
    assert keep.all()
    loss, hit = module.block_loss(batch, anchors, keep)
    padded = (torch.cat([anchors, torch.zeros_like(anchors)], 1), torch.cat([keep, torch.zeros_like(keep)], 1))
    loss2, hit2 = module.block_loss(batch, *padded)
    torch.testing.assert_close(loss2, loss)
    torch.testing.assert_close(hit2, hit)
    assert hit[0] == 0 and hit[1:].sum() > 0


def _random_qwen3_and_prompts(n: int, seed: int) -> tuple[torch.nn.Module, list[list[int]]]:
    """A 2-layer random-weight Qwen3 (vocabulary 97, eos 1, pad 0) and ``n`` random prompts of 1-11 tokens."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                      eos_token_id=1, pad_token_id=0)
    model = Qwen3ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    return model, [torch.randint(2, 97, (int(k),), generator=g).tolist() for k in torch.randint(1, 12, (n,), generator=g)]


def test_batched_generation_equals_the_transformers_forward() -> None:
    """The static-cache batch decoder gives the tokens of a plain full-recompute greedy loop, row by row, with
    grouped K/V heads or with the query heads folded into query rows."""
    from whiflash.testbed.generate import continue_prompts, decode_batch

    model, prompts = _random_qwen3_and_prompts(7, seed=1)
    got = continue_prompts(model, prompts, 8, eos=1, pad_id=0, batch_size=3)  # prompts of other lengths share batches
    assert decode_batch(model, prompts, 8, eos=1, pad_id=0, fold_heads=True) == got
    for p, cont in zip(prompts, got):
        ids, ref = torch.tensor([p]), []
        with torch.no_grad():
            for _ in range(8):
                ref.append(int(model(input_ids=ids).logits[0, -1].argmax()))
                if ref[-1] == 1:
                    break
                ids = torch.cat([ids, torch.tensor([[ref[-1]]])], dim=1)
        assert cont == ref
    sampled = continue_prompts(model, prompts, 8, eos=1, pad_id=0, batch_size=3, temperature=1.0, seed=5)
    assert sampled == continue_prompts(model, prompts, 8, eos=1, pad_id=0, batch_size=3, temperature=1.0, seed=5)
    assert sampled != got


def test_shedding_ended_rows_and_attending_over_written_columns_change_no_token(monkeypatch, caplog) -> None:
    """Shedding ended rows mid-decode (cache rows included) and attending over the columns written so far leave
    every row's greedy tokens as a batch that keeps its rows and attends over its whole cache gives; the test
    fails if no batch shed a row."""
    import logging

    import whiflash.testbed.generate as generate

    model, prompts = _random_qwen3_and_prompts(24, seed=2)
    # eos: a token that rows of this random model reach at many different steps, so rows end throughout
    free = generate.decode_batch(model, prompts, 40, eos=-1, pad_id=0)
    firsts: dict[int, set[int]] = {}
    for row in free:
        for step, t in enumerate(row):
            firsts.setdefault(t, set()).add(row.index(t))
    eos = max(firsts, key=lambda t: len(firsts[t]))
    monkeypatch.setattr(generate, "SHED_MIN_ROWS", 10**9)
    monkeypatch.setattr(generate, "SPAN_CHUNK", 0)
    kept = generate.decode_batch(model, prompts, 40, eos=eos, pad_id=0)
    monkeypatch.setattr(generate, "SHED_MIN_ROWS", 2)
    monkeypatch.setattr(generate, "SPAN_CHUNK", 8)  # 11 + 40 columns: spans 16, 24, ..., 51
    with caplog.at_level(logging.DEBUG, logger="whiflash.testbed.generate"):
        shed = generate.decode_batch(model, prompts, 40, eos=eos, pad_id=0)
    assert "shedding the rest" in caplog.text
    assert shed == kept
    assert len({len(row) for row in kept}) > 3  # rows ended at many lengths


def test_the_generator_benchmark_times_each_attention_backend_or_says_why_not(monkeypatch) -> None:
    """scripts/bench_generate.py on the CPU at `micro`'s shape: a rate per batch, backend and attention layout, or
    the reason that backend cannot run the layout's attention; an unknown backend or layout is refused by its flag."""
    import importlib.util
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_generate.py"
    args = [sys.executable, str(script), "--preset", "micro", "--batches", "2,4", "--prompt-tokens", "8",
            "--new-tokens", "16", "--device", "cpu"]  # 16 steps: well above a loaded machine's noise
    done = subprocess.run([*args, "--backends", "default,math,efficient"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines()[2:]]
    assert [tuple(r[:3]) for r in rows] == [(b, n, lay) for b in ("2", "4") for n in ("default", "math", "efficient")
                                            for lay in ("grouped", "folded")]
    for r in rows:
        assert r[3] == "cannot" or (float(r[3]) > 0 and float(r[4]) > 0), r
    assert all(r[3] != "cannot" for r in rows if r[1] in ("default", "math"))
    # the refused flags in this process: a SystemExit whose message Python prints to stderr with exit status 1,
    # without a fresh interpreter's seconds of imports each
    spec = importlib.util.spec_from_file_location("bench_generate", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for flag, message in ((["--backends", "fast"], "--backends: unknown ['fast']"),
                          (["--layouts", "flat"], "--layouts: expected grouped and/or folded, got 'flat'")):
        monkeypatch.setattr(sys, "argv", [str(script), *args[2:], *flag])
        with pytest.raises(SystemExit) as bad:
            bench.main()
        assert isinstance(bad.value.code, str) and message in bad.value.code


def test_sharpening_fine_tunes_the_target_on_its_own_continuations(micro: Path) -> None:
    rec = _manifest(micro)["stages"]["target"]
    sharpen, cfg = rec["sharpen"], get_preset("micro").target.sharpen
    assert sharpen["steps"] == cfg.steps and sharpen["sequences"] + sharpen["dropped_repetitive"] == 4 * cfg.prompts_per_category
    assert sharpen["splits"] == {cat: "train" for cat in CATEGORIES}
    for key in ("own_entropy_before", "own_entropy_after"):
        assert set(sharpen[key]) == set(CATEGORIES) and all(v >= 0 for v in sharpen[key].values())
    assert set(rec["pretrained_test"]) == set(rec["test"]) == set(CATEGORIES)
    assert rec["test"] != rec["pretrained_test"]  # the saved target is the fine-tuned one


def test_sharpening_prompts_follow_their_split_and_count_per_category(monkeypatch) -> None:
    from whiflash.testbed import sharpen
    from whiflash.testbed.presets import SharpenConfig

    calls = []
    monkeypatch.setattr(sharpen, "held_out_prompts",
                        lambda root, cat, n, split, seed, max_passes: calls.append((cat, n, split)) or [])
    cfg = SharpenConfig(split={"prose": "validation"}, prompts_per_category={"code": 1, "math": 2, "prose": 3,
                                                                             "agentic": 4})
    assert sharpen._prompt_ids(Path("."), None, cfg.split_of, cfg.count_of, 8, 0) == []
    assert calls == [("code", 1, "train"), ("math", 2, "train"), ("prose", 3, "validation"), ("agentic", 4, "train")]


def test_repetitive_continuations_are_recognised() -> None:
    from whiflash.testbed.drafter_data import repetitive

    assert repetitive([5, 6, 7] * 20) and not repetitive(list(range(60))) and not repetitive([5, 6] * 4)


def test_second_build_reuses_every_stage(micro: Path) -> None:
    weights = micro / "target" / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    m = build(micro, get_preset("micro"))
    last_run = m["log"][-len(STAGES):]
    assert [e["action"] for e in last_run] == ["reused"] * len(STAGES)
    assert weights.stat().st_mtime_ns == mtime


def test_changed_stage_config_rebuilds_only_downstream(micro: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "tb"  # a copy (a fraction of a second), not the session's testbed rebuilt back afterwards
    shutil.copytree(micro, copy)
    cfg = get_preset("micro")
    cfg.dflash.max_steps = 3
    m = build(copy, cfg)
    actions = {e["stage"]: e["action"] for e in m["log"][-len(STAGES):]}
    assert actions.pop("dflash") == actions.pop("acceptance") == "built"  # the changed stage and its reader
    assert set(actions.values()) == {"reused"}
    assert m["stages"]["dflash"]["steps"] == 3


def test_cpu_thread_count_is_part_of_the_training_fingerprints(micro: Path, tmp_path: Path, monkeypatch) -> None:
    """Threads set the order of CPU float reductions, so a build with other threads retrains, not reuses.
    The retraining is cut short where it would start (the point is that it starts), so this takes seconds."""
    import shutil

    from whiflash.testbed import target

    class Retrained(Exception):
        pass

    def refuse(*args, **kwargs):
        raise Retrained

    copy = tmp_path / "tb"
    shutil.copytree(micro, copy)
    monkeypatch.setattr(target, "train_target", refuse)
    cfg = get_preset("micro")
    m = build(copy, cfg, until="target")  # the preset's own thread count: every stage reused, nothing trained
    reused = dict.fromkeys(("corpus", "tokenizer", "tokens", "target"), "reused")
    assert {e["stage"]: e["action"] for e in m["log"][-4:]} == reused
    cfg.num_threads = 2
    with pytest.raises(Retrained):
        build(copy, cfg, until="target")
    log = json.loads((copy / "manifest.json").read_text())["log"]
    assert [e["action"] for e in log[-3:]] == ["reused"] * 3  # corpus, tokenizer, tokens: no thread count in theirs


def test_cli_build_reuses_and_prints_summary(micro: Path, capsys) -> None:
    from whiflash.testbed.__main__ import main

    main(["build", "--preset", "micro", "--out", str(micro), "--quiet", "true"])
    text = capsys.readouterr().out
    assert "reused" in text and "math" in text and "built" not in text
    steps = get_preset("micro").target.max_steps
    for sets in (["--set", f"target.max_steps={steps}"],  # one override: plain --set (was a parser error)
                 ["--set+", f"target.max_steps={steps}", "--set+", "corpus.seed=0"]):
        main(["build", "--preset", "micro", "--out", str(micro), "--quiet", "true", *sets])
        assert "built" not in capsys.readouterr().out  # the preset's own values: every stage reused
    with pytest.raises(Exception, match="target.max_stepz"):
        main(["build", "--preset", "micro", "--out", str(micro), "--quiet", "true", "--set", "target.max_stepz=1"])


def test_steps_alone_bound_training(micro: Path) -> None:
    m = _manifest(micro)
    cfg = get_preset("micro")
    assert m["stages"]["target"]["steps"] == cfg.target.max_steps
    assert m["stages"]["eagle3"]["steps"] == cfg.eagle3.max_steps and m["stages"]["dflash"]["steps"] == cfg.dflash.max_steps
    from whiflash.testbed.presets import PRESETS

    for name, make in PRESETS.items():  # no preset caps training by the clock
        p = make()
        assert p.target.max_minutes is p.eagle3.max_minutes is p.dflash.max_minutes is None, name


def test_time_cap_stops_the_build_instead_of_training_less(micro: Path, tmp_path: Path) -> None:
    import shutil

    import pytest

    from whiflash.testbed.manifest import fingerprint
    from whiflash.testbed.target import TimeCapExceeded

    out = tmp_path / "tb"
    shutil.copytree(micro, out)
    shutil.rmtree(out / "eagle3")  # forces the stage to run again
    cfg = get_preset("micro")
    cfg.eagle3.max_minutes = 1e-6
    with pytest.raises(TimeCapExceeded, match=r"eagle3: training passed its time cap .* after 1 of 40 steps"):
        build(out, cfg)
    assert not (out / "eagle3").exists() and not _manifest(out)["stages"].get("eagle3", {}).get("done")
    # A cap cannot change what a finished stage holds, so it is not part of any fingerprint.
    assert fingerprint(cfg.eagle3) == fingerprint(get_preset("micro").eagle3)


def test_two_builds_of_a_preset_are_identical(micro: Path, tmp_path: Path) -> None:
    """A build is a function of its preset and seed: retraining every model stage gives the same bytes and taus,
    also with the two drafter stages trained at once (`concurrent_drafters`, DFlash in a child process), where the
    cores hold both."""
    import os
    import shutil
    from dataclasses import replace

    out = tmp_path / "again"
    shutil.copytree(micro, out)
    for stage in ("target", "responses", "eagle3", "dflash", "acceptance"):
        shutil.rmtree(out / stage)
    cfg = replace(get_preset("micro"), concurrent_drafters=True)
    m = build(out, cfg)
    first = _manifest(micro)
    assert "concurrent_with" not in first["stages"]["dflash"]
    for stage in ("target", "responses", "eagle3", "dflash"):
        assert m["stages"][stage]["output_sha256"] == first["stages"][stage]["output_sha256"], stage
    assert m["stages"]["acceptance"]["tau"] == first["stages"]["acceptance"]["tau"]
    if 2 * cfg.num_threads <= (os.cpu_count() or 1):
        assert m["stages"]["dflash"]["concurrent_with"] == "eagle3" and not (out / ".concurrent-dflash").exists()
        assert set(m["stages"]["dflash"]) - set(first["stages"]["dflash"]) == {"concurrent_with"}


def test_a_failed_dflash_child_is_trained_in_the_build_after_all(tmp_path: Path, caplog) -> None:
    """`concurrent_drafters`: a DFlash child process that fails costs time, not the build."""
    import multiprocessing
    import sys

    from whiflash.testbed.build import _join_dflash

    folder = tmp_path / ".concurrent-dflash"
    folder.mkdir()
    proc = multiprocessing.get_context("spawn").Process(target=sys.exit, args=(3,))
    proc.start()
    with caplog.at_level("WARNING"):
        assert _join_dflash((proc, folder), tmp_path / "stage", lambda: {"steps": 7}) == {"steps": 7}
    assert "exit code 3: training it here instead" in caplog.text and not folder.exists()


def test_the_dflash_child_starts_under_a_build_read_from_stdin() -> None:
    """The GPU scripts run the build from a script on stdin (`python3 - <<EOF`): its main module's `__file__` is
    "<stdin>", which a spawned child cannot re-run. `spawn_child` starts the child all the same (a plain spawn dies
    with exit code 1, and the DFlash stage then trains after eagle3 instead of beside it) and leaves `__file__` as
    it was."""
    import subprocess
    import sys

    script = """
import sys
from whiflash.testbed.build import spawn_child

if __name__ == "__main__":
    proc = spawn_child(sys.exit, (5,), name="probe")
    proc.join()
    print(proc.exitcode, __file__)
"""
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["5", "<stdin>"], done.stderr


def test_a_dflash_child_ends_when_its_build_is_killed(tmp_path: Path) -> None:
    """A build stopped by SIGKILL (a device command's limit) runs no exit handlers: its DFlash child notices that its
    parent is gone (`exit_with_parent`) and ends, instead of training on beside the next build's."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pid_file, script = tmp_path / "child.pid", tmp_path / "build.py"
    script.write_text(f"""
import multiprocessing, time
from whiflash.testbed.build import exit_with_parent

def child(path, parent):
    import os
    exit_with_parent(parent, every=0.05)
    open(path, "w").write(str(os.getpid()))
    time.sleep(60)

if __name__ == "__main__":
    import os
    args = ({str(pid_file)!r}, os.getpid())
    multiprocessing.get_context("spawn").Process(target=child, args=args, daemon=True).start()
    time.sleep(60)
""")  # a file: a spawned child imports its target from the parent's main module
    build = subprocess.Popen([sys.executable, str(script)])
    deadline = time.monotonic() + 60
    while not pid_file.is_file() or not pid_file.read_text():
        assert time.monotonic() < deadline and build.poll() is None, "the child never started"
        time.sleep(0.05)
    child = int(pid_file.read_text())
    os.kill(child, 0)  # alive while the build is
    build.send_signal(signal.SIGKILL)
    build.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the child outlived its killed build by 10 s")


def test_tap_layers_follow_the_released_rules_at_real_depth() -> None:
    from whiflash.testbed.drafter_data import tap_layers

    assert tap_layers("eagle3", 36) == [1, 17, 32] and tap_layers("dflash", 36) == [1, 9, 17, 25, 33]
    assert tap_layers("eagle3", 4) == [0, 2, 3] and tap_layers("dflash", 4) == [0, 1, 2, 3]  # too shallow: even
    small = get_preset("small")
    assert small.target.num_hidden_layers == 36 and small.dflash.num_hidden_layers == 5
    assert small.dflash.block_size == 16 and small.eagle3.ttt_length == 7


def test_a_drafter_data_subset_takes_the_categories_in_turn(tmp_path: Path) -> None:
    from whiflash.testbed.drafter_data import response_samples

    (tmp_path / "responses").mkdir()
    rows = [{"id": f"{c}{i}", "category": c, "prompt_ids": [5, 6], "response_ids": [7, 8, 9][:1 + i % 3]}
            for c in ("code", "math") for i in range(4)]
    with open(tmp_path / "responses" / "responses.jsonl", "w") as fh:
        fh.write("\n".join(json.dumps(r) for r in rows) + "\n")
    every = response_samples(tmp_path)
    assert len(every) == 4 and {s.category for s in every} == {"code", "math"}  # one-token responses dropped
    subset = response_samples(tmp_path, 3)
    assert [s.category for s in subset] == ["code", "math", "code"]
    assert all(int(s.loss_mask.sum()) == s.ids.numel() - 2 for s in subset)


def test_responses_take_a_count_per_category(micro: Path, tmp_path: Path) -> None:
    """``responses.prompts_per_category`` as a mapping: that many responses of each category."""
    from dataclasses import replace

    from whiflash.testbed.drafter_data import generate_responses

    counts = {"code": 1, "math": 3, "prose": 2, "agentic": 1}
    cfg = replace(get_preset("micro").responses, prompts_per_category=counts, max_new_tokens=4)
    figures = generate_responses(micro, cfg, tmp_path)
    assert {c: f["prompts"] for c, f in figures["per_category"].items()} == counts
    rows = [json.loads(line) for line in (tmp_path / "responses.jsonl").read_text().splitlines()]
    assert [r["category"] for r in rows] == ["code", "math", "math", "math", "prose", "prose", "agentic"]


def test_a_drafter_mix_redraws_the_categories_to_their_shares(tmp_path: Path) -> None:
    """``eagle3.mix`` / ``dflash.mix``: as many sequences as responses, each category its share (its responses
    repeated where it has too few, dropped at share 0); a bad mix is refused by name before the build starts."""
    from dataclasses import replace

    from whiflash.testbed.drafter_data import response_samples

    (tmp_path / "responses").mkdir()
    rows = [{"id": f"{c}{i}", "category": c, "prompt_ids": [5], "response_ids": [i, i + 1]}
            for c, n in (("code", 6), ("math", 2), ("prose", 2)) for i in range(n)]
    with open(tmp_path / "responses" / "responses.jsonl", "w") as fh:
        fh.write("\n".join(json.dumps(r) for r in rows) + "\n")
    mixed = response_samples(tmp_path, mix={"prose": 3, "math": 1, "code": 0})
    assert len(mixed) == 10 and [s.category for s in mixed].count("prose") == 8  # 10 x 3/4, rounded
    prose = [s.ids.tolist() for s in mixed if s.category == "prose"]
    assert prose == [[5, 0, 1], [5, 1, 2]] * 4  # in file order, repeated
    assert [s.category for s in response_samples(tmp_path, 3, {"prose": 1, "math": 1})] == ["prose", "math", "prose"]
    with pytest.raises(ValueError, match=r"eagle3\.mix: the responses hold no sequence of \['agentic'\]"):
        response_samples(tmp_path, mix={"agentic": 1}, field="eagle3.mix")
    cfg = get_preset("micro")
    for bad, why in (({"poetry": 1}, r"unknown: \['poetry'\]"), ({"code": -1}, "shares >= 0"),
                     ({"math": math.nan}, "nan"), ({"code": 0}, "not all 0"), ([0.5, 0.5], "a mapping")):
        with pytest.raises(ValueError, match=rf"dflash\.mix: expected .*{why}"):
            build(tmp_path / "never", replace(cfg, dflash=replace(cfg.dflash, mix=bad)))
    assert not (tmp_path / "never").exists()


def test_acceptance_measures_drafter_snapshots_against_training_tokens(micro: Path) -> None:
    """Snapshots taken during drafter training get tau per category, beside the final drafter, in token order."""
    from whiflash.testbed.target import Snapshots

    curve = _manifest(micro)["acceptance"]["training_curve"]
    for kind in ("eagle3", "dflash"):
        points = curve[kind]
        assert [p["steps"] for p in points] == [20, 40]  # micro: snapshots=[0.5] of 40 steps, then the final
        assert 0 < points[0]["response_tokens_seen"] < points[1]["response_tokens_seen"]
        assert set(points[0]["tau"]) == set(CATEGORIES) and all(t >= 1 for t in points[0]["tau"].values())
        assert points[1]["tau"] == _manifest(micro)["acceptance"]["tau"][kind]
        assert (micro / kind / "snapshots" / "step_20" / "model.safetensors").is_file()
    assert Snapshots.at([0.25, 0.5], 1000) == [250, 500] and Snapshots.at([0.01], 10) == [1]
    with pytest.raises(ValueError, match="snapshots: 1.5"):
        Snapshots.at([1.5], 10)


def test_the_responses_benchmark_runs_each_generator_variant_on_a_built_target(micro, tmp_path, monkeypatch,
                                                                                capsys) -> None:
    """scripts/bench_responses.py on the `micro` testbed: the whole, shed and shed+span generators give the same
    continuations on the CPU (fp32), each with its seconds and tokens/s; a folder with no target is refused."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("bench_responses", Path(__file__).resolve().parents[1] / "scripts"
                                                  / "bench_responses.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "ab.json"
    args = ["bench_responses.py", "--preset", "micro", "--device", "cpu"]
    monkeypatch.setattr(sys, "argv", [*args, "--testbed", str(micro), "--json", str(out)])
    script.main()
    result = json.loads(out.read_text())
    assert list(result["variants"]) == ["whole", "shed", "shed+span"]
    tokens = {v["response_tokens"] for v in result["variants"].values()}
    assert len(tokens) == 1 and tokens.pop() > 0
    for v in result["variants"].values():
        assert v["same_share"] == 1.0 and v["generate_seconds"] > 0 and v["tokens_per_second"] > 0
    assert "| shed+span |" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", [*args, "--testbed", str(tmp_path)])
    with pytest.raises(SystemExit):
        script.main()
    assert f"--testbed {tmp_path}: no target/config.json" in capsys.readouterr().err


def test_the_drafter_step_profile_splits_a_step_into_the_feature_forward_and_the_drafter(tmp_path, monkeypatch,
                                                                                        capsys) -> None:
    """scripts/profile_drafter_step.py at `micro`'s shapes on the CPU: each stage's step, its feature forward and
    the step with the features given, and an operator table."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("profile_drafter_step", Path(__file__).resolve().parents[1]
                                                  / "scripts" / "profile_drafter_step.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "steps.json"
    monkeypatch.setattr(sys, "argv", ["profile_drafter_step.py", "--preset", "micro", "--device", "cpu", "--steps", "1",
                                      "--prompt", "16", "--response", "16", "--top", "3", "--json", str(out)])
    script.main()
    result = json.loads(out.read_text())
    for kind in ("eagle3", "dflash"):
        r = result[kind]
        assert 0 < r["features_s"] and 0 < r["drafter_s"] and 0 < r["step_s"]
        assert r["features_share"] == pytest.approx(r["features_s"] / r["step_s"], abs=1e-2)  # each rounded
    printed = capsys.readouterr().out
    assert "eagle3: step" in printed and "dflash: step" in printed and "Name" in printed
