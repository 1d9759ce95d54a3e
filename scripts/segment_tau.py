"""Where within its sequences each drafter pays: per segment of the agentic transcripts a bench run decoded, each
method's rounds and mean τ there, and which slot a routed method took.

    python scripts/segment_tau.py RUN_DIR --tokenizer TB/tokenizer [--category agentic] [--json FILE]

A round is labelled by the transcript line its first token lies in: `Thought`, `Call`, `Result` or `Answer` (an
unlabelled line, such as a code excerpt, belongs to the labelled line above it; the output opens in the `Thought`
its prompt ends with), and `Thought/explain` from where a thought names the object it explains
(`corpus.agent_explanations`: "... `json.dumps`: ...") to the end of that thought. The benchmark is lossless, so
every method decodes the same tokens and a segment's τ compares the drafters on the same text; a routed method's
`slot 1` share says where it chose the second drafter of its pair.
"""
from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

LABELS = ("Thought:", "Call:", "Result:", "Answer:")
EXPLAINED = re.compile(r"`[^`\s]+`: ")
"""Where a thought names the object it explains (agentgen's explanation intros end so)."""


def segment(text: str, at: int | None = None) -> str:
    """The segment that character `at` of `text` (a transcript's output after its prompt's ``Thought:``; default
    its last character) lies in: the label of its line or of the nearest labelled line above; a newline belongs to
    the line after it, as a round that opens on one drafts that line."""
    at = len(text) - 1 if at is None else at
    while at < len(text) - 1 and text[at] == "\n":
        at += 1
    begin, end = text.rfind("\n", 0, at) + 1, text.find("\n", at)
    current = text[begin : len(text) if end < 0 else end]
    for line, seen in [(current, text[begin : at + 1]), *((ln, ln) for ln in reversed(text[:begin].split("\n")))]:
        for label in LABELS:
            if line.startswith(label):  # in at's own line, only what the round's first token follows counts
                name = label[:-1]
                return f"{name}/explain" if name == "Thought" and EXPLAINED.search(seen) else name
    return "?"


def round_segments(tokens: list[int], taus: Iterable[int], decode: Callable[[list[int]], str]) -> list[str]:
    """The segment of each round's first token."""
    text = "Thought:" + decode(tokens)
    out, pos = [], 0
    for tau in taus:
        out.append(segment(text, len("Thought:") + len(decode(tokens[:pos]))))
        pos += tau
    return out


def segment_table(rows: Iterable[dict[str, Any]], decode: Callable[[list[int]], str],
                  category: str = "agentic") -> dict[str, dict[str, dict[str, float]]]:
    """segment -> method -> {rounds, tokens, mean_tau[, slot1_share]} over the category's rows."""
    acc: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    for row in rows:
        if row["category"] != category or row["method"] == "ar" or not row["taus"]:
            continue
        slots = row.get("slots") or []
        for i, (seg, tau) in enumerate(zip(round_segments(row["tokens"], row["taus"], decode), row["taus"])):
            cell = acc[seg][row["method"]]
            cell["rounds"] += 1
            cell["tokens"] += tau
            if row.get("slot_methods") and i < len(slots):
                cell["slot1"] += slots[i] == 1
    table: dict[str, dict[str, dict[str, float]]] = {}
    for seg, methods in sorted(acc.items()):
        table[seg] = {}
        for m, c in sorted(methods.items()):
            entry = {"rounds": int(c["rounds"]), "tokens": int(c["tokens"]), "mean_tau": c["tokens"] / c["rounds"]}
            if "slot1" in c:
                entry["slot1_share"] = c["slot1"] / c["rounds"]
            table[seg][m] = entry
    return table


def markdown(table: dict[str, dict[str, dict[str, float]]]) -> str:
    """One line per segment: its share of the tokens, then each method's mean τ (and slot-1 share)."""
    methods = sorted({m for per in table.values() for m in per})
    total = sum(max(c["tokens"] for c in per.values()) for per in table.values()) or 1
    lines = ["| segment | share of tokens | " + " | ".join(methods) + " |", "|---" * (len(methods) + 2) + "|"]
    for seg, per in table.items():
        cells = []
        for m in methods:
            c = per.get(m)
            cells.append("" if c is None else f"{c['mean_tau']:.2f}"
                         + (f" (slot 1: {c['slot1_share']:.0%})" if "slot1_share" in c else ""))
        lines.append(f"| {seg} | {max(c['tokens'] for c in per.values()) / total:.0%} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a bench run folder (its samples.jsonl) or a samples.jsonl")
    ap.add_argument("--tokenizer", type=Path, required=True, help="the testbed's tokenizer folder (tokenizer.json)")
    ap.add_argument("--category", default="agentic", help="the category whose rows to label (default agentic)")
    ap.add_argument("--json", type=Path, help="also write the table as JSON here")
    args = ap.parse_args(argv)
    from tokenizers import Tokenizer

    samples = args.run / "samples.jsonl" if args.run.is_dir() else args.run
    tok_file = args.tokenizer / "tokenizer.json"
    for path, what in ((samples, "a bench run's samples.jsonl"), (tok_file, "the testbed tokenizer's tokenizer.json")):
        if not path.is_file():
            raise SystemExit(f"{path}: not found; expected {what}")
    tokenizer = Tokenizer.from_file(str(tok_file))
    with open(samples, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    table = segment_table(rows, tokenizer.decode, args.category)
    if not table:
        raise SystemExit(f"{samples}: no {args.category!r} rows of a speculative method")
    print(markdown(table))
    if args.json:
        args.json.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
