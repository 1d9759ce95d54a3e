"""The responses stage on a built testbed with each of the generator's savings: seconds, tokens/s, identical answers.

Usage: python scripts/bench_responses.py --testbed DIR [--preset small] [--prompts-per-category N]
       [--device cuda] [--json OUT]

Runs the stage's own generator (`drafter_data.generate_responses`: the preset's responses config, its prompts, its
batches) on the built target three times, into temporary folders, after a warm-up of 8 prompts a category:
`whole` keeps every row of a batch until the batch ends and attends over the whole cache each step; `shed` sheds
ended rows (`generate.SHED_MIN_ROWS`); `shed+span` also attends over the columns written so far
(`generate.SPAN_CHUNK`), as the build does. It prints each run's generation seconds and useful tokens/s beside the
share of continuations identical to `whole`'s. Greedy rows are each their own decode either way; under bf16 a
batch of another size or span may take other kernels, so near-ties can flip.
"""
from __future__ import annotations

import argparse
import json
import logging
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

import whiflash.testbed.generate as generate
from whiflash.testbed.drafter_data import generate_responses
from whiflash.testbed.presets import get_preset

VARIANTS = {"whole": (1 << 62, 0), "shed": (generate.SHED_MIN_ROWS, 0),
            "shed+span": (generate.SHED_MIN_ROWS, generate.SPAN_CHUNK)}
"""Name -> (``SHED_MIN_ROWS``, ``SPAN_CHUNK``) of each run."""


def run(testbed: Path, cfg, device: str, shed_min_rows: int, span_chunk: int) -> tuple[dict, list[list[int]]]:
    """One responses stage under the generator settings given: its figures and its continuations."""
    defaults = generate.SHED_MIN_ROWS, generate.SPAN_CHUNK
    generate.SHED_MIN_ROWS, generate.SPAN_CHUNK = shed_min_rows, span_chunk
    try:
        with tempfile.TemporaryDirectory() as out:
            figures = generate_responses(testbed, cfg, Path(out), device=device)
            rows = [json.loads(line)["response_ids"] for line in open(Path(out) / "responses.jsonl")]
    finally:
        generate.SHED_MIN_ROWS, generate.SPAN_CHUNK = defaults
    return figures, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--testbed", type=Path, required=True, help="a testbed folder whose target stage is built")
    ap.add_argument("--preset", default="small", help="the preset whose responses config runs")
    ap.add_argument("--prompts-per-category", type=int, default=None, help="fewer prompts than the preset's")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if not (args.testbed / "target" / "config.json").is_file():
        ap.error(f"--testbed {args.testbed}: no target/config.json (build the testbed's target stage first)")
    cfg = get_preset(args.preset).responses
    if args.prompts_per_category:
        cfg = replace(cfg, prompts_per_category=args.prompts_per_category)
    run(args.testbed, replace(cfg, prompts_per_category=8), args.device, *VARIANTS["whole"])  # warm-up
    runs = {name: run(args.testbed, cfg, args.device, *settings) for name, settings in VARIANTS.items()}
    base_figures, base_rows = runs["whole"]
    result = {"prompts": len(base_rows), "variants": {}}
    print("| generator | response tokens | generation s | tokens/s | speedup | identical to whole |")
    print("|---|---|---|---|---|---|")
    for name, (figures, rows) in runs.items():
        same = sum(a == b for a, b in zip(base_rows, rows)) / max(1, len(base_rows))
        speedup = base_figures["generate_seconds"] / max(figures["generate_seconds"], 1e-9)
        result["variants"][name] = {**{k: figures[k] for k in ("response_tokens", "generate_seconds", "tokens_per_second")},
                                    "settings": VARIANTS[name], "speedup": round(speedup, 3), "same_share": round(same, 4)}
        print(f"| {name} | {figures['response_tokens']:,} | {figures['generate_seconds']} | "
              f"{figures['tokens_per_second']:,} | {speedup:.2f}x | {same:.1%} of {len(rows):,} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
