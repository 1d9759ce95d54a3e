"""How much of its answers the target recalls from its training text, and what that is worth to each drafter: per
category of a bench run on testbed prompts,

- *recalled*: the share of the greedy answers' words inside a run of `--n` words (8) found verbatim in the
  corpus's training split;
- *in context*: the share inside a run found in the prompt's document before the cut or earlier in the answer
  (what a drafter could copy from the sequence itself);
- the same two shares for what truly followed each prompt, cut to its answer's length in words: the phrases the
  world itself repeats (templates, signatures, house style), which a target that generalises matches and a
  copy machine exceeds;
- each speculative method's τ over the rounds that open on a recalled word and over those that open on a new one.

    python scripts/copy_rate.py RUN_DIR --testbed TB [--corpus DIR] [--n 8] [--method ar] [--json FILE]

A drafter predicts well what its target says often, and a small target says most confidently what it has
memorised, so recall is one way a testbed's answers become predictable. Words are whitespace-separated;
`--method` (AR by default) picks the answers read: the benchmark is lossless, so every method's answer is the
same text up to bf16 near-ties. A sample names its prompt `testbed-SPLIT-DOCUMENT@OFFSET` (`eval.datasets`),
which finds the document in the corpus's SPLIT; a prompt file's sample has no true continuation, and its
context is its answer alone.

`--corpus` is the folder of the corpus stage's split files (default `TB/corpus`); the corpus is a function of the
build's config and of the interpreter's standard library, so a copy rebuilt elsewhere serves where the Python
version matches.
"""
from __future__ import annotations

import argparse
import bisect
import json
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from whiflash.testbed.corpus import read_corpus


def ngram_keys(words: list[str], n: int) -> np.ndarray:
    """One int64 key per run of `n` consecutive words (Python's hash of the tuple: stable within a process)."""
    return np.fromiter((hash(tuple(words[i : i + n])) for i in range(len(words) - n + 1)), dtype=np.int64)


def _mask(starts: np.ndarray, length: int, n: int) -> np.ndarray:
    """Which of `length` words lie inside at least one run of `n` words starting where `starts` is True."""
    hit = np.zeros(length, dtype=bool)
    for start in np.flatnonzero(starts):
        hit[start : start + n] = True
    return hit


def recalled(words: list[str], known: np.ndarray, n: int) -> np.ndarray:
    """Which of `words` lie inside at least one run of `n` words whose key is in the sorted array `known`."""
    keys = ngram_keys(words, n)
    if not len(keys) or not len(known):
        return np.zeros(len(words), dtype=bool)
    return _mask(known[np.searchsorted(known, keys).clip(max=len(known) - 1)] == keys, len(words), n)


def in_context(words: list[str], context: list[str], n: int) -> np.ndarray:
    """Which of `words` lie inside at least one run of `n` words found in `context` or earlier in `words`: what a
    drafter could copy from the sequence it is drafting for, without knowing the training text."""
    seen = set(ngram_keys(context, n).tolist())
    starts = np.zeros(max(len(words) - n + 1, 0), dtype=bool)
    for i, key in enumerate(ngram_keys(words, n).tolist()):
        starts[i] = key in seen
        seen.add(key)
    return _mask(starts, len(words), n)


def share(mask: np.ndarray) -> float:
    """The share of True in a word mask (0 for no words)."""
    return float(mask.mean()) if len(mask) else 0.0


def training_keys(corpus: Path, n: int) -> np.ndarray:
    """Sorted unique keys of every run of `n` words in the corpus folder's training split."""
    parts = [ngram_keys(doc["text"].split(), n) for doc in read_corpus(corpus, "train")]
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


def reference(sample: str, documents: dict[str, dict[str, str]]) -> tuple[str, str] | None:
    """The text of bench sample `sample`'s document (`testbed-SPLIT-DOCUMENT@OFFSET`) before and after its prompt's
    cut, or None where `documents` (split -> document id -> text) does not hold it (a prompt file's sample)."""
    head, _, offset = sample.rpartition("@")
    for split, docs in documents.items():
        prefix = f"testbed-{split}-"
        if head.startswith(prefix) and head[len(prefix):] in docs and offset.isdigit():
            text = docs[head[len(prefix):]]
            return text[: int(offset)], text[int(offset) :]
    return None


def copy_table(rows: Iterable[dict[str, Any]], decode: Callable[[list[int]], str], known: np.ndarray,
               documents: dict[str, dict[str, str]], n: int = 8, method: str = "ar") -> dict[str, dict[str, Any]]:
    """category -> {answers, words; recalled and recalled_median: the answers' shares of words inside a run of the
    training text; in_context: inside a run of the prompt's document before the cut or earlier in the answer;
    reference_recalled, reference_in_context: the same for each prompt's true continuation, cut to its answer's
    length in words (None where no prompt's document is in `documents`); references: how many were}."""
    acc: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row["method"] != method:
            continue
        answer = decode(row["tokens"]).split()
        cut = reference(row["sample"], documents)
        a = acc[row["category"]]
        a["words"].append(len(answer))
        a["recalled"].append(share(recalled(answer, known, n)))
        a["in_context"].append(share(in_context(answer, cut[0].split() if cut else [], n)))
        if cut is not None:
            truth = cut[1].split()[: max(len(answer), n)]
            a["reference_recalled"].append(share(recalled(truth, known, n)))
            a["reference_in_context"].append(share(in_context(truth, cut[0].split(), n)))
    table: dict[str, dict[str, Any]] = {}
    for cat, a in sorted(acc.items()):
        mean = {k: statistics.mean(v) if v else None for k, v in a.items()}
        table[cat] = {"answers": len(a["words"]), "words": mean["words"], "recalled": mean["recalled"],
                      "recalled_median": statistics.median(a["recalled"]), "in_context": mean["in_context"],
                      "reference_recalled": mean.get("reference_recalled"),
                      "reference_in_context": mean.get("reference_in_context"),
                      "references": len(a["reference_recalled"])}
    return table


def round_taus(rows: Iterable[dict[str, Any]], decode: Callable[[list[int]], str], known: np.ndarray,
               n: int = 8) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """category -> method -> {"recalled", "new"} -> {rounds, tokens, mean_tau}: each speculative method's rounds,
    split by whether the word the round's first token falls in (the next word, on whitespace) is recalled."""
    acc: dict = defaultdict(lambda: defaultdict(lambda: {k: {"rounds": 0, "tokens": 0} for k in ("recalled", "new")}))
    for row in rows:
        if row["method"] == "ar" or not row.get("taus"):  # AR's rows count one token a step
            continue
        tokens, text = row["tokens"], decode(row["tokens"])
        ends = [m.end() for m in re.finditer(r"\S+", text)]
        hit = recalled(text.split(), known, n)
        pos = 0
        for tau in row["taus"]:
            word = bisect.bisect_right(ends, len(decode(tokens[:pos])))
            c = acc[row["category"]][row["method"]]["recalled" if word < len(hit) and hit[word] else "new"]
            c["rounds"] += 1
            c["tokens"] += tau
            pos += tau
    return {cat: {m: {k: {**c, "mean_tau": c["tokens"] / c["rounds"] if c["rounds"] else float("nan")}
                      for k, c in per.items()} for m, per in sorted(methods.items())}
            for cat, methods in sorted(acc.items())}


def markdown(table: dict[str, dict[str, Any]], n: int) -> str:
    def pct(v: float | None) -> str:
        return "—" if v is None else f"{v:.1%}"

    lines = [f"Share of words inside a run of {n} words found verbatim in the training text (recalled) or in the "
             "prompt's document / earlier in the same text (in context).", "",
             "| category | answers | words an answer | answers: recalled (median) | in context | "
             "true continuations (prompts): recalled | in context |", "|---|---|---|---|---|---|---|"]
    for cat, r in table.items():
        lines.append(f"| {cat} | {r['answers']} | {r['words']:.0f} | {pct(r['recalled'])} "
                     f"({pct(r['recalled_median'])}) | {pct(r['in_context'])} | {pct(r['reference_recalled'])} "
                     f"({r['references']}) | {pct(r['reference_in_context'])} |")
    return "\n".join(lines)


def tau_markdown(taus: dict[str, dict[str, dict[str, dict[str, float]]]]) -> str:
    lines = ["τ of the rounds that open on a recalled word / on a new one (share of the method's tokens in recalled "
             "rounds):", "", "| category | method | τ recalled | τ new | recalled tokens |", "|---|---|---|---|---|"]
    for cat, methods in taus.items():
        for m, c in methods.items():
            tokens = c["recalled"]["tokens"] + c["new"]["tokens"]
            lines.append(f"| {cat} | {m} | {c['recalled']['mean_tau']:.2f} | {c['new']['mean_tau']:.2f} | "
                         f"{c['recalled']['tokens'] / tokens if tokens else 0:.0%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a bench run folder (its samples.jsonl) or a samples.jsonl")
    ap.add_argument("--testbed", type=Path, required=True, help="the testbed folder (its tokenizer/ and corpus/)")
    ap.add_argument("--corpus", type=Path, help="the corpus folder (train.jsonl, test.jsonl; default TB/corpus)")
    ap.add_argument("--n", type=int, default=8, help="words in a run that counts as recalled (default 8)")
    ap.add_argument("--method", default="ar", help="the method whose answers to read (default ar)")
    ap.add_argument("--json", type=Path, help="also write the table as JSON here")
    args = ap.parse_args(argv)
    if args.n < 1:
        raise SystemExit(f"--n: expected a positive number of words, got {args.n}")
    from tokenizers import Tokenizer

    corpus = args.corpus or args.testbed / "corpus"
    samples = args.run / "samples.jsonl" if args.run.is_dir() else args.run
    tok_file = args.testbed / "tokenizer" / "tokenizer.json"
    for path, what in ((samples, "a bench run's samples.jsonl"), (tok_file, "the testbed tokenizer's tokenizer.json"),
                       (corpus / "train.jsonl", "the corpus's training split (give --corpus)")):
        if not path.is_file():
            raise SystemExit(f"{path}: not found; expected {what}")
    tokenizer = Tokenizer.from_file(str(tok_file))
    with open(samples, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    splits = {r["dataset"].partition(":")[2] for r in rows if str(r.get("dataset", "")).startswith("testbed:")}
    try:
        documents = {split: {d["id"]: d["text"] for d in read_corpus(corpus, split)}
                     for split in sorted(splits) if (corpus / f"{split}.jsonl").is_file()}
        known = training_keys(corpus, args.n)
    except ValueError as e:  # a line that is not a corpus document, named by file and line
        raise SystemExit(str(e)) from None
    decode: Callable[[list[int]], str] = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
    table = copy_table(rows, decode, known, documents, args.n, args.method)
    if not table:
        raise SystemExit(f"{samples}: no rows of method {args.method!r}")
    taus = round_taus(rows, decode, known, args.n)
    print(markdown(table, args.n) + "\n\n" + tau_markdown(taus))
    if args.json:
        args.json.write_text(json.dumps({"answers": table, "rounds": taus}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
