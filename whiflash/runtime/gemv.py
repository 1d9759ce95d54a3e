"""Weight products of a few rows (decode step, verify) as a Triton kernel: a candidate beside cuBLAS.

At batch 1 a decode step's products are matrix-vector products, bound by reading the weight once.
On the H200, cuBLAS reaches 97-102 % of copy bandwidth on the wide products (gate/up, LM head) but
59-80 % on o_proj, Q/K/V and down (docs/engine.md). This kernel gives every program a strip of
`BLOCK_N` output features and streams their weight rows along K, so each weight byte is read once,
coalesced, by a grid that fills the GPU; rows of `x` (up to 16) are padded to the tensor-core tile.

It runs the layers' products of at most `MAX_ROWS` rows on the GPU that do not widen their input
(o_proj, down: the shapes where it beat cuBLAS at 1 and 16 rows); `WHIFLASH_GEMV=0` or
`gemv.ENABLED = False` leaves every product to cuBLAS. The residual add after a product
(`residual + x W^T`, after o_proj and down) rides along inside it, rounded as the separate add rounds
(the product to the dtype first), since it is a launch of its own otherwise (~1.5 us at batch 1, 72 per
Qwen3-8B step). SwiGLU's `silu(gate) * up` does not: every program would compute the whole activation
again, padded to 16 rows (tried: down went from 27 to ~150 us). `scripts/bench_gemv.py` and
`scripts/profile_shapes.py` time both per weight shape. Like the decode attention kernel it is a
`torch.library` custom op, and the CPU tests run it under Triton's interpreter.
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
    def _gemv(X, W, B, R, Y, M, N, K, sx_m, sw_n, sr_m, sy_m, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
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
        out = acc.to(Y.dtype.element_ty)
        y_ok = m_ok[:, None] & n_ok[None, :]
        if HAS_RESIDUAL:  # residual + product, the product rounded first (as `x + linear(...)` rounds)
            r = tl.load(R + m[:, None] * sr_m + n[None, :], mask=y_ok, other=0.0)
            out = (r.to(tl.float32) + out.to(tl.float32)).to(Y.dtype.element_ty)
        tl.store(Y + m[:, None] * sy_m + n[None, :], out, mask=y_ok)


@torch.library.custom_op("whiflash::gemv", mutates_args=())
def _gemv_op(x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor | None) -> Tensor:
    m = x.shape[0]
    n, k = weight.shape
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    r = residual if residual is not None else y
    _gemv[(triton.cdiv(n, BLOCK_N),)](
        x, weight, bias if bias is not None else weight, r, y, m, n, k, x.stride(0), weight.stride(0), r.stride(0),
        y.stride(0), HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None, BLOCK_M=16,
        BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, IEEE=x.dtype == torch.float32)
    return y


@_gemv_op.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor | None) -> Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


def _rows(t: Tensor | None) -> Tensor | None:
    """`t [..., K]` as a `[rows, K]` matrix with unit stride along K."""
    if t is None:
        return None
    flat = t.reshape(-1, t.shape[-1])
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def gemv(x: Tensor, weight: Tensor, bias: Tensor | None = None, residual: Tensor | None = None) -> Tensor:
    """`residual + F.linear(x, weight, bias)` (no residual: no add) by the kernel, for `x [..., K]` of at most
    `MAX_ROWS` rows."""
    y = _gemv_op(_rows(x), weight, bias, _rows(residual))
    return y.reshape(*x.shape[:-1], weight.shape[0])


def product(x: Tensor, weight: Tensor, bias: Tensor | None = None, residual: Tensor | None = None) -> Tensor:
    """`F.linear(x, weight, bias)` (plus `residual`): through the kernel where `usable` (few rows on the GPU,
    turned on), else `F.linear`."""
    if usable(x, weight):
        return gemv(x, weight, bias, residual)
    y = F.linear(x, weight, bias)
    return y if residual is None else residual + y


def linear(x: Tensor, layer: torch.nn.Linear, residual: Tensor | None = None) -> Tensor:
    """`layer(x)` (plus `residual`), by `product`."""
    return product(x, layer.weight, layer.bias, residual)
