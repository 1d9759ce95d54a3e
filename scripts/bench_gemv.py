"""Few-row weight products at a model's shapes: cuBLAS against block-size variants of the GEMV kernel.

Usage: python scripts/bench_gemv.py [--preset qwen3-8b,qwen3-4b] [--rows 1,16] [--quick]

For the products of one decoder layer (Q/K/V, o_proj, gate/up, down) of each preset, times `F.linear`
(cuBLAS) and `whiflash.runtime.gemv`'s kernel at each launch setting (output features per program, weight
columns per step, K splits, warps, pipeline stages), each as a CUDA graph of one product per weight copy
(8 copies, so the L2 cache does not serve the weights), and prints GPU us and the share of copy bandwidth
reached, best settings first: the measurement behind `gemv.CONFIGS` (docs/engine.md).
"""
from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from whiflash.eval.shapes import shape_config
from whiflash.eval.timing import copy_bandwidth, device_ms
from whiflash.runtime import gemv
from whiflash.runtime.graphs import Graphed


def shapes(preset: str) -> dict[str, tuple[int, int]]:
    """(output features, input features) of one layer's products (a checkpoints/ preset or a testbed folder)."""
    cfg = shape_config(preset, "target")
    h, hd = cfg["hidden_size"], cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    qkv = (cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"]) * hd
    return {"qkv": (qkv, h), "o_proj": (h, cfg["num_attention_heads"] * hd),
            "gate_up": (2 * cfg["intermediate_size"], h), "down": (h, cfg["intermediate_size"])}


def graph_us(fn, calls: int) -> float:
    return 1e3 * device_ms(Graphed(fn), torch.device("cuda"), n=50) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen3-8b",
                    help="checkpoints/ presets or folders with target/config.json, comma-separated")
    ap.add_argument("--rows", default="1,16", help="rows of x, comma-separated (1: decode step; up to 16: verify); "
                    "settings are ranked by the sum of their times over these")
    ap.add_argument("--quick", action="store_true", help="fewer settings (a one-minute run)")
    ap.add_argument("--top", type=int, default=3, help="settings printed per shape")
    ap.add_argument("--json", type=Path, help="write the best setting of every shape where it beat cuBLAS "
                    "(summed over --rows) here, for --gemv-configs / WHIFLASH_GEMV_CONFIGS (EngineOptions.gemv_configs)")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if not all(1 <= r <= gemv.MAX_ROWS for r in rows):
        ap.error(f"--rows: expected values in 1..{gemv.MAX_ROWS} (the kernel's row tile), got {args.rows}")
    if not torch.cuda.is_available() or gemv.triton is None:
        raise SystemExit("bench_gemv.py needs a CUDA device and Triton")
    bw = copy_bandwidth(torch.device("cuda"))
    grid = (([16, 32], [256, 512], [1, 2, 4], [4], [3]) if args.quick else
            ([16, 32, 64], [256, 512], [1, 2, 4, 8], [4], [3, 4]))
    print(f"{torch.cuda.get_device_name()}, bf16, rows {rows}; GPU us per product (share of copy bandwidth "
          f"{bw / 1e12:.2f} TB/s); setting = BLOCK_N/BLOCK_K/SPLIT_K/warps/stages")
    done: set[tuple[int, int]] = set()
    best: dict[str, list[int]] = {}
    for preset in args.preset.split(","):
        for name, (n, k) in shapes(preset).items():
            if (n, k) in done:
                continue
            done.add((n, k))
            ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(8)]
            xs = {r: torch.randn(r, k, device="cuda", dtype=torch.bfloat16) for r in rows}
            share = lambda us: n * k * 2 / (us / 1e6) / bw  # noqa: E731
            cublas = [graph_us(lambda x=x: [F.linear(x, w) for w in ws], len(ws)) for x in xs.values()]
            results = []
            current = gemv.config(n, k)  # the engine's setting now
            for setting in itertools.product(*grid):
                try:
                    us = [graph_us(lambda x=x, s=setting: [gemv.gemv(x, w, setting=s) for w in ws], len(ws))
                          for x in xs.values()]
                except Exception as exc:  # a setting the compiler refuses (registers, shared memory)
                    print(f"  {preset} {name} {setting}: {type(exc).__name__}")
                    continue
                results.append((sum(us), us, setting))
            results.sort()
            now = next((us for _, us, st in results if st == current), None)
            fmt = lambda us: " ".join(f"{u:6.1f} ({share(u):.0%})" for u in us)  # noqa: E731
            print(f"{preset} {name} [{n}, {k}]: cuBLAS {fmt(cublas)}; current {'/'.join(map(str, current))} "
                  f"{fmt(now) if now else '-'}")
            for _, us, setting in results[:args.top]:
                print(f"    {'/'.join(map(str, setting)):<18}{fmt(us)}")
            if results and results[0][0] < sum(cublas):
                best[f"{n}x{k}"] = list(results[0][2])
    if args.json:
        args.json.write_text(json.dumps(best, indent=1) + "\n")
        print(f"settings that beat cuBLAS: {args.json}")


if __name__ == "__main__":
    main()
