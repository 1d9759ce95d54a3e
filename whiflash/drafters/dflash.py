"""DFlash: a block-diffusion drafter that fills `[pending, MASK x (b-1)]` in one forward.

Checkpoint contract (z-lab, reference/dflash_ddtree.md section 1): a Qwen3 config with top-level
`block_size`, nested `dflash_config.{mask_token_id, target_layer_ids}`; unprefixed keys `fc`,
`hidden_norm`, `layers.{i}.*` (Qwen3 layers with q/k norms), `norm`. No embedding and no LM head:
both are the target's, and MASK is a row of the target's embedding.

The fused context (`hidden_norm(fc(taps))`) never runs through the layers: each layer projects it
with its own K/V weights, so catching up on committed positions is K/V-only by construction.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from whiflash.drafters.base import Drafter, Proposal, pad_rows
from whiflash.runtime.config import rope_from_config
from whiflash.runtime.layers import RMSNorm, Rotary, SwiGLU, attention


def fallback_layer_ids(target_layers: int, n: int) -> list[int]:
    """z-lab's rule when `target_layer_ids` is absent: n ids spread evenly over 1 .. L-3."""
    if n == 1:
        return [target_layers // 2]
    lo, hi = 1, target_layers - 3
    return [round(lo + i * (hi - lo) / (n - 1)) for i in range(n)]


def normalise_config(cfg: dict[str, Any], target_layers: int, mask_token_id: int | None = None) -> dict[str, Any]:
    """Resolve the nested/renamed fields of the DFlash configs seen in the wild."""
    cfg = dict(cfg)
    dcfg = cfg.get("dflash_config") or {}
    taps = dcfg.get("target_layer_ids") or cfg.get("target_layer_ids")
    if not taps:
        n_taps = dcfg.get("num_target_features") or cfg.get("num_hidden_layers", 1)
        taps = fallback_layer_ids(dcfg.get("num_target_layers") or cfg.get("num_target_layers") or target_layers, n_taps)
    cfg["tap_layers"] = list(taps)
    mask = dcfg.get("mask_token_id", cfg.get("mask_token_id", mask_token_id))
    if mask is None:
        raise ValueError("dflash config: 'dflash_config.mask_token_id' is missing and no mask_token_id was given")
    cfg["mask_token_id"] = int(mask)
    if "block_size" not in cfg:
        raise ValueError("dflash config: required top-level field 'block_size' is missing")
    cfg["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    cfg["num_key_value_heads"] = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    return cfg


class BlockAttention(nn.Module):
    """Qwen3 attention whose keys are [cached context K/V | block K/V], non-causal within the block."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        h, self.hd = cfg["hidden_size"], cfg["head_dim"]
        self.nh, self.nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        eps, bias = cfg.get("rms_norm_eps", 1e-6), bool(cfg.get("attention_bias", False))
        self.q_proj = nn.Linear(h, self.nh * self.hd, bias=bias)
        self.k_proj = nn.Linear(h, self.nkv * self.hd, bias=bias)
        self.v_proj = nn.Linear(h, self.nkv * self.hd, bias=bias)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=bias)
        self.q_norm = RMSNorm(self.hd, eps)
        self.k_norm = RMSNorm(self.hd, eps)

    def kv(self, x: Tensor, rope: Rotary, positions: Tensor) -> tuple[Tensor, Tensor]:
        t = x.shape[0]
        k = rope(self.k_norm(self.k_proj(x).view(t, self.nkv, self.hd)).transpose(0, 1), positions)
        v = self.v_proj(x).view(t, self.nkv, self.hd).transpose(0, 1)
        return k, v

    def forward(
        self, x: Tensor, rope: Rotary, positions: Tensor, kc: Tensor, vc: Tensor, start: int | Tensor, mask: Tensor | None
    ) -> Tensor:
        """Block rows at slot `start` onward (eager; keys are slots `< start + T`), or at the `[T]` slots
        tensor `start` with the whole cache under `mask` (static shapes)."""
        t = x.shape[0]
        q = rope(self.q_norm(self.q_proj(x).view(t, self.nh, self.hd)).transpose(0, 1), positions)
        k, v = self.kv(x, rope, positions)
        # the block's K/V go to scratch slots past the context: dropped (overwritten) after the round
        if isinstance(start, Tensor):
            kc.index_copy_(1, start, k)
            vc.index_copy_(1, start, v)
        else:
            kc[:, start : start + t] = k
            vc[:, start : start + t] = v
            kc, vc = kc[:, : start + t], vc[:, : start + t]
        return self.o_proj(attention(q, kc, vc, mask, isinstance(start, Tensor)).transpose(0, 1).reshape(t, -1))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        h, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.input_layernorm = RMSNorm(h, eps)
        self.self_attn = BlockAttention(cfg)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.mlp = SwiGLU(h, cfg["intermediate_size"], bool(cfg.get("mlp_bias", False)))

    def forward(
        self, x: Tensor, rope: Rotary, positions: Tensor, kc: Tensor, vc: Tensor, start: int | Tensor, mask: Tensor | None
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, positions, kc, vc, start, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(Drafter):
    """Chain proposals: the argmax of each of the `block_size - 1` masked positions."""

    kind = "dflash"

    def __init__(self, cfg: dict[str, Any], block_size: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.block_size = int(block_size or cfg["block_size"])
        if self.block_size < 2:
            raise ValueError(f"dflash: block_size must be >= 2, got {self.block_size}")
        self.mask_token_id = cfg["mask_token_id"]
        self.tap_layers = tuple(cfg["tap_layers"])
        h, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.fc = nn.Linear(len(self.tap_layers) * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, eps)
        self.layers = nn.ModuleList(DFlashLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(h, eps)
        theta, scaling = rope_from_config(cfg)
        self.rope = Rotary(cfg["head_dim"], theta, scaling)
        self.k_cache = self.v_cache = torch.empty(0)

    @property
    def max_nodes(self) -> int:
        return self.block_size - 1

    def _setup_cache(self, max_len: int) -> None:
        a, w = self.layers[0].self_attn, self.fc.weight
        shape = (len(self.layers), a.nkv, max_len + 4 * self.catch_up_rows, a.hd)  # block / padded catch-up room
        if self.k_cache.shape != shape or self.k_cache.device != w.device or self.k_cache.dtype != w.dtype:
            self.k_cache = torch.zeros(shape, device=w.device, dtype=w.dtype)
            self.v_cache = torch.zeros_like(self.k_cache)
            self._cols = torch.arange(shape[2], device=w.device)
            if self.graphs:  # captured graphs point at the old cache
                self.graphs = {}
        self.rope.ensure(shape[2] + 1, w.device)
        self._masks = torch.full((self.block_size - 1,), self.mask_token_id, dtype=torch.long, device=w.device)

    @property
    def catch_up_rows(self) -> int:
        return self.block_size

    @torch.no_grad()
    def catch_up(self) -> None:
        """Write the context K/V of every backlog position, for all layers.

        Eager: one pass over exactly the backlog. Fixed shapes: `catch_up_passes`, the last
        zero-padded; padded rows write slots past the context, which the next block pass
        overwrites before any query can see them.
        """
        commit = self.take_backlog()
        if commit is None:
            return
        taps = self.select_taps(commit)
        n, start = taps.shape[0], commit.start
        if not self.fixed_shapes:
            self._context(taps, self._cols[start : start + n], start)
        else:
            c, passes = self.catch_up_passes(n)
            for s in passes:
                slots = self._cols[start + s : start + s + c]
                self.run_fixed(f"context{c}", self._context, pad_rows(taps[s : s + c], c), slots, slots)
        self.kv_len = start + n

    def _context(self, taps: Tensor, positions: Tensor, where: int | Tensor) -> None:
        """K/V of context rows (`hidden_norm(fc(taps))` through each layer's projections) at slot
        `where` onward (int), or at the slots tensor `where`."""
        ctx = self.hidden_norm(self.fc(taps))
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.kv(ctx, self.rope, positions)
            if isinstance(where, Tensor):
                self.k_cache[i].index_copy_(1, where, k)
                self.v_cache[i].index_copy_(1, where, v)
            else:
                self.k_cache[i, :, where : where + k.shape[1]] = k
                self.v_cache[i, :, where : where + k.shape[1]] = v

    @torch.no_grad()
    def block_logits(self, pending: Tensor, pos: int) -> Tensor:
        """`[block_size - 1, V]` float32 target-vocabulary logits for the masked slots after `pending`."""
        self.catch_up()
        if self.kv_len != pos:
            raise RuntimeError(f"dflash: drafter holds {self.kv_len} context positions, pending token sits at {pos}")
        b = self.block_size
        block = torch.cat([pending.reshape(1), self._masks])
        positions = self._cols[pos : pos + b]
        if not self.fixed_shapes:
            return self._block(block, positions, pos, None)
        mask = (self._cols < pos + b).expand(b, -1)
        return self.run_fixed("block", self._block, block, positions, positions, mask)

    def _block(self, block: Tensor, positions: Tensor, start: int | Tensor, mask: Tensor | None) -> Tensor:
        x = self.target.embed(block)
        for i, layer in enumerate(self.layers):
            x = layer(x, self.rope, positions, self.k_cache[i], self.v_cache[i], start, mask)
        return self.target.lm_head(self.norm(x[1:])).float()

    def propose(self, pending: Tensor, pos: int) -> Proposal:
        return Proposal(tokens=self.block_logits(pending, pos).argmax(-1))
