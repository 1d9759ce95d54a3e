"""WhiFlash demo: build (or reuse) the embedded testbed and compare every method on held-out prompts.

Usage: python scripts/demo.py [--preset tiny] [--out DIR] [--prompts 8] [--max-new-tokens 64] [--no-neural]

The first run builds the `tiny` testbed (about 4 minutes on 2 CPU cores; later runs reuse it).
Unless --no-neural, it then runs the toolkit's pipeline on that world: `whiflash-datagen` on
training-split prompts (oracle decoding, both drafters' tau every round) and `whiflash-train fit`
on the result (about a minute together; reused when present). Per category (code, math, prose),
every method then decodes the same held-out prompts greedily: plain AR, EAGLE-3, DFlash, DDTree,
WhiFlash-Entropy (threshold calibrated on the datagen rounds) and WhiFlash-Neural (DFlash vs
EAGLE-3) and the per-round oracle of that pair.
Every output is checked against AR token for token; the table gives tau (accepted drafts + 1 per
round; mean over rounds per sequence, then over sequences) and decode tokens/s on this machine.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

import whiflash
from whiflash.testbed import CATEGORIES, ensure_testbed, eval_prompts
from whiflash.testbed.tokenizer import load_tokenizer


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
    tok = load_tokenizer(root / "target")
    target = whiflash.load_target(root / "target", device=args.device)
    eagle = whiflash.load_drafter("eagle3", root / "eagle3", target)
    dflash = whiflash.load_drafter("dflash", root / "dflash", target)
    threshold = args.entropy_threshold if args.entropy_threshold is not None else 0.2
    neural = None
    if not args.no_neural:
        from whiflash.train.calibrate import calibrate_entropy

        router_dir, data = train_router(root)
        neural = whiflash.load_router(router_dir, hidden_size=target.config.hidden_size, pair="df-e3")
        if args.entropy_threshold is None:
            threshold = calibrate_entropy(data)["threshold"]
    methods = {
        "AR": None,
        "EAGLE-3": eagle,
        "DFlash": dflash,
        "DDTree": whiflash.load_drafter("ddtree", root / "dflash", target),
        f"WhiFlash-Entropy ({threshold:g})": whiflash.RoutedDrafter("df-e3", whiflash.EntropyRouter(threshold),
                                                                   eagle3=eagle, dflash=dflash),
    }
    if neural is not None:
        methods["WhiFlash-Neural"] = whiflash.RoutedDrafter("df-e3", whiflash.NeuralPolicy(neural), eagle3=eagle,
                                                            dflash=dflash)
    methods["Oracle (df-e3)"] = whiflash.OracleDrafter("df-e3", eagle3=eagle, dflash=dflash)
    stats: dict[str, dict[str, list]] = {m: {c: [] for c in CATEGORIES} for m in methods}
    mismatches = 0
    for cat in CATEGORIES:
        for prompt in eval_prompts(root, cat, args.prompts):
            ids = tok(prompt, add_special_tokens=False)["input_ids"][-256:]
            ref = None
            for name, drafter in methods.items():
                out, st = whiflash.generate(target, drafter, ids, args.max_new_tokens, stop_token_ids=[tok.eos_token_id])
                ref = out if ref is None else ref
                mismatches += out != ref
                stats[name][cat].append(st)
    print(f"\ntestbed {root} ({args.preset}), {args.prompts} held-out prompts per category, greedy, "
          f"{args.max_new_tokens} new tokens, {args.device}")
    print("tau = accepted drafts + 1 per round (mean over rounds per sequence, then over sequences)\n")
    print(f"{'method':<24}" + "".join(f"{'tau ' + c:>11}" for c in CATEGORIES) + f"{'tok/s':>9}")
    for name, per in stats.items():
        taus = [whiflash.summarize(per[c])["tau"] for c in CATEGORIES]
        total = whiflash.summarize([s for c in CATEGORIES for s in per[c]])
        print(f"{name:<24}" + "".join(f"{t:>11.2f}" for t in taus) + f"{total['tokens'] / total['decode_seconds']:>9.0f}")
    print(f"\nlossless: {'every output equals AR' if not mismatches else f'{mismatches} outputs differ from AR'}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
