"""scripts/copy_rate.py: the share of answer words the target recalls from its training text."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

_spec = importlib.util.spec_from_file_location("copy_rate", Path(__file__).parents[1] / "scripts/copy_rate.py")
copy_rate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(copy_rate)


def _known(text: str, n: int) -> np.ndarray:
    return np.unique(copy_rate.ngram_keys(text.split(), n))


def _recalled(text: str, known: np.ndarray, n: int = 3) -> float:
    return copy_rate.share(copy_rate.recalled(text.split(), known, n))


def _in_context(text: str, context: str, n: int = 3) -> float:
    return copy_rate.share(copy_rate.in_context(text.split(), context.split(), n))


def test_words_inside_a_known_run_count_and_no_others() -> None:
    known = _known("a b c d e f", 3)
    assert _recalled("x a b c y", known) == pytest.approx(3 / 5)
    assert _recalled("a b c d", known) == 1.0  # overlapping runs cover every word once
    assert _recalled("a b x c d", known) == 0.0  # no run of 3 is verbatim
    assert _recalled("a b", known) == 0.0 and _recalled("", known) == 0.0
    assert _recalled("a b c", np.zeros(0, dtype=np.int64)) == 0.0


def test_in_context_counts_runs_of_the_context_and_earlier_in_the_text() -> None:
    assert _in_context("x y z w", "a x y z") == pytest.approx(3 / 4)
    assert _in_context("p q r s p q r", "") == pytest.approx(3 / 7)  # the second p q r repeats the first
    assert _in_context("p q r", "") == 0.0  # a run is not its own earlier occurrence
    assert _in_context("", "a b c") == 0.0


def test_rounds_split_by_whether_they_open_on_a_recalled_word() -> None:
    known = _known("the cat sat on", 3)
    out = " the cat sat on a new rug"  # one character a token: rounds open at "the", at "sat" and at "new"
    ids = [ord(c) for c in out]
    cut = [len(" the cat "), len("sat on a "), len("new rug")]
    rows = [{"category": "prose", "method": "dflash", "taus": cut, "tokens": ids},
            {"category": "prose", "method": "ar", "taus": [1] * len(ids), "tokens": ids}]
    taus = copy_rate.round_taus(rows, _decode, known, 3)
    assert list(taus["prose"]) == ["dflash"]  # AR has no rounds
    assert taus["prose"]["dflash"]["recalled"] == {"rounds": 2, "tokens": cut[0] + cut[1],
                                                    "mean_tau": (cut[0] + cut[1]) / 2}
    assert taus["prose"]["dflash"]["new"]["rounds"] == 1 and taus["prose"]["dflash"]["new"]["tokens"] == cut[2]


def _decode(ids: list[int]) -> str:  # one character a token
    return "".join(map(chr, ids))


def test_table_compares_answers_with_their_prompts_true_continuations(tmp_path, capsys) -> None:
    corpus = tmp_path / "tb" / "corpus"
    corpus.mkdir(parents=True)
    train = [{"id": "prose:a", "category": "prose", "text": "the cat sat on the mat today and then slept"}]
    test = [{"id": "prose:b", "category": "prose", "text": "Q: where? A: it sat on a rug all day long"
                                                             " said x"},
            {"id": "code:c", "category": "code", "text": "def f(): return the cat sat on the mat"}]
    for name, docs in (("train", train), ("test", test)):
        (corpus / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    answer = " the cat sat on the mat today x"  # 7 of 8 words recalled, none in its document
    offset_b = test[0]["text"].index(" it")
    rows = [{"sample": f"testbed-test-prose:b@{offset_b}", "dataset": "testbed:test", "category": "prose",
             "method": "ar", "tokens": [ord(c) for c in answer]},
            {"sample": f"testbed-test-prose:b@{offset_b}", "dataset": "testbed:test", "category": "prose",
             "method": "dflash", "tokens": [ord(c) for c in "nothing at all here"]},
            {"sample": "mt_bench-1", "dataset": "mt_bench.jsonl", "category": "code", "method": "ar",
             "tokens": [ord(c) for c in "return the cat sat on the mat"]}]
    documents = {"test": {d["id"]: d["text"] for d in test}}
    table = copy_rate.copy_table(rows, _decode, copy_rate.training_keys(corpus, 3), documents, n=3)
    assert table["prose"]["recalled"] == pytest.approx(7 / 8) and table["prose"]["in_context"] == 0.0
    # the true continuation, cut to the answer's 8 words ("... long said x" left out), is new text
    assert table["prose"]["reference_recalled"] == 0.0 and table["prose"]["references"] == 1
    assert table["code"]["recalled"] == pytest.approx(6 / 7)
    assert table["code"]["reference_recalled"] is None and table["code"]["references"] == 0  # a prompt file's row
    # the CLI: the table, and clear errors for a missing tokenizer and a bad corpus line
    run = tmp_path / "run"
    run.mkdir()
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SystemExit, match="tokenizer.json: not found"):
        copy_rate.main([str(run), "--testbed", str(tmp_path / "tb")])
    from tokenizers import Tokenizer, models

    (tmp_path / "tb" / "tokenizer").mkdir()
    vocab = {chr(i): i for i in range(32, 127)}
    Tokenizer(models.WordLevel(vocab, unk_token=" ")).save(str(tmp_path / "tb" / "tokenizer" / "tokenizer.json"))
    copy_rate.main([str(run), "--testbed", str(tmp_path / "tb"), "--n", "3", "--json", str(tmp_path / "t.json")])
    out = capsys.readouterr().out
    assert "| prose | 1 |" in out
    assert json.loads((tmp_path / "t.json").read_text())["answers"]["prose"]["references"] == 1
    (corpus / "train.jsonl").write_text('{"id": "x"}\n')
    with pytest.raises(SystemExit, match=r"train.jsonl:1: expected a corpus document"):
        copy_rate.main([str(run), "--testbed", str(tmp_path / "tb")])
