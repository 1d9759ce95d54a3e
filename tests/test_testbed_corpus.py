"""Testbed corpus, math generator, tokenizer and stage machinery (fast, no model training)."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from whiflash.testbed.corpus import SPLITS, _clean, assign_split, read_corpus, write_corpus
from whiflash.testbed.manifest import Manifest
from whiflash.testbed.mathgen import TEMPLATES, check_solution, generate_problems
from whiflash.testbed.presets import CATEGORIES, CorpusConfig, TokenizerConfig, apply_overrides, get_preset
from whiflash.testbed.tokenizer import MASK, SPECIAL_TOKENS, load_tokenizer, train_tokenizer

SMALL = CorpusConfig(math_problems=400, agent_transcripts=1_000, max_file_chars=20_000, validation_fraction=0.1,
                     test_fraction=0.1)


@pytest.fixture(scope="module")
def written_corpus(tmp_path_factory) -> tuple[Path, dict]:
    """The SMALL corpus, written once (seconds), with what ``write_corpus`` returned (its hash)."""
    out = tmp_path_factory.mktemp("corpus")
    return out, write_corpus(SMALL, out)


@pytest.fixture(scope="module")
def corpus_dir(written_corpus: tuple[Path, dict]) -> Path:
    return written_corpus[0]


def test_library_files_parsed_in_processes_give_the_same_corpus(written_corpus: tuple[Path, dict],
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`workers`: the library files parsed in two spawned processes write the very files one process writes."""
    import whiflash.testbed.corpus as corpus

    pools: list[int] = []

    class Counted(corpus.ProcessPoolExecutor):
        def __init__(self, workers: int, **kw) -> None:
            pools.append(workers)
            super().__init__(workers, **kw)

    monkeypatch.setattr(corpus, "ProcessPoolExecutor", Counted)
    out, first = written_corpus
    again = write_corpus(SMALL, tmp_path, workers=2)
    assert pools == [2]  # the files were parsed in a pool, not in this process
    assert again["sha256"] == first["sha256"]
    for split in SPLITS:
        assert (tmp_path / f"{split}.jsonl").read_bytes() == (out / f"{split}.jsonl").read_bytes(), split


def test_math_solutions_are_correct() -> None:
    problems = list(generate_problems(2000, seed=3))
    assert {p.template for p in problems} == set(TEMPLATES)
    for p in problems:
        assert check_solution(p.text) == p.answer
        assert p.answer >= 0
    # Varied numbers and names, not one problem repeated.
    assert len({p.question for p in problems}) > 1800, len({p.question for p in problems})


def test_a_math_scale_draws_larger_magnitudes_and_the_solutions_still_check() -> None:
    """`corpus.math_scale`: 1 is the default problems draw for draw; 10 draws prices, rates and counts up to ten
    times as large, every template's worked solution still exact; a scale below 1 is refused."""
    assert [p.text for p in generate_problems(200, seed=5, scale=1)] == [p.text for p in generate_problems(200, seed=5)]
    plain, scaled = list(generate_problems(1000, seed=5)), list(generate_problems(1000, seed=5, scale=10))
    assert {p.template for p in scaled} == set(TEMPLATES)
    for p in scaled:
        assert check_solution(p.text) == p.answer and p.answer >= 0
    digits = lambda ps: np.mean([len(v) for p in ps for v in re.findall(r">>(\d+)", p.solution)])  # noqa: E731
    assert digits(scaled) > digits(plain) + 0.7  # about one more digit a worked value
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="corpus.math_scale: expected an integer >= 1"):
            next(generate_problems(1, seed=0, scale=bad))


def test_math_checker_rejects_wrong_arithmetic() -> None:
    text = next(generate_problems(1, seed=0)).text
    bad = re.sub(r">>(\d+)", r">>9\1", text, count=1)  # corrupt the first step's shown value
    assert bad != text
    with pytest.raises(ValueError):
        check_solution(bad)
    with pytest.raises(ValueError):
        check_solution("Answer: 2+2 = <<2+2=5>>5\n#### 5")


def test_math_generator_is_seeded() -> None:
    a = [p.text for p in generate_problems(50, seed=7)]
    assert a == [p.text for p in generate_problems(50, seed=7)]
    assert a != [p.text for p in generate_problems(50, seed=8)]


@pytest.mark.parametrize("field, value", [("agent_explanations", "half"), ("agent_explanations", 1.5),
                                          ("chat_prose", -0.1), ("agent_code_excerpts", True), ("test_fraction", None)])
def test_a_share_out_of_range_is_refused_before_a_corpus_is_touched(corpus_dir: Path, field: str, value) -> None:
    from whiflash.testbed.corpus import collect_documents

    before = {s: (corpus_dir / f"{s}.jsonl").read_bytes() for s in SPLITS}
    bad = apply_overrides(get_preset("micro"), [f"corpus.{field}={json.dumps(value)}"]).corpus
    with pytest.raises(ValueError, match=rf"corpus\.{field}=.*expected a share, a number from 0 to 1"):
        collect_documents(bad)  # at the call, not at the first document
    with pytest.raises(ValueError, match=rf"corpus\.{field}="):
        write_corpus(bad, corpus_dir)
    assert {s: (corpus_dir / f"{s}.jsonl").read_bytes() for s in SPLITS} == before


def test_corpus_split_is_by_group_and_deterministic(corpus_dir: Path, tmp_path: Path) -> None:
    groups: dict[str, str] = {}
    cats: dict[str, Counter] = {s: Counter() for s in SPLITS}
    ids: set[str] = set()
    for split in SPLITS:
        for rec in read_corpus(corpus_dir, split):
            assert rec["id"] not in ids
            ids.add(rec["id"])
            assert groups.setdefault(rec["group"], split) == split, f"group {rec['group']} straddles splits"
            assert assign_split(rec["group"], SMALL) == split
            cats[split][rec["category"]] += 1
    for split in SPLITS:
        assert set(cats[split]) == set(CATEGORIES), f"{split} lacks a category: {cats[split]}"
    # A code file's docstrings (prose) share its group, so they share its split.
    code_groups = {r["group"] for r in read_corpus(corpus_dir, "test", "code")}
    assert code_groups & {r["group"] for r in read_corpus(corpus_dir, "test", "prose")}
    # Same config -> byte-identical corpus and hash.
    again = write_corpus(SMALL, tmp_path / "again")
    first = (corpus_dir / "train.jsonl").read_bytes()
    assert (tmp_path / "again" / "train.jsonl").read_bytes() == first
    other = write_corpus(CorpusConfig(**{**SMALL.__dict__, "seed": 1}), tmp_path / "other")
    assert other["sha256"] != again["sha256"]


def test_tokenizer_round_trip_and_mask_never_in_training_text(corpus_dir: Path, tmp_path: Path) -> None:
    info = train_tokenizer(corpus_dir, TokenizerConfig(vocab_size=600, train_chars_per_category=100_000),
                           tmp_path / "tok")
    tok = load_tokenizer(tmp_path / "tok")
    assert len(tok) == info["vocab_size"] == 600
    assert tok.mask_token == MASK and tok.mask_token_id == info["mask_token_id"]
    assert tok.eos_token_id is not None and tok.pad_token_id is not None
    assert len({tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}) == len(SPECIAL_TOKENS)
    for text in ["def f(x):\n    return x ** 2  # ünïcödé ✓\n", "Question: Ada has 3 apples.\nAnswer: 3"]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    special = set(info["special_token_ids"].values())
    for split in SPLITS:
        texts = [r["text"] for r in read_corpus(corpus_dir, split)]
        for enc in tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False):
            assert not special & set(enc.ids)
    # The guard is what makes this hold: the raw spelling would map to the mask id.
    raw = "x <|mask|> y <|endoftext|>"
    assert tok.mask_token_id in tok.encode(raw, add_special_tokens=False)
    assert not special & set(tok.encode(_clean(raw), add_special_tokens=False))  # how documents are stored


def test_overrides_and_presets() -> None:
    cfg = apply_overrides(get_preset("tiny"), ["target.max_steps=7", "device=cuda", 'target.mix={"math": 1.0}'])
    assert cfg.target.max_steps == 7 and cfg.device == "cuda" and cfg.target.mix == {"math": 1.0}
    assert get_preset("tiny").target.max_steps != 7  # presets are fresh copies
    with pytest.raises(ValueError, match=r"'nope' is not one of \['hidden_size'"):
        apply_overrides(cfg, ["target.nope=1"])
    with pytest.raises(ValueError, match=r"'targt' is not one of \['name'"):
        apply_overrides(cfg, ["targt.max_steps=1"])
    with pytest.raises(ValueError):
        get_preset("huge")


def test_auto_precision_is_bf16_only_where_it_runs_natively(monkeypatch: pytest.MonkeyPatch) -> None:
    from whiflash.testbed import presets

    tiny = get_preset("tiny")
    assert tiny.precision == "auto"
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert presets.resolve_precision(tiny).precision == "32-true"  # emulated bf16: fp32 is ~7x faster
    assert presets.resolve_precision(apply_overrides(tiny, ["device=cuda"])).precision == "bf16-mixed"
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert presets.resolve_precision(tiny).precision == "bf16-mixed"
    assert presets.resolve_precision(get_preset("micro")).precision == "32-true"  # an explicit setting stays
    assert tiny.precision == "auto"  # resolving returns a copy


def test_build_refuses_an_unknown_stage_before_writing(tmp_path: Path) -> None:
    from whiflash.testbed.build import build

    with pytest.raises(ValueError, match=r"until='taget': expected one of corpus, tokenizer"):
        build(tmp_path / "tb", get_preset("micro"), until="taget")
    for stage in ("responses", "target.sharpen"):
        for bad in ("test", '{"prose": "test"}', '{"poetry": "validation"}'):
            with pytest.raises(ValueError, match=rf"{stage}.split=.*: expected 'train' or 'validation', or a mapping"):
                build(tmp_path / "tb", apply_overrides(get_preset("micro"), [f"{stage}.split={bad}"]))
        for bad in ("0", '{"prose": 8}', '{"code": 1, "math": 1, "prose": 0, "agentic": 1}', '"many"'):
            with pytest.raises(ValueError, match=rf"{stage}.prompts_per_category=.*: expected a count >= 1, or a map"):
                build(tmp_path / "tb", apply_overrides(get_preset("micro"), [f"{stage}.prompts_per_category={bad}"]))
    with pytest.raises(ValueError, match=r"corpus.agent_explanations=2: expected a share, a number from 0 to 1"):
        build(tmp_path / "tb", apply_overrides(get_preset("micro"), ["corpus.agent_explanations=2"]))
    assert not (tmp_path / "tb").exists()


def test_manifest_stage_is_atomic_and_resumable(tmp_path: Path) -> None:
    man = Manifest(tmp_path, {"x": 1})
    calls = []

    def ok(d: Path) -> dict:
        calls.append(1)
        (d / "f.txt").write_text("hi")
        return {"n": 1}

    def crash(d: Path) -> dict:
        (d / "partial.txt").write_text("half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        man.run_stage("a", "fp1", crash)
    assert not (tmp_path / "a").exists() and "a" not in man.data["stages"]
    man = Manifest(tmp_path, {"x": 1})  # a new run after the crash
    man.run_stage("a", "fp1", ok)
    assert (tmp_path / "a" / "f.txt").read_text() == "hi" and not (tmp_path / ".tmp-a").exists()
    man = Manifest(tmp_path, {"x": 1})
    assert man.run_stage("a", "fp1", ok)["n"] == 1 and len(calls) == 1  # reused
    man.run_stage("a", "fp2", ok)  # changed fingerprint: rebuilt
    assert len(calls) == 2
    log = json.loads((tmp_path / "manifest.json").read_text())["log"]
    assert [e["action"] for e in log] == ["built", "reused", "built"]


def test_prompt_cuts() -> None:
    from whiflash.testbed.prompts import cut_prompt

    rng = random.Random(0)
    math = next(generate_problems(1, seed=0)).text
    prompt, ref = cut_prompt("math", math, rng)
    assert prompt.startswith("Question:") and prompt.endswith("\nAnswer:") and "####" in ref
    code = "import os\n\n\ndef f(x):\n    return x + 1\n\n\nclass A:\n    def g(self):\n        return 2\n" * 3
    prompt, ref = cut_prompt("code", code, rng)
    assert prompt.endswith(":") and ref.startswith("\n    ") and prompt + ref == code[len(code) - len(prompt + ref):]
    prose = "Return the thing. It is computed lazily and cached for later calls to the same function."
    prompt, ref = cut_prompt("prose", prose, rng)
    assert prose.startswith(prompt) and not prompt.endswith(" ") and prompt + ref == prose


def test_chat_prose_frames_the_same_docstrings_and_leaves_the_other_categories_alone(
        written_corpus: tuple[Path, dict], tmp_path: Path) -> None:
    from whiflash.testbed.prompts import cut_prompt

    corpus_dir, plain_written = written_corpus
    write_corpus(CorpusConfig(**{**SMALL.__dict__, "chat_prose": 1.0}), tmp_path / "chat")
    for split in SPLITS:
        plain = list(read_corpus(corpus_dir, split))
        chat = list(read_corpus(tmp_path / "chat", split))
        assert [r["id"] for r in chat] == [r["id"] for r in plain]  # the same documents, the same splits
        for a, b in zip(plain, chat):
            if a["category"] != "prose":  # agent transcripts quote the plain docstrings either way
                assert a == b
                continue
            question, _, answer = b["text"].partition("\nAssistant: ")
            assert question.startswith("User: ") and question.endswith(("?", "."))
            assert a["text"].split("\n\n")[0].strip() in answer  # the docstring's first paragraph is answered
    doc = next(r for r in read_corpus(tmp_path / "chat", "test", "prose") if "\nThe parameters are:\n- `" in r["text"])
    prompt, ref = cut_prompt("prose", doc["text"], random.Random(0))
    assert prompt.endswith("\nAssistant:") and prompt.startswith("User: ") and prompt + ref == doc["text"]
    cuts = [cut_prompt("prose", doc["text"], random.Random(seed), varied=True) for seed in range(8)]
    assert all("\nAssistant:" in p and p + r == doc["text"] for p, r in cuts)
    assert any(len(p) > len(prompt) for p, _ in cuts)  # later passes also cut inside the answer
    # a share: a seeded choice per document, the rest plain
    half = write_corpus(CorpusConfig(**{**SMALL.__dict__, "chat_prose": 0.5}), tmp_path / "half")
    texts = [r["text"] for s in SPLITS for r in read_corpus(tmp_path / "half", s, "prose")]
    share = sum(t.startswith("User: ") for t in texts) / len(texts)
    assert 0.4 < share < 0.6 and half["sha256"] != plain_written["sha256"]  # the plain corpus, as written once


def test_chat_signatures_leave_out_only_a_methods_receiver() -> None:
    from whiflash.testbed.chatgen import documented

    src = ('class A:\n    def f(self, x, *, cls=None):\n        """F."""\n\n'
           '    def g(cls, y=1, /, *args):\n        """G."""\n\n'
           'def h(cls=None, /, *, z=2):\n    """H."""\n')
    got = {d.name: (d.kind, d.signature, d.params) for d in documented("pkg/mod.py", src)}
    assert got == {"A.f": ("method", "(x, *, cls=None)", ("x", "cls")),
                   "A.g": ("method", "(y=1, /, *args)", ("y", "args")),
                   "h": ("function", "(cls=None, /, *, z=2)", ("cls", "z"))}
