"""How much of its answers the target recalls from its training text: per category of a bench run on testbed
prompts, the share of the greedy answers' words that lie inside a run of `--n` words (8) found verbatim in the
testbed corpus's training split, beside the same share for what truly followed each prompt in its document.

    python scripts/copy_rate.py RUN_DIR --testbed TB [--corpus DIR] [--n 8] [--method ar] [--json FILE]

A drafter predicts well what its target says often, and a small target says most confidently what it has
memorised: recalled training text is one way a testbed's answers become predictable, and a target that recalls
everything is a copy machine rather than a model of an instruction-tuned one. The reference column is the
baseline: the same share over each prompt's true continuation, cut to its answer's length in words (the phrases
the world itself repeats across documents: templates, signatures, house style), which a target that generalises
matches and one that recalls exceeds. Words are whitespace-separated; `--method` (AR by default) picks the rows
read: the benchmark is lossless, so every method's answer is the same text up to bf16 near-ties. A sample names
its prompt `testbed-SPLIT-DOCUMENT@OFFSET` (`eval.datasets`), which finds the document in the corpus's SPLIT.

`--corpus` is the folder of the corpus stage's split files (default `TB/corpus`); the corpus is a function of the
build's config, so a copy rebuilt elsewhere from the same preset and overrides serves too.
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np


def ngram_keys(words: list[str], n: int) -> np.ndarray:
    """One int64 key per run of `n` consecutive words (Python's hash of the tuple: stable within a process)."""
    return np.fromiter((hash(tuple(words[i : i + n])) for i in range(len(words) - n + 1)), dtype=np.int64)


def covered(words: list[str], known: np.ndarray, n: int) -> float:
    """Share of `words` inside at least one run of `n` words whose key is in the sorted array `known`."""
    if not words:
        return 0.0
    keys = ngram_keys(words, n)
    hit = np.zeros(len(words), dtype=bool)
    if len(keys) and len(known):
        at = np.searchsorted(known, keys).clip(max=len(known) - 1)
        for start in np.flatnonzero(known[at] == keys):
            hit[start : start + n] = True
    return float(hit.mean())


def read_documents(path: Path) -> Iterable[dict[str, Any]]:
    """The documents of a corpus split file (one JSON object a line with `category` and `text`)."""
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if line.strip():
                doc = json.loads(line)
                if not isinstance(doc, dict) or not isinstance(doc.get("text"), str) or "category" not in doc:
                    raise SystemExit(f"{path}:{number}: expected a corpus document with 'category' and 'text'")
                yield doc


def training_keys(path: Path, n: int) -> np.ndarray:
    """Sorted unique keys of every run of `n` words in the training split."""
    parts = [ngram_keys(doc["text"].split(), n) for doc in read_documents(path)]
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


def reference(sample: str, documents: dict[str, dict[str, str]]) -> str | None:
    """What followed the prompt of bench sample `sample` (`testbed-SPLIT-DOCUMENT@OFFSET`) in its document, or None
    where `documents` (split -> document id -> text) does not hold it (a prompt file's sample; another corpus)."""
    head, _, offset = sample.rpartition("@")
    for split, docs in documents.items():
        prefix = f"testbed-{split}-"
        if head.startswith(prefix) and head[len(prefix):] in docs and offset.isdigit():
            return docs[head[len(prefix):]][int(offset):]
    return None


def copy_table(rows: Iterable[dict[str, Any]], decode: Callable[[list[int]], str], known: np.ndarray,
               documents: dict[str, dict[str, str]], n: int = 8, method: str = "ar") -> dict[str, dict[str, Any]]:
    """category -> {answers, words, copied and copied_median (the answers' shares of words inside a known run),
    reference (the mean share of each prompt's true continuation, cut to its answer's length in words; None where
    no prompt's document is in `documents`) and references (how many prompts' documents were)}."""
    copied: dict[str, list[float]] = defaultdict(list)
    ref: dict[str, list[float]] = defaultdict(list)
    words: dict[str, list[int]] = defaultdict(list)
    for row in rows:
        if row["method"] != method:
            continue
        answer = decode(row["tokens"]).split()
        copied[row["category"]].append(covered(answer, known, n))
        words[row["category"]].append(len(answer))
        truth = reference(row["sample"], documents)
        if truth is not None:
            ref[row["category"]].append(covered(truth.split()[: max(len(answer), n)], known, n))
    return {cat: {"answers": len(s), "words": statistics.mean(words[cat]), "copied": statistics.mean(s),
                  "copied_median": statistics.median(s),
                  "reference": statistics.mean(ref[cat]) if ref[cat] else None, "references": len(ref[cat])}
            for cat, s in sorted(copied.items())}


def markdown(table: dict[str, dict[str, Any]], n: int) -> str:
    lines = [f"| category | answers | words an answer | answer words in a training {n}-gram (median) | "
             "reference words in one (prompts) |", "|---|---|---|---|---|"]
    for cat, r in table.items():
        ref = "—" if r["reference"] is None else f"{r['reference']:.1%} ({r['references']})"
        lines.append(f"| {cat} | {r['answers']} | {r['words']:.0f} | {r['copied']:.1%} ({r['copied_median']:.1%}) | "
                     f"{ref} |")
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
    documents = {split: {d["id"]: d["text"] for d in read_documents(corpus / f"{split}.jsonl")}
                 for split in sorted(splits) if (corpus / f"{split}.jsonl").is_file()}
    table = copy_table(rows, lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                       training_keys(corpus / "train.jsonl", args.n), documents, args.n, args.method)
    if not table:
        raise SystemExit(f"{samples}: no rows of method {args.method!r}")
    print(markdown(table, args.n))
    if args.json:
        args.json.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
