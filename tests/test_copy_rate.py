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


def test_words_inside_a_known_run_count_and_no_others() -> None:
    known = _known("a b c d e f", 3)
    assert copy_rate.covered("x a b c y".split(), known, 3) == pytest.approx(3 / 5)
    assert copy_rate.covered("a b c d".split(), known, 3) == 1.0  # overlapping runs cover every word once
    assert copy_rate.covered("a b x c d".split(), known, 3) == 0.0  # no run of 3 is verbatim
    assert copy_rate.covered("a b".split(), known, 3) == 0.0 and copy_rate.covered([], known, 3) == 0.0
    assert copy_rate.covered("a b c".split(), np.zeros(0, dtype=np.int64), 3) == 0.0


def _decode(ids: list[int]) -> str:  # one character a token
    return "".join(map(chr, ids))


def test_table_compares_answers_with_their_prompts_true_continuations(tmp_path, capsys) -> None:
    corpus = tmp_path / "tb" / "corpus"
    corpus.mkdir(parents=True)
    train = [{"id": "prose:a", "category": "prose", "text": "the cat sat on the mat today and then slept"}]
    test = [{"id": "prose:b", "category": "prose", "text": "Q: where? A: it sat on a rug all day long"},
            {"id": "code:c", "category": "code", "text": "def f(): return the cat sat on the mat"}]
    for name, docs in (("train", train), ("test", test)):
        (corpus / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    answer = " the cat sat on the mat today x"  # 7 of 8 words recalled
    offset_b = test[0]["text"].index(" it")
    rows = [{"sample": f"testbed-test-prose:b@{offset_b}", "dataset": "testbed:test", "category": "prose",
             "method": "ar", "tokens": [ord(c) for c in answer]},
            {"sample": f"testbed-test-prose:b@{offset_b}", "dataset": "testbed:test", "category": "prose",
             "method": "dflash", "tokens": [ord(c) for c in "nothing at all here"]},
            {"sample": "mt_bench-1", "dataset": "mt_bench.jsonl", "category": "code", "method": "ar",
             "tokens": [ord(c) for c in "return the cat sat on the mat"]}]
    documents = {"test": {d["id"]: d["text"] for d in test}}
    table = copy_rate.copy_table(rows, _decode, copy_rate.training_keys(corpus / "train.jsonl", 3), documents, n=3)
    assert table["prose"]["copied"] == pytest.approx(7 / 8)
    assert table["prose"]["reference"] == 0.0 and table["prose"]["references"] == 1  # "it sat on a rug ..." is new
    assert table["code"]["copied"] == pytest.approx(6 / 7)
    assert table["code"]["reference"] is None and table["code"]["references"] == 0  # a prompt file's row
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
    assert "| prose | 1 |" in out and json.loads((tmp_path / "t.json").read_text())["prose"]["references"] == 1
    (corpus / "train.jsonl").write_text('{"id": "x"}\n')
    with pytest.raises(SystemExit, match=r"train.jsonl:1: expected a corpus document"):
        copy_rate.main([str(run), "--testbed", str(tmp_path / "tb")])
