"""The rows of benchmark prompt files that a bench with `--max-samples N` does not draw, as prompt files of
their own: calibration prompts for per-source thresholds, disjoint from the prompts the thresholds are benched on.

For each FILE, the rows outside upstream's selection of N (`whiflash.eval.selection.upstream_indices`, the
rows `whiflash-eval bench --dataset FILE --max-samples N --seed SEED` decodes), up to --per-file of them in a
seeded order, go to OUT/STEM.jsonl as records `{"id", "category", "prompt"}` (or `input_ids`): the first turn
(what datagen decodes) and the category the bench gives the file (`mt_bench.jsonl` -> chat, `gsm8k` -> math),
so rows that `whiflash-datagen --prompts OUT/STEM.jsonl` logs calibrate under the bench's own categories.

    python scripts/heldout_prompts.py ../shared/data/prompts/*.jsonl --bench-samples 10 --per-file 20 --out DIR
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from whiflash.eval.datasets import benchmark_category
from whiflash.eval.selection import upstream_indices
from whiflash.records import prompt_records


def heldout_rows(path: Path, bench_samples: int, per_file: int | None, seed: int = 0) -> list[dict]:
    """The records of `path` outside the bench's selection of `bench_samples`, at most `per_file`, shuffled by
    `seed` (the same rows for the same file and arguments)."""
    records = prompt_records(path)
    drawn = set(upstream_indices(len(records), bench_samples, seed))
    rest = [i for i in range(len(records)) if i not in drawn]
    random.Random(f"{seed}:{path.stem}").shuffle(rest)
    category = benchmark_category(path.stem) or path.stem
    out = []
    for i in rest[:per_file]:
        rec = records[i]
        body = {"input_ids": list(rec.input_ids)} if rec.input_ids is not None else {"prompt": rec.turns[0]}
        # datagen prefixes the stem again: a row then carries the id the bench gives the same prompt
        out.append({"id": rec.id.removeprefix(f"{path.stem}-"), "category": category, **body})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="JSONL prompt files (as given to whiflash-eval --dataset)")
    ap.add_argument("--bench-samples", type=int, required=True, help="the bench's --max-samples N")
    ap.add_argument("--per-file", type=int, default=None, help="at most this many rows a file (default: all left)")
    ap.add_argument("--seed", type=int, default=0, help="the bench's --seed (default 0)")
    ap.add_argument("--out", type=Path, required=True, help="folder for OUT/STEM.jsonl")
    args = ap.parse_args(argv)
    if args.per_file is not None and args.per_file < 1:
        ap.error(f"--per-file: expected an integer >= 1, got {args.per_file}")
    stems = [f.stem for f in args.files]
    if len(set(stems)) != len(stems):
        ap.error(f"two files share a stem ({', '.join(sorted(stems))}): OUT/STEM.jsonl would overwrite one")
    args.out.mkdir(parents=True, exist_ok=True)
    for f in args.files:
        rows = heldout_rows(f, args.bench_samples, args.per_file, args.seed)
        if not rows:
            raise SystemExit(f"{f}: every row is in the bench's selection of {args.bench_samples}; nothing to hold out")
        dest = args.out / f"{f.stem}.jsonl"
        tmp = dest.with_suffix(".jsonl.tmp")  # a killed run leaves no half-written file under the real name
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.replace(dest)
        print(f"{dest}: {len(rows)} rows ({rows[0]['category']}) outside the bench's {args.bench_samples} of {f.name}")


if __name__ == "__main__":
    main()
