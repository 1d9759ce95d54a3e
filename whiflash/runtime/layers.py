"""Building blocks shared by the target runtime and the drafters: RMSNorm, SwiGLU, RoPE."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, as transformers does, then cast back."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


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

    def __call__(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate `x [..., T, head_dim]` by the angles of `positions [T]` (HF rotate-half convention)."""
        cos = self.cos[positions].to(x.dtype)
        sin = self.sin[positions].to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin
