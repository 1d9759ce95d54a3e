"""Masked attention of a short query block over a static K/V cache: a split-K Triton kernel.

Fixed-shape passes (decode step, chain and tree verify, drafter steps) attend over the whole static
cache under a boolean mask, so that their shapes never change. PyTorch's fused SDPA kernels then read
every slot, and at batch 1 they run one thread block per K/V head (8 on 132 SMs for Qwen3-8B):
latency-bound, ~30 us a layer at context 1024. This kernel splits the keys into tiles spread over the
whole GPU (flash-decoding), skips every tile in which the mask shows nothing (so only the live part of
the cache is read, wherever the mask says it is) and merges the tiles' partial softmaxes in a second
kernel. Its result is the same masked attention as `F.scaled_dot_product_attention` (float32
accumulation; float32 inputs use IEEE products, no TF32).

Layout: query heads that share a K/V head are folded into one row block (row `g * T + t` is query
position `t` of head `h * group + g`, transformers' `repeat_kv` grouping), read in place from `q`'s
strides; the output is written as `[T, Hq, D]`, the layout the output projection reads, and returned
as its `[Hq, T, D]` view.

The kernel is a `torch.library` custom op (`whiflash::masked_attention`), so compiled layers keep it
as one opaque call. `usable` decides where it runs: CUDA tensors (or the Triton interpreter,
`TRITON_INTERPRET=1`, which is how the CPU tests check it) and Triton installed; the layers ask only
while `EngineOptions.attention_kernel` is on. Everything else keeps PyTorch's SDPA.
"""
from __future__ import annotations

import math
import os

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the engine keeps SDPA
    triton = None

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
"""Triton's interpreter runs the kernels on CPU tensors (slowly): the CPU tests' way to check them."""

MAX_QUERIES = 129
"""Longest query block (positions, before folding the head group) the kernel takes: a tree verify up to
DDTree's budget 128. On an H100 (bf16, CUDA graphs, context 1024) a tree verify of 65 / 129 nodes takes
10.41 / 11.62 ms with the kernel against 11.45 / 12.23 ms with SDPA at Qwen3-8B's shapes, and 3.87 / 3.97
against 5.03 / 5.09 ms at the `small` testbed's, where 33 nodes take 3.79 ms either way (SDPA's masked
path has a fixed cost the kernel does not); at 257 nodes SDPA is 2% faster at Qwen3-8B's shapes, so
longer passes (prefill) stay with it."""

BLOCK_N = 64
"""Keys per tile; a tile is read only when the mask shows at least one of its keys to some row."""

MAX_SPLITS: int | None = None
"""Most splits of the key axis per (head, row block), tiles grouped so that no more are made; None: 32 for
one query position (the decode step), 16 for blocks. The fastest of 8/16/32/64 on the H200 at context 1024
for Qwen3-8B's shapes (8.3 / 12.4 us for 1 / 33 positions; 2026-12-01), once the merge read every split
at once."""


def available() -> bool:
    """True when the kernel can run on a GPU here (Triton installed)."""
    return triton is not None


def usable(q: Tensor, k: Tensor, mask: Tensor | None) -> bool:
    """True when `masked_attention(q, k, v, mask)` can run here (else use SDPA)."""
    if not available() or mask is None or mask.dtype != torch.bool:  # additive float masks: SDPA
        return False
    if not (q.is_cuda or INTERPRET):
        return False
    return (q.shape[1] <= MAX_QUERIES and q.shape[-1] <= 256 and q.shape[0] % k.shape[0] == 0
            and q.dtype in (torch.float32, torch.bfloat16, torch.float16) and k.stride(-1) == 1)


if triton is not None:

    @triton.jit
    def _partial(Q, K, V, Mask, Acc, M, L,
                 sq_h, sq_t, sk_h, sk_s, sv_h, sv_s, sm_t, sm_s,
                 rows, T, S, D, group, n_splits, scale_log2,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DP: tl.constexpr, TILES: tl.constexpr,
                 IEEE: tl.constexpr):
        rb, split, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        r = rb * BLOCK_M + tl.arange(0, BLOCK_M)
        d = tl.arange(0, DP)  # head dim padded to a power of two >= 16 (tl.dot's least)
        d_ok = d < D
        row_ok = r < rows
        t = r % T
        head = h * group + r // T
        q = tl.load(Q + head[:, None] * sq_h + t[:, None] * sq_t + d[None, :], mask=row_ok[:, None] & d_ok[None, :],
                    other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, DP], tl.float32)
        for i in range(TILES):
            n = (split * TILES + i) * BLOCK_N + tl.arange(0, BLOCK_N)
            col_ok = n < S
            seen = tl.load(Mask + t[:, None] * sm_t + n[None, :] * sm_s, mask=row_ok[:, None] & col_ok[None, :],
                           other=0) != 0
            if tl.max(seen.to(tl.int32)) > 0:  # tiles nobody may see are never read
                kv_ok = col_ok[:, None] & d_ok[None, :]
                k = tl.load(K + h * sk_h + n[:, None] * sk_s + d[None, :], mask=kv_ok, other=0.0)
                if IEEE:
                    s = tl.dot(q, tl.trans(k), input_precision="ieee")
                else:
                    s = tl.dot(q, tl.trans(k))
                s = tl.where(seen, s * scale_log2, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing yet stay at 0
                alpha = tl.exp2(m_i - m_ref)
                p = tl.exp2(s - m_ref[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                v = tl.load(V + h * sv_h + n[:, None] * sv_s + d[None, :], mask=kv_ok, other=0.0)
                if IEEE:
                    pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
                else:
                    pv = tl.dot(p.to(v.dtype), v)
                acc = acc * alpha[:, None] + pv
                m_i = m_new
        base = (h * n_splits + split) * rows
        tl.store(M + base + r, m_i, mask=row_ok)
        tl.store(L + base + r, l_i, mask=row_ok)
        tl.store(Acc + (base + r)[:, None] * DP + d[None, :], acc, mask=row_ok[:, None] & (l_i > 0)[:, None])

    @triton.jit
    def _merge(Acc, M, L, Out, rows, T, D, group, n_splits, so_t, so_h, DP: tl.constexpr, SPLITS: tl.constexpr):
        # one program per (folded row, K/V head): every split's partial is read in one go, not split by split
        r, h = tl.program_id(0), tl.program_id(1)
        s = tl.arange(0, SPLITS)
        d = tl.arange(0, DP)
        part = (h * n_splits + s) * rows + r
        m = tl.load(M + part, mask=s < n_splits, other=float("-inf"))
        l_ = tl.load(L + part, mask=s < n_splits, other=0.0)
        live = l_ > 0  # empty splits wrote no partial sum: nothing to read
        m_max = tl.max(m, 0)
        w = tl.where(live, tl.exp2(m - tl.where(m_max == float("-inf"), 0.0, m_max)), 0.0)
        l_sum = tl.sum(w * l_, 0)
        acc = tl.load(Acc + part[:, None] * DP + d[None, :], mask=live[:, None], other=0.0)
        out = tl.sum(acc * w[:, None], 0) / tl.where(l_sum > 0, l_sum, 1.0)  # a row that sees no key gets zeros
        t = r % T
        head = h * group + r // T
        tl.store(Out + t * so_t + head * so_h + d, out.to(Out.dtype.element_ty), mask=d < D)


@torch.library.custom_op("whiflash::masked_attention", mutates_args=())
def _masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    hq, t, d = q.shape
    hkv, s = k.shape[0], k.shape[1]
    group = hq // hkv
    rows = group * t
    block_m = min(64, max(16, triton.next_power_of_2(rows)))
    dp = max(16, triton.next_power_of_2(d))
    row_blocks = triton.cdiv(rows, block_m)
    tiles = triton.cdiv(s, BLOCK_N)
    per_split = triton.cdiv(tiles, MAX_SPLITS or (32 if t == 1 else 16))
    n_splits = triton.cdiv(tiles, per_split)
    acc = torch.empty(hkv, n_splits, rows, dp, device=q.device, dtype=torch.float32)
    m = torch.empty(hkv, n_splits, rows, device=q.device, dtype=torch.float32)
    l_ = torch.empty_like(m)
    out = torch.empty(t, hq, d, device=q.device, dtype=q.dtype)
    seen = mask.view(torch.uint8)
    scale_log2 = (1.0 / math.sqrt(d)) * 1.4426950408889634  # softmax in base 2
    _partial[(row_blocks, n_splits, hkv)](
        q, k, v, seen, acc, m, l_,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), seen.stride(0), seen.stride(1),
        rows, t, s, d, group, n_splits, scale_log2,
        BLOCK_M=block_m, BLOCK_N=BLOCK_N, DP=dp, TILES=per_split, IEEE=q.dtype == torch.float32)
    _merge[(rows, hkv)](acc, m, l_, out, rows, t, d, group, n_splits, out.stride(0), out.stride(1), DP=dp,
                        SPLITS=triton.next_power_of_2(n_splits), num_warps=2)
    return out


@_masked_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    return q.new_empty(q.shape[1], q.shape[0], q.shape[2])


def masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """`softmax(q k^T / sqrt(D) | mask) v` of `q [Hq, T, D]` over `k, v [Hkv, S, D]` with `mask [T, S]`
    (True: may attend; any strides) -> `[Hq, T, D]` (a view of a `[T, Hq, D]` tensor). A row that may
    see no key gets zeros. Check `usable` first."""
    if q.stride(-1) != 1:
        q = q.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    return _masked_attention(q, k, v, mask).transpose(0, 1)
