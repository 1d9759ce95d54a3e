"""Building blocks shared by the target runtime and the drafters: RMSNorm, SwiGLU, RoPE, attention."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from whiflash.runtime.cache import KVCache, Rows

VARYING_SHAPE_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""SDPA kernels for passes whose shapes change from call to call (eager decoding, prefill).

cuDNN attention builds an execution plan for every new shape: on the H200, eager decoding at the
small testbed's shapes (a new key length every step) took 53-88 ms per token with it and 6 ms
without. Fixed-shape passes (CUDA graphs) keep PyTorch's choice: their one plan is built once."""


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, as transformers does, then cast back."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # one fused kernel for the normalisation (the composite form is 6 launches per call, and a
        # decode step makes ~150 of these calls)
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


class SwiGLU(nn.Module):
    """`down(silu(gate(x)) * up(x))` with HF parameter names."""

    def __init__(self, dim: int, hidden: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None = None) -> Tensor:
    """Inverse frequencies of rotary embeddings, with Llama-3.1 (`llama3`) or linear scaling."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").double() / head_dim))
    if not scaling:
        return inv_freq.float()
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = float(scaling["factor"])
    if kind == "linear":
        return (inv_freq / factor).float()
    # llama3: long wavelengths are divided by `factor`, short ones kept, a smooth ramp between.
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_ctx = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled).float()


class Rotary:
    """cos/sin tables over absolute positions, kept in float32 whatever the model dtype.

    A plain object rather than a module, so that casting a model to bf16 never casts the tables
    (transformers also keeps its rotary frequencies in float32).
    """

    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any] | None) -> None:
        self.head_dim, self.theta, self.scaling = head_dim, theta, scaling
        self.cos = self.sin = None  # built by `ensure` once the device and cache length are known
        self._cast: dict[torch.dtype, Tensor] = {}

    def ensure(self, n: int, device: torch.device | str) -> None:
        """Make the tables cover positions `< n` on `device` (called when a cache is sized)."""
        device = torch.device(device)
        if self.cos is not None:
            if n <= self.cos.shape[0] and self.cos.device == device:
                return
            n = max(n, self.cos.shape[0])
        cpu = torch.device("cpu")  # also correct when called under a `torch.device("meta")` context
        inv_freq = rope_inv_freq(self.head_dim, self.theta, self.scaling).to(cpu)
        freqs = torch.outer(torch.arange(n, dtype=torch.float32, device=cpu), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos, self.sin = emb.cos().to(device), emb.sin().to(device)
        self._cast = {}

    def table(self, dtype: torch.dtype) -> Tensor:
        """`[n, 2, head_dim]`: cos and sign-folded sin rounded to `dtype` (as transformers rounds them).

        The sin half that multiplies the negated half of rotate-half carries the minus sign, so the
        rotation is `x * cos + roll(x, half) * sin'`: no negation and no concatenation per call.
        """
        if dtype not in self._cast:
            half = self.head_dim // 2
            sin = torch.cat([-self.sin[:, :half], self.sin[:, half:]], dim=-1)
            self._cast[dtype] = torch.stack([self.cos, sin], dim=1).to(dtype)
        return self._cast[dtype]

    def __call__(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate `x [..., T, head_dim]` by the angles of `positions [T]` (HF rotate-half convention)."""
        cos_sin = self.table(x.dtype)[positions]
        return x * cos_sin[:, 0] + x.roll(x.shape[-1] // 2, dims=-1) * cos_sin[:, 1]


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, fixed_shape: bool = False) -> Tensor:
    """Grouped-query attention of `q [Hq, T, D]` over `k, v [Hkv, S, D]` -> `[Hq, T, D]`.

    `mask [T, S]` is boolean (True: may attend), or None when every query sees every key. Query
    heads sharing a K/V head (transformers' `repeat_kv` grouping: head `h` reads K/V head
    `h // (Hq / Hkv)`) are folded into the query length, so K/V are never expanded and one fused
    SDPA kernel (flash, cuDNN or memory-efficient, as PyTorch picks) serves every shape;
    `fixed_shape=False` (a shape this call may never see again) leaves cuDNN out.
    """
    hq, t, d = q.shape
    group = hq // k.shape[0]
    q = q.reshape(k.shape[0], group * t, d)
    if mask is not None and group > 1:
        mask = mask.repeat(group, 1)
    if fixed_shape:
        out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask)
    else:
        with sdpa_kernel(VARYING_SHAPE_BACKENDS):
            out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask)
    return out[0].reshape(hq, t, d)  # fused kernels return a head-strided layout: not viewable


class Attention(nn.Module):
    """Grouped-query self-attention over a static `KVCache`, with transformers' parameter names.

    One module serves the target (Qwen3 / Llama), DFlash's layers (always Q/K norms; the block
    attends to the cached context and to itself) and EAGLE-3's mid layer (`dim_in = 2H`, no Q/K
    norms): their maths is the same. `kv` alone is what a K/V-only catch-up needs.
    """

    def __init__(self, dim_in: int, dim_out: int, n_heads: int, n_kv: int, head_dim: int, bias: bool = False,
                 qk_norm: bool = False, eps: float = 1e-6) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = n_heads, n_kv, head_dim
        self.q_proj = nn.Linear(dim_in, n_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(dim_in, n_kv * head_dim, bias=bias)
        self.v_proj = nn.Linear(dim_in, n_kv * head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * head_dim, dim_out, bias=bias)
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps)
            self.k_norm = RMSNorm(head_dim, eps)

    def kv(self, x: Tensor, rope: Rotary, positions: Tensor) -> tuple[Tensor, Tensor]:
        """K (normed, rotated) and V of rows `x [T, dim_in]`, each `[n_kv, T, head_dim]`."""
        t = x.shape[0]
        k = self.k_proj(x).view(t, self.nkv, self.hd)
        if self.qk_norm:
            k = self.k_norm(k)
        return rope(k.transpose(0, 1), positions), self.v_proj(x).view(t, self.nkv, self.hd).transpose(0, 1)

    def attend(self, x: Tensor, rope: Rotary, positions: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None,
               fixed_shape: bool) -> Tensor:
        """Queries of rows `x` against `keys, values [n_kv, S, head_dim]` (mask `[T, S]` or None: all visible)."""
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.nh, self.hd)
        if self.qk_norm:
            q = self.q_norm(q)
        q = rope(q.transpose(0, 1), positions)
        return self.o_proj(attention(q, keys, values, mask, fixed_shape).transpose(0, 1).reshape(t, -1))

    def forward(self, x: Tensor, rope: Rotary, positions: Tensor, cache: KVCache, layer: int, rows: Rows,
                mask: Tensor | None) -> Tensor:
        """Write the K/V of rows `x` into `cache` layer `layer` at `rows` (a `Rows`), then attend."""
        keys, values = cache.write(layer, *self.kv(x, rope, positions), rows)
        return self.attend(x, rope, positions, keys, values, mask, rows.fixed)


class DecoderLayer(nn.Module):
    """Pre-norm transformer layer (Qwen3 / Llama; also every DFlash draft layer): attention, then SwiGLU."""

    def __init__(self, hidden: int, intermediate: int, n_heads: int, n_kv: int, head_dim: int, eps: float = 1e-6,
                 attention_bias: bool = False, qk_norm: bool = False, mlp_bias: bool = False) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(hidden, hidden, n_heads, n_kv, head_dim, attention_bias, qk_norm, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = SwiGLU(hidden, intermediate, mlp_bias)

    def forward(self, x: Tensor, rope: Rotary, positions: Tensor, cache: KVCache, index: int, rows: Rows,
                mask: Tensor | None) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, positions, cache, index, rows, mask)
        return x + self.mlp(self.post_attention_layernorm(x))
