"""Eager decoding at key lengths never seen before: SDPA with and without cuDNN, and CUDA graphs.

Usage: python scripts/bench_eager_attention.py [--tokens 96] [--reps 3]

cuDNN attention builds an execution plan for every new shape, and eager decoding gives it a new key
length every step. The engine therefore leaves cuDNN out of passes whose shapes change
(`whiflash.runtime.layers.VARYING_SHAPE_BACKENDS`); this script times greedy AR decoding of a
random-weight target at the small testbed's shapes (bf16) three ways, each from fresh prompt lengths:
cuDNN allowed (PyTorch's own choice), the engine's eager path, and CUDA graphs.
"""
from __future__ import annotations

import argparse
import time

import torch
from torch.nn.attention import SDPBackend

import whiflash
from whiflash.runtime import ModelConfig, Target, layers
from whiflash.eval.shapes import randomise

SMALL = dict(model_type="qwen3", vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
             num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
             rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
"""The small testbed's target shapes."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=96, help="new tokens per prompt")
    ap.add_argument("--reps", type=int, default=3, help="prompts per variant, each of a length not used before")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device("meta"):
        target = Target(ModelConfig.from_dict(SMALL))
    target = randomise(target, device, dtype)
    g = torch.Generator().manual_seed(0)
    engine_backends = list(layers.VARYING_SHAPE_BACKENDS)
    variants = {"cuDNN allowed": (engine_backends + [SDPBackend.CUDNN_ATTENTION], False),
                "engine eager": (engine_backends, False), "CUDA graphs": (engine_backends, True)}
    length = 150
    print(f"{device} {torch.cuda.get_device_name() if device.type == 'cuda' else ''}: AR ms/token, "
          f"{args.tokens} new tokens per prompt, prompt lengths never seen before")
    for name, (backends, graphs) in variants.items():
        layers.VARYING_SHAPE_BACKENDS = backends
        target.use_cuda_graphs(graphs and device.type == "cuda")
        whiflash.generate(target, None, torch.randint(5, 8000, (100,), generator=g).tolist(), 8)  # warm-up
        times = []
        for _ in range(args.reps):
            length += 7
            ids = torch.randint(5, 8000, (length,), generator=g).tolist()
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out, _ = whiflash.generate(target, None, ids, args.tokens)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) / len(out) * 1e3)
        print(f"{name:<14}" + " ".join(f"{t:7.2f}" for t in times), flush=True)
    layers.VARYING_SHAPE_BACKENDS = engine_backends


if __name__ == "__main__":
    main()
