"""The one static K/V cache type, and where a pass's rows go in it.

Every pass of the target and of the drafters writes K/V for its rows into a cache sized once per
sequence, in one of two modes, named explicitly by `Rows`:

* eager: rows occupy slots `[start, start + n)` and attend to slots `< start + n` (exact shapes,
  for the CPU, debugging and the prefill);
* fixed shape: rows occupy the slots of an index tensor and attend to the whole cache under a
  mask, so the pass has the same shapes every round and can be captured as a CUDA graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Rows:
    """Where a pass's rows sit in a cache; `Rows(start)` is eager, `Rows(slots=index)` fixed-shape."""

    start: int = 0
    """Eager passes: the first slot."""
    slots: Tensor | None = None
    """Fixed-shape passes: `[n]` slot of every row (a graph input, so its values change freely)."""

    @property
    def fixed(self) -> bool:
        return self.slots is not None


class KVCache:
    """K and V of `layers` attention layers over `slots` positions (batch 1): `[layers, kv_heads, slots, head_dim]`."""

    def __init__(self) -> None:
        self.k = self.v = torch.empty(0)

    @property
    def slots(self) -> int:
        return self.k.shape[2] if self.k.dim() == 4 else 0

    def ensure(self, layers: int, kv_heads: int, slots: int, head_dim: int, device: torch.device,
               dtype: torch.dtype, grow_only: bool = False) -> bool:
        """Allocate (zeroed) unless the cache already has this shape, device and dtype (with
        `grow_only`, unless it already holds at least `slots`). True when it was (re)allocated:
        captured graphs that point at the old tensors must then be dropped."""
        shape = (layers, kv_heads, slots, head_dim)
        same = self.k.device == torch.device(device) and self.k.dtype == dtype and self.k.dim() == 4
        if same and (self.k.shape == shape or (grow_only and self.k.shape[:2] == shape[:2] and self.slots >= slots
                                                and self.k.shape[3] == head_dim)):
            return False
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        return True

    def write(self, layer: int, k: Tensor, v: Tensor, rows: Rows) -> tuple[Tensor, Tensor]:
        """Store `k, v [kv_heads, n, head_dim]` of `rows` in `layer`; return the keys and values the
        rows attend over (eager: slots `< start + n`; fixed shape: the whole layer)."""
        kc, vc = self.k[layer], self.v[layer]
        if rows.fixed:
            write_slots(kc, vc, k, v, rows.slots)
            return kc, vc
        end = rows.start + k.shape[1]
        kc[:, rows.start : end] = k
        vc[:, rows.start : end] = v
        return kc[:, :end], vc[:, :end]

    def compact(self, start: int, keep: Tensor) -> None:
        """Move slots `start + keep` to `[start, start + len(keep))` in every layer (an accepted tree path)."""
        src, n = keep + start, keep.shape[0]
        self.k[:, :, start : start + n] = self.k[:, :, src]
        self.v[:, :, start : start + n] = self.v[:, :, src]


def write_slots(kc: Tensor, vc: Tensor, k: Tensor, v: Tensor, slots: Tensor) -> None:
    """Store `k, v [kv_heads, n, head_dim]` at `slots [n]` of one layer's `kc, vc [kv_heads, S, head_dim]`.

    Also called inside compiled layer stages (`EngineOptions.compiled_layers`), where inductor turns it
    into a scatter into the cache fused with the kernel that computes K (or V), instead of two launches."""
    kc.index_copy_(1, slots, k)
    vc.index_copy_(1, slots, v)
