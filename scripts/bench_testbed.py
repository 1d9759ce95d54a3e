"""End-to-end speed of every method on a built testbed, side by side in one process.

Usage: python scripts/bench_testbed.py --testbed DIR [--device cuda] [--dtype bfloat16] [--prompts 8]
       [--max-new-tokens 128] [--graphs both|on|off] [--router ROUTER_DIR] [--json OUT]

Per category (code, math, prose) and method (AR, EAGLE-3, DFlash, DDTree, WhiFlash-Entropy,
WhiFlash-Neural when --router is given), after a warm-up: tau (accepted drafts + 1 per round, mean
over rounds per sequence then over sequences), decode tokens/s (total tokens / total decode time)
and speedup = AR time per token / method time per token on the same prompts. With --graphs both
(CUDA only) every method runs eager and with CUDA graphs. Every output is checked against AR.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import whiflash
from whiflash.testbed import CATEGORIES, eval_prompts
from whiflash.testbed.tokenizer import load_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--testbed", type=Path, required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16" if torch.cuda.is_available() else "float32")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--graphs", default="both", choices=["both", "on", "off"])
    ap.add_argument("--router", type=Path, help="a trained neural router folder (adds WhiFlash-Neural)")
    ap.add_argument("--entropy-threshold", type=float, default=0.2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.device != "cuda":
        args.graphs = "off"
    root = args.testbed
    tok = load_tokenizer(root / "target")
    target = whiflash.load_target(root / "target", device=args.device, dtype=getattr(torch, args.dtype))
    eagle = whiflash.load_drafter("eagle3", root / "eagle3", target)
    dflash = whiflash.load_drafter("dflash", root / "dflash", target)
    ddtree = whiflash.load_drafter("ddtree", root / "dflash", target)
    methods = {"AR": None, "EAGLE-3": eagle, "DFlash": dflash, "DDTree": ddtree,
               "WhiFlash-Entropy": whiflash.RoutedDrafter("df-e3", whiflash.EntropyRouter(args.entropy_threshold),
                                                          eagle3=eagle, dflash=dflash)}
    if args.router:
        router = whiflash.load_router(args.router, hidden_size=target.config.hidden_size, pair="df-e3")
        methods["WhiFlash-Neural"] = whiflash.RoutedDrafter("df-e3", whiflash.NeuralPolicy(router.to(args.device)),
                                                            eagle3=eagle, dflash=dflash)
    prompts = {c: [tok(p, add_special_tokens=False)["input_ids"][-256:] for p in eval_prompts(root, c, args.prompts)]
               for c in CATEGORIES}
    modes = {"both": [False, True], "on": [True], "off": [False]}[args.graphs]
    rows, mismatches, failures = [], 0, {}
    for graphs in modes:
        try:
            mismatches += run_mode(graphs, target, methods, prompts, args.max_new_tokens, tok.eos_token_id, rows)
        except Exception as exc:  # a failing graph mode must not cost the eager table measured before it
            failures[graphs] = f"{type(exc).__name__}: {exc}"
            print(f"graphs={'on' if graphs else 'off'} failed: {failures[graphs]}", flush=True)
    dev = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"\n{root}, {dev}, {args.dtype}, {args.prompts} prompts/category, {args.max_new_tokens} new tokens, greedy")
    print("tau = accepted drafts + 1 per round; speedup = AR time per token / method time per token (same prompts)")
    print(f"{'graphs':<7}{'method':<18}" + "".join(f"{c + ' tau':>10}{'tok/s':>8}{'x':>6}" for c in CATEGORIES))
    for graphs in modes:
        for name in methods:
            cells = [r for r in rows if r["graphs"] == graphs and r["method"] == name]
            if cells:
                print(f"{'on' if graphs else 'off':<7}{name:<18}"
                      + "".join(f"{r['tau']:>10.2f}{r['tokens_per_s']:>8.0f}{r['speedup']:>6.2f}" for r in cells))
    if len(modes) == 2 and not failures:
        print("graphs on / off, tokens/s per category: " + "; ".join(
            f"{name} " + "/".join(f"{on['tokens_per_s'] / off['tokens_per_s']:.2f}" for off, on in zip(
                [r for r in rows if not r["graphs"] and r["method"] == name],
                [r for r in rows if r["graphs"] and r["method"] == name])) for name in methods))
    for graphs, err in failures.items():
        print(f"graphs={'on' if graphs else 'off'} FAILED: {err}")
    print(f"lossless: {'every output equals AR' if not mismatches else f'{mismatches} outputs differ from AR'}")
    if args.json:
        args.json.write_text(json.dumps({"device": dev, "dtype": args.dtype, "rows": rows, "mismatches": mismatches,
                                          "failures": {str(k): v for k, v in failures.items()}}, indent=2))


def run_mode(graphs: bool, target, methods: dict, prompts: dict[str, list[list[int]]], max_new_tokens: int,
             eos: int, rows: list[dict]) -> int:
    """Every method on every category in one mode (eager or CUDA graphs); returns outputs unequal to AR."""
    mismatches = 0
    for m in [target, *methods.values()]:
        if m is not None:
            m.use_cuda_graphs(graphs)
    for drafter in methods.values():  # warm-up: capture graphs, load kernels
        whiflash.generate(target, drafter, prompts["math"][0], 32)
    for cat, plist in prompts.items():
        ref_out, ar_per_token = [], 0.0
        for name, drafter in methods.items():
            stats = []
            for i, ids in enumerate(plist):
                out, st = whiflash.generate(target, drafter, ids, max_new_tokens, stop_token_ids=[eos])
                if drafter is None:
                    ref_out.append(out)
                mismatches += out != ref_out[i]
                stats.append(st)
            s = whiflash.summarize(stats)
            per_token = s["decode_seconds"] / s["tokens"]
            if drafter is None:
                ar_per_token = per_token
            rows.append({"graphs": graphs, "category": cat, "method": name, "tau": s["tau"],
                         "tokens_per_s": 1 / per_token, "speedup": ar_per_token / per_token})
    return mismatches


if __name__ == "__main__":
    main()
