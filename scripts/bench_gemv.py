"""Few-row weight products at a model's shapes: cuBLAS against block-size variants of the GEMV kernel.

Usage: python scripts/bench_gemv.py [--preset qwen3-8b] [--rows 1] [--quick]

For the products of one decoder layer (Q/K/V, o_proj, gate/up, down) of a `checkpoints/` preset, times
`F.linear` (cuBLAS) and `whiflash.runtime.gemv`'s kernel at each (output features per program, weight
columns per step, warps) setting, each as a CUDA graph of one product per weight copy (8 copies, so the
L2 cache does not serve the weights), and prints GPU us and the share of copy bandwidth reached: the
measurement a per-shape kernel choice needs (docs/engine.md).
"""
from __future__ import annotations

import argparse
import itertools

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
    ap.add_argument("--preset", default="qwen3-8b", help="a checkpoints/ preset or a folder with target/config.json")
    ap.add_argument("--rows", type=int, default=1, help="rows of x (1: decode step; up to 16: verify)")
    ap.add_argument("--quick", action="store_true", help="fewer settings (a one-minute run)")
    args = ap.parse_args()
    if not 1 <= args.rows <= gemv.MAX_ROWS:
        ap.error(f"--rows: expected 1..{gemv.MAX_ROWS} (the kernel's row tile), got {args.rows}")
    if not torch.cuda.is_available() or gemv.triton is None:
        raise SystemExit("bench_gemv.py needs a CUDA device and Triton")
    bw = copy_bandwidth(torch.device("cuda"))
    blocks_n, blocks_k, warps = ([8, 16, 32], [256, 512], [4, 8]) if args.quick else ([8, 16, 32, 64], [128, 256, 512],
                                                                                     [2, 4, 8])
    print(f"{torch.cuda.get_device_name()}, bf16, {args.preset}, {args.rows} row(s); GPU us (share of copy bandwidth "
          f"{bw / 1e12:.2f} TB/s)")
    for name, (n, k) in shapes(args.preset).items():
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(8)]
        x = torch.randn(args.rows, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(args.rows, n, device="cuda", dtype=torch.bfloat16)
        share = lambda us: n * k * 2 / (us / 1e6) / bw  # noqa: E731
        cublas = graph_us(lambda: [F.linear(x, w) for w in ws], len(ws))
        results = []
        for bn, bk, nw in itertools.product(blocks_n, blocks_k, warps):
            def run(bn=bn, bk=bk, nw=nw):
                for w in ws:
                    gemv._gemv[(gemv.triton.cdiv(n, bn),)](x, w, w, y, args.rows, n, k, x.stride(0), w.stride(0),
                                                     y.stride(0), HAS_BIAS=False, BLOCK_M=16, BLOCK_N=bn,
                                                     BLOCK_K=bk, IEEE=False, num_warps=nw)
            try:
                results.append((graph_us(run, len(ws)), bn, bk, nw))
            except Exception as exc:  # a setting the compiler refuses (registers, shared memory)
                print(f"  {name} {bn}/{bk}/{nw}: {type(exc).__name__}")
        if not results:
            print(f"{name:<8}[{n}, {k}]  cuBLAS {cublas:7.1f} ({share(cublas):.0%})   no kernel setting compiled")
            continue
        results.sort()
        best = results[0]
        print(f"{name:<8}[{n}, {k}]  cuBLAS {cublas:7.1f} ({share(cublas):.0%})   best kernel {best[0]:7.1f} "
              f"({share(best[0]):.0%}) at BLOCK_N {best[1]}, BLOCK_K {best[2]}, {best[3]} warps; "
              f"default {gemv.BLOCK_N}/{gemv.BLOCK_K}: "
              + next((f"{us:.1f}" for us, bn, bk, nw in results if (bn, bk, nw) == (gemv.BLOCK_N, gemv.BLOCK_K, 4)),
                     "-"))
        del ws


if __name__ == "__main__":
    main()
