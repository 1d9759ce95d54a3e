"""Weight products of a few rows (decode step, verify) as a Triton kernel: a candidate beside cuBLAS.

At batch 1 a decode step's products are matrix-vector products, bound by reading the weight once.
On the H200, cuBLAS reaches 97-102 % of copy bandwidth on the wide products (gate/up, LM head) but
59-80 % on o_proj, Q/K/V and down (docs/engine.md). This kernel gives every program a strip of
`BLOCK_N` output features and streams their weight rows along K, so each weight byte is read once,
coalesced, by a grid that fills the GPU; rows of `x` (up to 16) are padded to the tensor-core tile.

A strip may also be split along K over `SPLIT_K` programs (when the strips alone do not fill the GPU): the
last program of a strip to finish adds the partial sums in a fixed order, so results do not depend on
which finishes last. Each weight shape has one launch setting for every row count (`config`), so a product
rounds alike in a decode step and in a verify pass.

It runs the layers' products of at most `MAX_ROWS` rows on the GPU that do not widen their input
(o_proj, down) and those of the shapes in the settings table (`CONFIGS`, measured to beat cuBLAS, Q/K/V
among them, plus `EngineOptions.gemv_configs`); the layers pass the table `table_for(options)` gives them,
and None (`EngineOptions(gemv=False)`) leaves every product to cuBLAS. The residual add after a product
(`residual + x W^T`, after o_proj and down) rides along inside it, rounded as the separate add rounds
(the product to the dtype first), since it is a launch of its own otherwise (~1.5 us at batch 1, 72 per
Qwen3-8B step). SwiGLU's `silu(gate) * up` does not: every program would compute the whole activation
again, padded to 16 rows (tried: down went from 27 to ~150 us). `scripts/bench_gemv.py` and
`scripts/profile_shapes.py` time both per weight shape. Like the decode attention kernel it is a
`torch.library` custom op, and the CPU tests run it under Triton's interpreter.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType

import torch
import torch.nn.functional as F
from torch import Tensor

from whiflash.runtime.decode_attention import INTERPRET, triton
from whiflash.runtime.options import EngineOptions

if triton is not None:
    import triton.language as tl

MAX_ROWS = 16
"""Most rows of `x` the kernel takes (a verify pass of 16 tokens); more rows go to cuBLAS."""

BLOCK_N, BLOCK_K = 32, 512
"""Output features per program and weight columns per step: the best of `scripts/bench_gemv.py --quick` on
every Qwen3-8B product, 1 and 16 rows (H200, 2026-12-01; 4 warps)."""

Setting = tuple[int, int, int, int, int]
"""A launch setting: (BLOCK_N, BLOCK_K, SPLIT_K, warps, pipeline stages)."""

Table = Mapping[tuple[int, int], Setting]
"""(output features, input features) -> launch setting."""

CONFIGS: Table = MappingProxyType({
    # Qwen3-8B (and Llama-3.1-8B's attention): Q/K/V, o_proj, down
    (6144, 4096): (64, 256, 1, 4, 4), (4096, 4096): (32, 256, 1, 4, 4), (4096, 12288): (32, 512, 1, 4, 4),
    # Qwen3-4B: Q/K/V, o_proj, gate/up, down (its 2,560 output features fill the GPU only split in four)
    (6144, 2560): (64, 256, 1, 4, 4), (2560, 4096): (32, 256, 4, 4, 3), (19456, 2560): (32, 256, 1, 4, 4),
    (2560, 9728): (32, 256, 4, 4, 3),
})
"""(output features, input features) -> the setting that beat cuBLAS (and the default) on that weight shape,
1 and 16 rows summed: `scripts/bench_gemv.py --preset qwen3-8b,qwen3-4b --json` on an H200, 2026-12-01 (1 /
16 rows, us: Q/K/V 14.8 / 15.2 against cuBLAS's 15.6 / 15.9, o_proj 11.9 / 12.3 against 13.3 / 12.6, down
26.5 / 27.0 against 29.5 / 28.5). A widening product (Q/K/V, gate/up) runs the kernel only where it has one."""


def read_configs(path: str | os.PathLike[str]) -> dict[tuple[int, int], Setting]:
    """The settings of a `scripts/bench_gemv.py --json` file (a GPU of another kind than the one the
    built-in table was measured on), as a table to add to `CONFIGS`."""
    try:
        table = {tuple(map(int, key.split("x"))): tuple(map(int, value))
                 for key, value in json.loads(Path(path).read_text()).items()}
        if any(len(key) != 2 or len(value) != 5 for key, value in table.items()):
            raise ValueError("a key without two sizes or a setting without five numbers")
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise ValueError(f"{path}: expected a JSON object of \"NxK\": [BLOCK_N, BLOCK_K, SPLIT_K, warps, stages] "
                         f"(scripts/bench_gemv.py --json): {exc}") from exc
    return table  # type: ignore[return-value]


@lru_cache(maxsize=None)
def _table(path: str | None) -> Table:
    # one read per settings file and process: every layer of every model shares the same table object
    # a plain dict: what compiled layer stages read as a constant
    return dict(CONFIGS) if path is None else {**CONFIGS, **read_configs(path)}


def table_for(options: EngineOptions) -> Table | None:
    """The settings table the layers use under `options` (the built-in one plus its `gemv_configs` file), or
    None when `options.gemv` is off (every product through cuBLAS)."""
    return _table(options.gemv_configs) if options.gemv else None


def config(n: int, k: int, table: Table = CONFIGS) -> Setting:
    """The kernel's launch setting for a `[n, k]` weight: the same for every row count, so a product
    rounds alike in a decode step and in a verify pass."""
    return table.get((n, k), (BLOCK_N, BLOCK_K, 1, 4, 3))


def usable(x: Tensor, weight: Tensor, table: Table | None) -> bool:
    """True when `product(x, weight, table=table)` runs the kernel here (else cuBLAS; always with no table)."""
    if table is None or triton is None or not (x.is_cuda or INTERPRET):
        return False
    rows = x.numel() // x.shape[-1]
    # Products that do not widen (o_proj, down: the default setting beat cuBLAS on every one measured),
    # and a widening one where a measured setting did (cuBLAS reaches ~99 % of bandwidth on Qwen3-8B's gate/up).
    narrow = weight.shape[0] <= weight.shape[1] or tuple(weight.shape) in table
    return rows <= MAX_ROWS and narrow and weight.stride(-1) == 1 and x.dtype == weight.dtype


if triton is not None:

    @triton.jit
    def _finish(acc, B, R, Y, m, n, m_ok, n_ok, sr_m, sy_m, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
        """Bias, the cast to the output dtype, the residual add and the store of one output tile."""
        if HAS_BIAS:
            acc += tl.load(B + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        out = acc.to(Y.dtype.element_ty)
        y_ok = m_ok[:, None] & n_ok[None, :]
        if HAS_RESIDUAL:  # residual + product, the product rounded first (as `x + linear(...)` rounds)
            r = tl.load(R + m[:, None] * sr_m + n[None, :], mask=y_ok, other=0.0)
            out = (r.to(tl.float32) + out.to(tl.float32)).to(Y.dtype.element_ty)
        tl.store(Y + m[:, None] * sy_m + n[None, :], out, mask=y_ok)

    @triton.jit
    def _gemv(X, W, B, R, Y, P, C, M, N, K, sx_m, sw_n, sr_m, sy_m, HAS_BIAS: tl.constexpr,
              HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              SPLIT_K: tl.constexpr, IEEE: tl.constexpr):
        pid_n, pid_k = tl.program_id(0), tl.program_id(1)
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m = tl.arange(0, BLOCK_M)
        n_ok, m_ok = n < N, m < M
        span = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K  # this program's share of K, whole steps
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(pid_k * span, tl.minimum(pid_k * span + span, K), BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < K
            w = tl.load(W + n[:, None] * sw_n + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            x = tl.load(X + m[:, None] * sx_m + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            if IEEE:
                acc += tl.dot(x, tl.trans(w), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w))
        if SPLIT_K == 1:
            _finish(acc, B, R, Y, m, n, m_ok, n_ok, sr_m, sy_m, HAS_BIAS, HAS_RESIDUAL)
        else:
            # Split K: every program leaves its partial sums in P [SPLIT_K, M, N] and counts itself in
            # C[pid_n]; the last of a strip's programs adds the partials in split order (the same sum
            # whichever program comes last: deterministic), finishes the tile and resets the counter.
            tile = m[:, None] * N + n[None, :]
            ok = m_ok[:, None] & n_ok[None, :]
            tl.store(P + pid_k * M * N + tile, acc, mask=ok)
            if tl.atomic_add(C + pid_n, 1, sem="acq_rel") == SPLIT_K - 1:
                acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                for s in tl.static_range(SPLIT_K):
                    acc += tl.load(P + s * M * N + tile, mask=ok, other=0.0, cache_modifier=".cg")
                tl.atomic_xchg(C + pid_n, 0)
                _finish(acc, B, R, Y, m, n, m_ok, n_ok, sr_m, sy_m, HAS_BIAS, HAS_RESIDUAL)


_counters: dict[torch.device, list[Tensor]] = {}


def counters(device: torch.device, n: int) -> Tensor:
    """At least `n` zeroed int32 arrival counters on `device`, shared by every split-K launch (launches on
    one stream run one after another, and each leaves its counters at zero). Made outside graph capture
    (`Graphed` warms a pass up before capturing it); a larger set is added beside the old one, never in
    its place, since captured graphs keep reading the old one and do not keep it alive."""
    have = _counters.setdefault(device, [])
    if not have or have[-1].numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("gemv: split-K counters must be made before CUDA graph capture (run the pass once first)")
        have.append(torch.zeros(max(n, 1024), dtype=torch.int32, device=device))
    return have[-1]


@torch.library.custom_op("whiflash::gemv", mutates_args=())
def _gemv_op(x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor | None, setting: list[int]) -> Tensor:
    m = x.shape[0]
    n, k = weight.shape
    block_n, block_k, split_k, warps, stages = setting
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    r = residual if residual is not None else y
    grid = (triton.cdiv(n, block_n), split_k)
    partial = torch.empty(split_k, m, n, device=x.device, dtype=torch.float32) if split_k > 1 else y
    count = counters(x.device, grid[0]) if split_k > 1 else y
    _gemv[grid](x, weight, bias if bias is not None else weight, r, y, partial, count, m, n, k, x.stride(0),
                weight.stride(0), r.stride(0), y.stride(0), HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None,
                BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, IEEE=x.dtype == torch.float32,
                num_warps=warps, num_stages=stages)
    return y


@_gemv_op.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor | None, setting: list[int]) -> Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


def _rows(t: Tensor | None) -> Tensor | None:
    """`t [..., K]` as a `[rows, K]` matrix with unit stride along K."""
    if t is None:
        return None
    flat = t.reshape(-1, t.shape[-1])
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def gemv(x: Tensor, weight: Tensor, bias: Tensor | None = None, residual: Tensor | None = None,
         table: Table = CONFIGS, setting: Setting | None = None) -> Tensor:
    """`residual + F.linear(x, weight, bias)` (no residual: no add) by the kernel, for `x [..., K]` of at most
    `MAX_ROWS` rows, launched with `setting` (default: the one `table` gives the weight's shape)."""
    setting = setting or config(*weight.shape, table)
    y = _gemv_op(_rows(x), weight, bias, _rows(residual), list(setting))
    return y.reshape(*x.shape[:-1], weight.shape[0])


def product(x: Tensor, weight: Tensor, bias: Tensor | None = None, residual: Tensor | None = None,
            table: Table | None = None) -> Tensor:
    """`F.linear(x, weight, bias)` (plus `residual`): through the kernel where `usable` (few rows on the GPU,
    a settings `table` given), else `F.linear`."""
    if usable(x, weight, table):
        return gemv(x, weight, bias, residual, table)  # type: ignore[arg-type]
    y = F.linear(x, weight, bias)
    return y if residual is None else residual + y


def linear(x: Tensor, layer: torch.nn.Linear, residual: Tensor | None = None, table: Table | None = None) -> Tensor:
    """`layer(x)` (plus `residual`), by `product`."""
    return product(x, layer.weight, layer.bias, residual, table)
