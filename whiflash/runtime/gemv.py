"""Weight products of a few rows (decode step, verify) as a Triton kernel: a candidate beside cuBLAS.

At batch 1 a decode step's products are matrix-vector products, bound by reading the weight once.
On the H200, cuBLAS reaches 97-102 % of copy bandwidth on the wide products (gate/up, LM head) but
59-80 % on o_proj, Q/K/V and down (docs/engine.md). This kernel gives every program a strip of
`BLOCK_N` output features and streams their weight rows along K, so each weight byte is read once,
coalesced, by a grid that fills the GPU; rows of `x` (up to 16) are padded to the tensor-core tile.

It runs the layers' products of at most `MAX_ROWS` rows on the GPU that do not widen their input
(o_proj, down: the shapes where it beat cuBLAS at 1 and 16 rows); `WHIFLASH_GEMV=0` or
`gemv.ENABLED = False` leaves every product to cuBLAS. `scripts/bench_gemv.py` and
`scripts/profile_shapes.py` time both per weight shape. Like the decode
attention kernel it is a `torch.library` custom op, and the CPU tests run it under Triton's interpreter.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import Tensor

from whiflash.runtime.decode_attention import INTERPRET, triton

if triton is not None:
    import triton.language as tl

ENABLED = os.environ.get("WHIFLASH_GEMV", "1") != "0"
"""Route the layers' few-row products that do not widen through the kernel (on by default since it beat
cuBLAS on each of them and took Qwen3-8B's compiled AR step from 5.38 to 5.01 ms, H200, 2026-12-01)."""

MAX_ROWS = 16
"""Most rows of `x` the kernel takes (a verify pass of 16 tokens); more rows go to cuBLAS."""

BLOCK_N, BLOCK_K = 32, 512
"""Output features per program and weight columns per step: the best of `scripts/bench_gemv.py --quick` on
every Qwen3-8B product, 1 and 16 rows (H200, 2026-12-01; 4 warps)."""


def usable(x: Tensor, weight: Tensor) -> bool:
    """True when `linear(x, weight)` runs the kernel here (else cuBLAS)."""
    if not ENABLED or triton is None or not (x.is_cuda or INTERPRET):
        return False
    rows = x.numel() // x.shape[-1]
    # Only products that do not widen (o_proj, down): there the kernel beat cuBLAS (o_proj 11.6 vs 13.3 us,
    # down 26.8 vs 30.1 us at Qwen3-8B), while cuBLAS holds 74-95 % of bandwidth on Q/K/V and gate/up.
    narrow = weight.shape[0] <= weight.shape[1]
    return rows <= MAX_ROWS and narrow and weight.stride(-1) == 1 and x.dtype == weight.dtype


if triton is not None:

    @triton.jit
    def _gemv(X, W, B, Y, M, N, K, sx_m, sw_n, sy_m, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        m = tl.arange(0, BLOCK_M)
        n_ok, m_ok = n < N, m < M
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < K
            w = tl.load(W + n[:, None] * sw_n + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            x = tl.load(X + m[:, None] * sx_m + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            if IEEE:
                acc += tl.dot(x, tl.trans(w), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w))
        if HAS_BIAS:
            acc += tl.load(B + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(Y + m[:, None] * sy_m + n[None, :], acc.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@torch.library.custom_op("whiflash::gemv", mutates_args=())
def _gemv_op(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    _gemv[(triton.cdiv(n, BLOCK_N),)](
        x, weight, bias if bias is not None else weight, y, m, n, k, x.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=16, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, IEEE=x.dtype == torch.float32)
    return y


@_gemv_op.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


def gemv(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`F.linear(x, weight, bias)` by the kernel, for `x [..., K]` of at most `MAX_ROWS` rows."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    return _gemv_op(flat, weight, bias).reshape(*x.shape[:-1], weight.shape[0])


def linear(x: Tensor, layer: torch.nn.Linear) -> Tensor:
    """`layer(x)`: through the kernel where `usable` (few rows on the GPU, turned on), else `F.linear`."""
    if usable(x, layer.weight):
        return gemv(x, layer.weight, layer.bias)
    return F.linear(x, layer.weight, layer.bias)
