"""The testbed's batched generator (the responses stage): decode steps per second by batch size and attention backend.

Usage: python scripts/bench_generate.py [--preset small] [--batches 256,1024] [--prompt-tokens 256]
       [--new-tokens 64] [--backends default,math,efficient,flash,cudnn] [--layouts grouped,folded] [--device cuda]

A random-weight target of the preset's shape (no build needed) continues random prompts of `--prompt-tokens`
with `whiflash.testbed.generate.decode_batch`, as the responses stage runs it: a static cache, one CUDA graph a
step, bf16 autocast on a GPU. Each SDPA backend is forced in turn (`torch.nn.attention.sdpa_kernel`; `default`
lets torch choose), in each attention layout: `grouped` (the stage's: the query heads against grouped K/V heads)
and `folded` (each K/V head's query heads folded into query rows, `decode_batch(fold_heads=True)`: no grouped-head
support needed). A backend that cannot run a layout's attention is reported as such, not timed. A step's time is the difference between decodes of 2N and N new tokens,
over N, so prefill and graph capture cancel. Beside it: the K/V bytes a step reads over the whole cache and the
time that takes at the device's measured copy bandwidth, the step's floor from the cache alone.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from whiflash.eval.timing import copy_bandwidth, sync
from whiflash.testbed.generate import decode_batch
from whiflash.testbed.presets import get_preset
from whiflash.testbed.target import qwen3_config

BACKENDS = ("default", "math", "efficient", "flash", "cudnn")


def backend_context(name: str):
    """The context that forces SDPA backend `name` (`default`: none forced)."""
    from contextlib import nullcontext

    if name == "default":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([{"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                         "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[name]])


def attention_runs(name: str, folded: bool, batch: int, heads: int, kv_heads: int, columns: int, head_dim: int,
                   device: torch.device, dtype: torch.dtype) -> str | None:
    """None when backend `name` runs a decode step's attention in its layout (one query a row, a boolean mask over
    the cache; grouped K/V heads, or the query heads folded into rows), else why not."""
    k = torch.randn(batch, kv_heads, columns, head_dim, device=device, dtype=dtype)
    q = torch.randn(batch, kv_heads if folded else heads, heads // kv_heads if folded else 1, head_dim,
                    device=device, dtype=dtype)
    mask = torch.ones(batch, 1, q.shape[2], columns, dtype=torch.bool, device=device)
    try:
        with backend_context(name):
            F.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=not folded)
        sync(device)
    except RuntimeError as err:
        return str(err).splitlines()[0][:100]
    return None


def decode_seconds(model, prompts: list[list[int]], new_tokens: int, eos: int, bf16: bool, folded: bool) -> float:
    """Wall seconds of one `decode_batch` of `prompts` (the build's autocast when `bf16`) in a layout."""
    device = next(model.parameters()).device
    ctx = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else torch.autocast(device.type, enabled=False)
    sync(device)
    t = time.perf_counter()
    with ctx, torch.no_grad():
        decode_batch(model, prompts, new_tokens, eos=eos, pad_id=1, fold_heads=folded)
    sync(device)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small", help="testbed preset whose target shape is timed")
    ap.add_argument("--batches", default="256,1024", help="sequences a batch, comma-separated")
    ap.add_argument("--prompt-tokens", type=int, default=256, help="prompt length (the responses stage cuts at 256)")
    ap.add_argument("--new-tokens", type=int, default=64, help="N: a step's time is (t(2N) - t(N)) / N")
    ap.add_argument("--backends", default=",".join(BACKENDS), help=f"SDPA backends among {', '.join(BACKENDS)}")
    ap.add_argument("--layouts", default="grouped,folded", help="attention layouts: grouped, folded")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise SystemExit(f"--backends: unknown {unknown}; expected some of {', '.join(BACKENDS)}")
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    if not layouts or set(layouts) - {"grouped", "folded"}:
        raise SystemExit(f"--layouts: expected grouped and/or folded, got {args.layouts!r}")
    batches = [int(b) for b in args.batches.split(",")]
    if min(batches) < 1 or args.new_tokens < 1 or args.prompt_tokens < 1:
        raise SystemExit("--batches, --new-tokens and --prompt-tokens: expected positive integers")

    from transformers import Qwen3ForCausalLM

    device = torch.device(args.device)
    cfg = get_preset(args.preset)
    vocab = cfg.tokenizer.vocab_size
    eos = vocab - 1  # random weights rarely pick it in every row at once; a batch decodes on until all have
    model = Qwen3ForCausalLM(qwen3_config(cfg.target, {"vocab_size": vocab, "eos_token_id": eos,
                                                       "pad_token_id": 1})).to(device).eval()
    t = cfg.target
    bf16 = device.type == "cuda"
    dtype = torch.bfloat16 if bf16 else torch.float32
    columns = args.prompt_tokens + 2 * args.new_tokens
    bandwidth = copy_bandwidth(device)
    print(f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}: preset {args.preset} target "
          f"({t.num_hidden_layers} layers, hidden {t.hidden_size}, {t.num_attention_heads}/{t.num_key_value_heads} "
          f"heads of {t.head_dim}), prompts {args.prompt_tokens} + {2 * args.new_tokens} new tokens, "
          f"{'bf16 autocast' if bf16 else 'fp32'}; copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    print(f"{'batch':>6} {'backend':>10} {'layout':>8} {'tokens/s':>10} {'ms/step':>8} {'KV GB/step':>11} "
          f"{'floor ms':>9}")
    gen = torch.Generator().manual_seed(0)
    for batch in batches:
        prompts = torch.randint(3, vocab - 1, (batch, args.prompt_tokens), generator=gen).tolist()
        # every step attends over the whole cache, so it reads all of it: K and V, every layer
        kv_bytes = 2 * t.num_hidden_layers * batch * t.num_key_value_heads * columns * t.head_dim * dtype.itemsize
        floor_ms = kv_bytes / (bandwidth / 2) * 1e3  # copy bandwidth counts a read and a write
        for name in backends:
            for layout in layouts:
                folded = layout == "folded"
                why = attention_runs(name, folded, batch, t.num_attention_heads, t.num_key_value_heads, columns,
                                     t.head_dim, device, dtype)
                if why is not None:
                    print(f"{batch:>6} {name:>10} {layout:>8} {'cannot run: ' + why}")
                    continue
                with backend_context(name):
                    decode_seconds(model, prompts, 2, eos, bf16, folded)  # lazy initialisation outside the timing
                    short = decode_seconds(model, prompts, args.new_tokens, eos, bf16, folded)
                    long = decode_seconds(model, prompts, 2 * args.new_tokens, eos, bf16, folded)
                if long <= short:  # another load on the machine outweighed N steps
                    print(f"{batch:>6} {name:>10} {layout:>8} too noisy: t(2N) <= t(N); raise --new-tokens")
                    continue
                step = (long - short) / args.new_tokens
                print(f"{batch:>6} {name:>10} {layout:>8} {batch / step:>10.0f} {step * 1e3:>8.2f} "
                      f"{kv_bytes / 1e9:>11.2f} {floor_ms:>9.2f}")


if __name__ == "__main__":
    main()
