"""The responses stage on a built testbed, with and without shedding ended rows: seconds, tokens/s, identical answers.

Usage: python scripts/bench_responses.py --testbed DIR [--preset small] [--prompts-per-category N]
       [--device cuda] [--json OUT]

Runs the stage's own generator (`drafter_data.generate_responses`: the preset's responses config, its prompts, its
batches) on the built target twice, first keeping every row of a batch until the batch ends, then shedding ended
rows (`generate.SHED_MIN_ROWS`, the build's setting), into temporary folders (after a warm-up of 8 prompts a category), and prints each run's generation
seconds and useful tokens/s beside the share of continuations that come out the same. Greedy rows are each their
own decode either way; under bf16 a batch of another size may take other kernels, so near-ties can flip.
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


def run(testbed: Path, cfg, device: str, shed_min_rows: int) -> tuple[dict, list[list[int]]]:
    """One responses stage with ``SHED_MIN_ROWS`` set to ``shed_min_rows``: its figures and its continuations."""
    default = generate.SHED_MIN_ROWS
    generate.SHED_MIN_ROWS = shed_min_rows
    try:
        with tempfile.TemporaryDirectory() as out:
            figures = generate_responses(testbed, cfg, Path(out), device=device)
            rows = [json.loads(line)["response_ids"] for line in open(Path(out) / "responses.jsonl")]
    finally:
        generate.SHED_MIN_ROWS = default
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
    run(args.testbed, replace(cfg, prompts_per_category=8), args.device, 1 << 62)  # warm-up: kernels, allocator
    kept, kept_rows = run(args.testbed, cfg, args.device, 1 << 62)
    shed, shed_rows = run(args.testbed, cfg, args.device, generate.SHED_MIN_ROWS)
    same = sum(a == b for a, b in zip(kept_rows, shed_rows)) / max(1, len(kept_rows))
    result = {"prompts": len(kept_rows), "shed_min_rows": generate.SHED_MIN_ROWS, "same_share": round(same, 4),
              "kept": {k: kept[k] for k in ("response_tokens", "generate_seconds", "tokens_per_second")},
              "shed": {k: shed[k] for k in ("response_tokens", "generate_seconds", "tokens_per_second")}}
    print("| batch | response tokens | generation s | tokens/s |\n|---|---|---|---|")
    for name in ("kept", "shed"):
        r = result[name]
        print(f"| {name} | {r['response_tokens']:,} | {r['generate_seconds']} | {r['tokens_per_second']:,} |")
    print(f"speedup {kept['generate_seconds'] / max(shed['generate_seconds'], 1e-9):.2f}x; "
          f"{same:.1%} of {len(kept_rows):,} continuations identical")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
