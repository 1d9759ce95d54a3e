"""Router rows two ways, side by side in one process: oracle decoding against parallel passes.

Usage: python scripts/bench_datagen.py --testbed DIR [--per-category 8] [--new-tokens 256] [--repeats 2]
       [--pair df-e3|ddt-e3|df-ddt] [--tree-budget 15]

On a built testbed's held-out prompts (`testbed:heldout`, where router data comes from), each prompt in turn
through three ways of making its rows, under the engine whiflash-datagen runs by default (bf16, CUDA graphs and
compiled layers on a GPU; float32 and eager on a CPU):

- `decode`: `record_prompt`, the oracle decodes (both drafters every round, their union verified): the oracle
  path's rows, as `whiflash-datagen` writes them;
- `passes`: `record_prompt_parallel`, the greedy sequence (a batch of one here) and teacher-forced passes, then
  the walk: the same rows (`whiflash-datagen --parallel`);
- `every`: the same passes, a row at every position (`--parallel --path every`).

Times are device-synchronised wall seconds per prompt; the first repeat is not counted (graph captures and
compiles). Prints per way and category the rows, seconds and rows/s, and how many of the oracle path's rows
the passes reproduce (same prompt, position, both taus and slot): all of them in float32, while in bf16 a
near-tie may break the other way and the rest of that prompt's path with it.
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

import whiflash
from whiflash.datagen.parallel import record_prompt_parallel
from whiflash.datagen.prompts import read_source
from whiflash.datagen.record import record_prompt
from whiflash.decoding import prompt_room
from whiflash.decoding.routed import OracleDrafter
from whiflash.engine import engine_defaults, engine_options
from whiflash.session import Session, model_paths

WAYS = {
    "decode": record_prompt,
    "passes": record_prompt_parallel,
    "every": lambda *a, **k: record_prompt_parallel(*a, every=True, **k),
}


def _agreement(decoded: dict[str, np.ndarray], passes: dict[str, np.ndarray]) -> tuple[int, int]:
    """(rows of `decoded` up to the first that `passes` does not reproduce, rows of `decoded`)."""
    keys = ("position", "tau_0", "tau_1", "active")
    n = min(len(decoded.get("round", ())), len(passes.get("round", ())))
    same = 0
    while same < n and all(decoded[k][same] == passes[k][same] for k in keys):
        same += 1
    return same, len(decoded.get("round", ()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--testbed", type=Path, required=True, help="a built testbed folder")
    ap.add_argument("--per-category", type=int, default=8, help="held-out prompts a category")
    ap.add_argument("--new-tokens", type=int, default=256, help="tokens generated a prompt (greedy)")
    ap.add_argument("--repeats", type=int, default=2, help="counted passes over the prompts (one more warms up)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--pair", default="df-e3", help="drafter pair (slot 0 first), as whiflash-datagen --pair")
    ap.add_argument("--tree-budget", type=int, default=None, help="DDTree nodes of a pair with a DDTree slot")
    args = ap.parse_args()

    engine = engine_defaults(args.device)
    paths = model_paths(args.testbed)
    run = Session.open(paths, args.device, engine["dtype"],
                       engine_options(args.device, engine["cuda_graphs"], engine["compile_layers"]))
    target = run.target
    eagle3 = whiflash.load_drafter("eagle3", paths["eagle3"], target) if "e3" in args.pair else None
    oracle = OracleDrafter(args.pair, dflash=whiflash.load_drafter("dflash", paths["dflash"], target), eagle3=eagle3,
                           tree_budget=args.tree_budget)
    keep = min(1024, prompt_room(target, args.new_tokens, oracle.max_nodes))
    items = read_source("testbed:heldout", args.testbed, args.per_category)
    prompts = [(it.category, run.encode([it.text])[-keep:]) for it in items]
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    rows: dict[tuple[str, str], int] = defaultdict(int)
    agree = np.zeros(2, dtype=np.int64)
    for repeat in range(args.repeats + 1):
        for category, ids in prompts:
            got = {}
            for way, record in WAYS.items():
                if target.device.type == "cuda":
                    torch.cuda.synchronize(target.device)
                start = time.perf_counter()
                got[way] = record(target, oracle, ids, args.new_tokens, run.stops or None)
                if target.device.type == "cuda":
                    torch.cuda.synchronize(target.device)
                if repeat:
                    seconds[way, category] += time.perf_counter() - start
                    rows[way, category] += len(got[way].get("round", ()))
            if repeat == 1:
                agree += _agreement(got["decode"], got["passes"])
    print(f"{len(prompts)} held-out prompts of {args.testbed}, pair {args.pair}, {args.new_tokens} new tokens, "
          f"{args.repeats} counted repeats; {target.device}, {engine['dtype']}, CUDA graphs {engine['cuda_graphs']}, "
          f"compiled layers {engine['compile_layers']}")
    print("| way | category | rows | seconds | rows/s |")
    print("|---|---|---|---|---|")
    categories = sorted({c for c, _ in prompts})
    for way in WAYS:
        for cat in [*categories, "all"]:
            cats = categories if cat == "all" else [cat]
            n, s = sum(rows[way, c] for c in cats), sum(seconds[way, c] for c in cats)
            print(f"| {way} | {cat} | {n} | {s:.2f} | {n / max(s, 1e-9):.1f} |")
    print(f"oracle path rows the passes reproduce (each prompt up to its first difference): {agree[0]} of {agree[1]}")


if __name__ == "__main__":
    main()
