"""WhiFlash demo: the whole pipeline through the toolkit's CLIs on the embedded testbed.

Usage: python scripts/demo.py [--preset tiny] [--out DIR] [--work DIR] [--prompts 8] [--max-new-tokens 64]

Each step is a CLI run through its main function in this process (Python and torch load once);
the equivalent shell command is printed before it runs:

1. `python -m whiflash.testbed build` — the `tiny` testbed (first run about 4.5 minutes on 2 CPU cores;
   later runs reuse it);
2. `whiflash-datagen` on training-split prompts (oracle decoding, both drafters' tau every round) and
3. `whiflash-train fit` on those rows (about a minute together; skipped when WORK holds a router made
   from these very models: the dataset and router folders are named by the testbed's model hashes);
4. `whiflash-eval profile` — the latency profile of the testbed's models on this machine;
5. `whiflash-eval calibrate --replay` — WhiFlash-Entropy's threshold per category, estimated from the
   datagen rounds and the profile (no decoding);
6. `whiflash-eval bench` — AR, EAGLE-3, DFlash, DDTree, WhiFlash-Entropy (calibrated thresholds),
   WhiFlash-Neural (the trained router) and the per-round oracle on held-out prompts of every testbed
   category, every output checked against AR token for token.

Prints the bench table (speedup over AR, tau = accepted drafts + 1 per round, tokens/s, routing
shares, gains) and the paths of the plots. Exit status 1 when an output differs from AR.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from whiflash.testbed import CATEGORIES, default_dir


def step(title: str, program: str, main: Callable[[list[str]], object], argv: list[str]) -> None:
    """Print the shell form of a CLI call, then run its main function with `argv` (and `sys.argv` as the
    shell would set it: LightningCLI and the run manifests read it)."""
    print(f"\n== {title}\n$ {program} {shlex.join(argv)}", flush=True)
    saved, sys.argv = sys.argv, [program, *argv]
    try:
        code = main(argv)
    finally:
        sys.argv = saved
    if isinstance(code, int) and code != 0:
        raise SystemExit(f"{program} exited with status {code}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny", help="testbed preset (tiny: CPU; small: one GPU)")
    ap.add_argument("--out", type=Path, default=None, help="testbed folder (default: the preset's cache folder)")
    ap.add_argument("--work", type=Path, default=None, help="folder for the dataset, router, profile, thresholds "
                    "and bench runs (default: <testbed>/demo)")
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts per category")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    from whiflash.datagen.cli import main as datagen_main
    from whiflash.eval.cli import main as eval_main
    from whiflash.testbed.__main__ import main as testbed_main
    from whiflash.train.cli import run as train_main  # main is the console command: it exits the process

    root = args.out or default_dir(args.preset)
    work = args.work or root / "demo"
    device = ["--device", args.device]
    # A batch-1 decode of the tiny models is latency-bound: on a CPU, more than one intra-op thread makes
    # single decodes stall (they wait on each other's cores), which turns the bench's timings into noise.
    timing = ["--threads", "1"] if args.device == "cpu" else []
    step("testbed", "python -m whiflash.testbed", testbed_main,
         ["build", "--preset", args.preset, "--out", str(root), *device])
    # the rows and the router belong to these exact models: a rebuilt testbed gets folders of its own
    stages = json.loads((root / "manifest.json").read_text())["stages"]
    models = hashlib.sha256("".join(stages[s]["output_sha256"] for s in ("target", "eagle3", "dflash")).encode())
    data, routers = work / f"data-{models.hexdigest()[:12]}", work / f"runs-{models.hexdigest()[:12]}"
    if not (sorted(routers.glob("*/router")) and (data / "manifest.json").is_file()):  # reuse: most of a rerun
        step("router data", "whiflash-datagen", datagen_main,
             ["--testbed", str(root), "--prompts", "[testbed:heldout]", "--per-category", "60",
              "--max-new-tokens", "96", "--out", str(data), *device])
        step("router training", "whiflash-train", train_main,
             ["fit", "--data.path", str(data), "--trainer.default_root_dir", str(routers)])
    router = sorted(routers.glob("*/router"))[-1]
    profile, thresholds = work / "profile.json", work / "thresholds.json"
    step("latency profile", "whiflash-eval", eval_main,
         ["profile", "--testbed", str(root), "--context", "256", "--repeats", "10", "--out", str(work / "eval"),
          "--output", str(profile), *device, *timing])
    step("threshold calibration (replay)", "whiflash-eval", eval_main,
         ["calibrate", "--replay", str(data), "--latency-profile", str(profile), "--calibrate-method",
          "whiflash-entropy", "--thresholds", "0.05,0.1,0.2,0.3,0.5,0.75,1,1.5,2,3", "--out", str(work / "eval"),
          "--output", str(thresholds)])
    name = f"demo-{args.preset}"
    step("benchmark", "whiflash-eval", eval_main,
         ["bench", "--testbed", str(root), "--dataset", "testbed:test",
          "--max-samples", str(len(CATEGORIES) * args.prompts),
          "--methods", "eagle3,dflash,ddtree,whiflash-entropy,whiflash-neural,oracle",
          "--whiflash-thresholds", str(thresholds), "--whiflash-neural-router-path", str(router),
          "--max-new-tokens", str(args.max_new_tokens), "--max-prompt-tokens", "256", "--dtype", "float32",
          "--out", str(work / "eval"), "--name", name, *device, *timing])
    run = sorted((work / "eval").glob(f"*_{name}"))[-1]
    print(f"\ntestbed {root} ({args.preset}), {args.prompts} held-out prompts per category, greedy, "
          f"{args.max_new_tokens} new tokens, {args.device}; run folder {run}\n")
    print((run / "results.md").read_text())
    print("plots:\n" + "\n".join(f"  {p}" for p in sorted((run / "plots").glob("*.png"))))
    n = len(json.loads((run / "results.json").read_text())["mismatches"])
    print(f"lossless: {'every output equals AR' if not n else f'{n} outputs differ from AR'}")
    # equal hashes = the same models: a reader compares their world with the README's by these
    print("models (output sha256): " + ", ".join(f"{s} {stages[s]['output_sha256'][:16]}" for s in ("target", "eagle3", "dflash")))
    return 1 if n else 0


if __name__ == "__main__":
    sys.exit(main())
