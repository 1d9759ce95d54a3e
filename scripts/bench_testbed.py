"""End-to-end speed of every method on a built testbed, side by side in one process.

Usage: python scripts/bench_testbed.py --testbed DIR [--device cuda] [--dtype bfloat16] [--prompts 8]
       [--max-new-tokens 128] [--graphs both|on|off] [--router ROUTER_DIR] [--json OUT]

A thin caller of `whiflash-eval bench` (whiflash.eval.bench.run_bench), once per execution mode:
per testbed category and method (AR, EAGLE-3, DFlash, DDTree, WhiFlash-Entropy,
WhiFlash-Neural when --router is given), after a warm-up: tau, decode tokens/s and speedup = AR time
per token / method time per token on the same prompts. With --graphs both (CUDA only) every method
runs eager and with CUDA graphs, each mode in its own run folder under runs/eval/. Every output is
checked against AR.
"""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch

from whiflash.eval.bench import run_bench
from whiflash.eval.config import BenchConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--testbed", type=Path, required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16" if torch.cuda.is_available() else "float32")
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts per category")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--graphs", default="both", choices=["both", "on", "off"])
    ap.add_argument("--router", type=Path, help="a trained neural router folder (adds WhiFlash-Neural)")
    ap.add_argument("--entropy-threshold", type=float, default=0.2)
    ap.add_argument("--out", default="runs/eval", help="parent folder of the eval run folders")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    if args.device != "cuda":
        args.graphs = "off"
    methods = "eagle3,dflash,ddtree,whiflash-entropy" + (",whiflash-neural" if args.router else "")
    rows, mismatches, failures = [], 0, {}
    for graphs in {"both": [False, True], "on": [True], "off": [False]}[args.graphs]:
        cfg = BenchConfig(testbed=str(args.testbed), dataset="testbed:test", max_samples=3 * args.prompts,
                          methods=methods, max_new_tokens=args.max_new_tokens, max_prompt_tokens=256,
                          device=args.device, dtype=args.dtype, cuda_graphs=graphs,
                          whiflash_entropy_threshold=args.entropy_threshold,
                          whiflash_neural_router_path=str(args.router) if args.router else None, out=args.out,
                          name=f"bench-testbed-graphs-{'on' if graphs else 'off'}")
        try:  # a failing graph mode must not cost the eager table measured before it
            res = run_bench(cfg, ["scripts/bench_testbed.py"]).results
        except Exception as exc:
            failures[graphs] = f"{type(exc).__name__}: {exc}"
            print(f"graphs={'on' if graphs else 'off'} failed: {failures[graphs]}", flush=True)
            continue
        mismatches += len(res["mismatches"])
        print(f"\n## graphs {'on' if graphs else 'off'} ({res['run']})\n")
        print((Path(res["run"]) / "results.md").read_text())
        rows += [{"graphs": graphs, "category": c, "method": m, "tau": f["tau"], "tokens_per_s": f["tokens_per_second"],
                  "speedup": f["speedup"], "speedup_pooled": f["speedup_pooled"]}
                 for c, per in res["cells"].items() if c != "all" for m, f in per.items()]
    for graphs, err in failures.items():
        print(f"graphs={'on' if graphs else 'off'} FAILED: {err}")
    print(f"lossless: {'every output equals AR' if not mismatches else f'{mismatches} outputs differ from AR'}")
    if args.json:
        dev = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        args.json.write_text(json.dumps({"device": dev, "dtype": args.dtype, "rows": rows, "mismatches": mismatches,
                                         "failures": {str(k): v for k, v in failures.items()}}, indent=2))


if __name__ == "__main__":
    main()
