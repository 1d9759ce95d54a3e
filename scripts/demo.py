"""WhiFlash demo: build (or reuse) the embedded testbed and compare every method on held-out prompts.

Usage: python scripts/demo.py [--preset tiny] [--out DIR] [--prompts 8] [--max-new-tokens 64] [--no-neural]

The first run builds the `tiny` testbed (about 4 minutes on 2 CPU cores; later runs reuse it).
Unless --no-neural, it then runs the toolkit's pipeline on that world: `whiflash-datagen` on
training-split prompts (oracle decoding, both drafters' tau every round) and `whiflash-train fit`
on the result (about a minute together; reused when present). Per category (code, math, prose),
every method then decodes the same held-out prompts greedily: plain AR, EAGLE-3, DFlash, DDTree,
WhiFlash-Entropy (threshold calibrated on the datagen rounds) and WhiFlash-Neural (DFlash vs
EAGLE-3) and the per-round oracle of that pair.
The comparison is `whiflash-eval bench` (whiflash.eval.bench.run_bench, run folder under runs/eval/):
every output is checked against AR token for token; the table gives speedup over AR, tau (accepted
drafts + 1 per round; mean over rounds per sequence, then over sequences) and decode tokens/s.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

from whiflash.eval.bench import run_bench
from whiflash.eval.config import BenchConfig
from whiflash.testbed import CATEGORIES, ensure_testbed


def train_router(root: Path) -> tuple[Path, Path]:
    """datagen on training-split prompts, then `whiflash-train fit`; returns (router folder, dataset folder)."""
    from whiflash.datagen.cli import datagen
    from whiflash.train.cli import run

    work = root / "demo"
    data = work / "data"
    routers = sorted((work / "runs").glob("*/router"))
    if routers:
        return routers[-1], data
    datagen(out=data, prompts=["testbed:train"], testbed=root, per_category=60, max_new_tokens=96, device="cpu")
    sys.argv = ["whiflash-train"]  # LightningCLI reads sys.argv alongside args
    run(["fit", "--data.path", str(data), "--trainer.default_root_dir", str(work / "runs")])
    return sorted((work / "runs").glob("*/router"))[-1], data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny", help="testbed preset (tiny: CPU; small: one GPU)")
    ap.add_argument("--out", type=Path, default=None, help="testbed folder (default: the preset's cache folder)")
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts per category")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--entropy-threshold", type=float, default=None,
                    help="WhiFlash-Entropy threshold in nats (default: calibrated on the datagen rounds; 0.2 with --no-neural)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-neural", action="store_true", help="skip datagen + router training")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    for name in ("whiflash.runtime", "whiflash.drafters"):
        logging.getLogger(name).setLevel(logging.WARNING)

    root = ensure_testbed(args.preset, args.out)
    threshold = args.entropy_threshold if args.entropy_threshold is not None else 0.2
    neural: str | None = None
    if not args.no_neural:
        from whiflash.train.calibrate import calibrate_entropy

        router_dir, data = train_router(root)
        neural = str(router_dir)
        if args.entropy_threshold is None:
            threshold = calibrate_entropy(data)["threshold"]
    cfg = BenchConfig(testbed=str(root), dataset="testbed:test", max_samples=len(CATEGORIES) * args.prompts,
                      methods="eagle3,dflash,ddtree,whiflash-entropy" + (",whiflash-neural" if neural else "") + ",oracle",
                      whiflash_entropy_threshold=threshold, whiflash_neural_router_path=neural,
                      max_new_tokens=args.max_new_tokens, max_prompt_tokens=256, device=args.device,
                      dtype="float32", name=f"demo-{args.preset}")
    result = run_bench(cfg, ["scripts/demo.py", *sys.argv[1:]])
    print(f"\ntestbed {root} ({args.preset}), {args.prompts} held-out prompts per category, greedy, "
          f"{args.max_new_tokens} new tokens, {args.device}; run folder {result.run_dir}\n")
    print((result.run_dir / "results.md").read_text())
    n = len(result.mismatches)
    print(f"lossless: {'every output equals AR' if not n else f'{n} outputs differ from AR'}")
    return 1 if n else 0


if __name__ == "__main__":
    sys.exit(main())
