"""Per-round latency of every method, routed ones included, on the tiny test checkpoints.

Usage: python scripts/bench_engine.py [--device cuda] [--dtype bfloat16] [--new-tokens 64]

Writes the checkpoints it needs to a temporary folder (`whiflash.testing`, as the tests do), runs
AR, EAGLE-3, DFlash and DDTree side by side in one process on the same prompts after a warm-up,
and prints median per-round latency, tau and tokens/s. Eager path: on a GPU this measures launch
overhead more than arithmetic (docs/design.md, "Performance"), which is what CUDA graphs will remove.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

import whiflash
from whiflash.testing import make_dflash, make_eagle3, make_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, help="also write the table here")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    root = Path(tempfile.mkdtemp())
    tdir = make_target(root / "t", "qwen3", crafted=True, mix=0.1, seed=4)
    cfg = json.loads((tdir / "config.json").read_text())
    target = whiflash.load_target(tdir, device=args.device, dtype=dtype)
    methods = {
        "ar": None,
        "eagle3 (k=4)": whiflash.load_drafter("eagle3", make_eagle3(root / "e", cfg, [0, 1, 2], 24, crafted=True), target, num_steps=4),
        "dflash (b=8)": whiflash.load_drafter("dflash", make_dflash(root / "d", cfg, [0, 1, 3], crafted=True), target),
        "ddtree (B=12)": whiflash.load_drafter("ddtree", root / "d", target, tree_budget=12),
    }
    eagle, ddtree = methods["eagle3 (k=4)"], methods["ddtree (B=12)"]
    for lazy in (True, False):  # WhiFlash df-e3 under an alternating router: the worst case for switching
        name = f"df-e3 alt {'lazy' if lazy else 'eager'}"
        methods[name] = whiflash.RoutedDrafter("df-e3", whiflash.AlternatingRouter(), eagle3=eagle, dflash=ddtree,
                                               lazy_catchup=lazy)
    timed = {lazy: whiflash.RoutedDrafter("df-e3", whiflash.AlternatingRouter(), eagle3=eagle, dflash=ddtree,
                                          lazy_catchup=lazy, time_catchup=True) for lazy in (True, False)}
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11, 12], [40, 3, 3, 17, 29, 30, 31, 2, 5, 5, 6]]
    for drafter in [*methods.values(), *timed.values()]:  # warm-up: lazy CUDA module loading, allocator
        for p in prompts:
            whiflash.generate(target, drafter, p, args.new_tokens)
    rows = []
    for name, drafter in methods.items():
        per_round, taus, tps = [], [], []
        for _ in range(args.repeats):
            for p in prompts:
                _, s = whiflash.generate(target, drafter, p, args.new_tokens)
                per_round.append(s.decode_seconds / s.rounds * 1e3)
                taus.append(s.mean_tau)
                tps.append(s.tokens_per_second)
        rows.append({"method": name, "round_ms": statistics.median(per_round), "tau": statistics.mean(taus),
                     "tokens_per_s": statistics.median(tps)})
        print(rows[-1], flush=True)
    shares = {}
    for lazy, drafter in timed.items():  # separate runs: the syncs that time catch-up would slow the rows above
        share = []
        for p in prompts:
            _, s = whiflash.generate(target, drafter, p, args.new_tokens)
            share.append(s.catchup_seconds / s.decode_seconds)
        shares["lazy" if lazy else "eager"] = statistics.median(share)
    dev = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"\nper-round latency, {dev}, {args.dtype}, eager, {args.new_tokens} new tokens, "
          f"median over {args.repeats}x{len(prompts)} runs (tau = accepted drafts + 1 per round)")
    print(f"{'method':<16}{'round ms':>10}{'tau':>8}{'tok/s':>10}")
    for r in rows:
        print(f"{r['method']:<16}{r['round_ms']:>10.3f}{r['tau']:>8.2f}{r['tokens_per_s']:>10.1f}")
    print("catch-up time / round time (synchronised timing), alternating router: "
          + ", ".join(f"{k} {v:.1%}" for k, v in shares.items()))
    if args.json:
        args.json.write_text(json.dumps({"device": dev, "dtype": args.dtype, "rows": rows, "catchup_share": shares}, indent=2))


if __name__ == "__main__":
    main()
