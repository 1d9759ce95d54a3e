"""DFlash: a block-diffusion drafter that fills `[pending, MASK x (b-1)]` in one forward.

Checkpoint contract (z-lab; docs/design.md, "DFlash"): a Qwen3 config with top-level
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

from whiflash.drafters.base import Drafter, Proposal
from whiflash.drafters.trees import deepest_on_path, tree_proposal
from whiflash.runtime import gemv
from whiflash.runtime.cache import KVCache, Rows
from whiflash.runtime.config import rope_from_config
from whiflash.runtime.graphs import Prefix, without_grad
from whiflash.runtime.layers import DecoderLayer, RMSNorm, Rotary, attention


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


def chain_tau(logits: Tensor, truth: Tensor) -> Tensor:
    """`[R]` tau of argmax chains `logits [R, d, V]` against the tokens they should draft, `truth [R, d]`: 1 + the
    length of each chain's leading run of matches (the bonus token counted)."""
    return 1 + (logits.argmax(-1) == truth).long().cumprod(1).sum(1)


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
        # Qwen3 layers with Q/K norms; the block's keys are [cached context K/V | block K/V], and the
        # block attends non-causally within itself (no mask in eager passes)
        self.layers = nn.ModuleList(
            DecoderLayer(h, cfg["intermediate_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
                         cfg["head_dim"], eps, bool(cfg.get("attention_bias", False)), True,
                         bool(cfg.get("mlp_bias", False)))
            for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(h, eps)
        theta, scaling = rope_from_config(cfg)
        self.rope = Rotary(cfg["head_dim"], theta, scaling)
        self.cache = KVCache()

    @property
    def draft_length(self) -> int:
        return self.block_size - 1

    def _setup_cache(self, max_len: int) -> None:
        a, w = self.layers[0].self_attn, self.fc.weight
        slots = max_len + 4 * self.catch_up_rows  # room for the block and a padded catch-up pass
        # grow only: a shorter sequence reuses the cache, and so the graphs captured against it
        if self.cache.ensure(len(self.layers), a.nkv, slots, a.hd, w.device, w.dtype, grow_only=True):
            # made only with the cache: the block pass's graph reads them in place, so a tensor made anew
            # per sequence would leave the graph reading freed memory
            self._cols = torch.arange(self.cache.slots, device=w.device)
            self._masks = torch.full((self.block_size - 1,), self.mask_token_id, dtype=torch.long, device=w.device)
            self.drop_graphs()  # captured graphs point at the old cache
        self.rope.ensure(self.cache.slots + 1, w.device, w.dtype)

    @property
    def catch_up_rows(self) -> int:
        return self.block_size

    @without_grad
    def catch_up(self) -> None:
        """Write the context K/V of every backlog position, for all layers.

        Eager: one pass over exactly the backlog. Fixed shapes: `catch_up_passes`, the last
        padded (`Prefix`); padded rows write slots past the context, which the next block pass
        overwrites before any query can see them.
        """
        commit = self.take_backlog()
        if commit is None:
            return
        taps = self.select_taps(commit)
        n, start = taps.shape[0], commit.start
        if not self.fixed_shapes:
            self._context(taps, self._cols[start : start + n], Rows(start))
        else:
            c, passes = self.catch_up_passes(n)
            for s in passes:
                slots = self._cols[start + s : start + s + c]
                self.run_fixed(f"context{c}", self._context_fixed, Prefix(taps[s : s + c], c), slots, compile=True)
        self._seq.kv_len = start + n

    def _context(self, taps: Tensor, positions: Tensor, rows: Rows) -> None:
        """K/V of context rows at `rows`."""
        for i, kv in enumerate(self._context_kv(taps, positions)):
            self.cache.write(i, *kv, rows)

    def _context_kv(self, taps: Tensor, positions: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each layer's K/V of context rows: `hidden_norm(fc(taps))` through its projections."""
        ctx = self.hidden_norm(gemv.linear(taps, self.fc, table=self.kernels.gemv))
        return [layer.self_attn.kv(ctx, self.rope, positions) for layer in self.layers]

    def _context_fixed(self, taps: Tensor, slots: Tensor) -> None:
        self._context(taps, slots, Rows(slots=slots))

    @without_grad
    def block_logits(self, pending: Tensor, pos: int) -> Tensor:
        """`[block_size - 1, V]` float32 target-vocabulary logits for the masked slots after `pending`."""
        seq = self._seq
        if seq.backlog:  # a routed drafter caught its member up already: skip the call for nothing
            self.catch_up()
        if seq.kv_len != pos:
            raise RuntimeError(f"dflash: drafter holds {seq.kv_len} context positions, pending token sits at {pos}")
        pending = pending if pending.dim() == 1 else pending.reshape(1)  # the loop's is [1]: no view a round
        if not self.fixed_shapes:
            block = torch.cat([pending, self._masks])
            return self._block(block, self._cols[pos : pos + self.block_size], Rows(pos), None)
        # the block, its positions and mask are made inside the pass from the pending token and the first
        # slot: two one-element inputs, no launches on the host before the replay
        return self.run_fixed("block", self._block_fixed, pending, self._cols[pos : pos + 1])

    def _block(self, block: Tensor, positions: Tensor, rows: Rows, mask: Tensor | None) -> Tensor:
        """The block's pass; its K/V go to scratch slots past the context, overwritten after the round."""
        x = self.target.embed(block)
        angles = self.rope.angles(positions, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, angles, self.cache, i, rows, mask)
        return self.target.lm_head(self.norm(x[1:])).float()

    def _block_fixed(self, pending: Tensor, first: Tensor) -> Tensor:
        b = self.block_size
        positions = first + self._cols[:b]
        mask = (self._cols < first + b).expand(b, -1)
        return self._block(torch.cat([pending, self._masks]), positions, Rows(slots=positions), mask)

    @without_grad
    def taus(self, taps: Tensor, ids: Tensor, starts: Tensor, tree_budget: int | None = None) -> Tensor:
        """`[R]` tau at each pending position of `starts [R]` of the block's argmax chain, or (`tree_budget`) of the
        DDTree of that many nodes over the same block (`Drafter.taus`), from `blocks_at`'s logits. A tree accepts
        its deepest node whose path is the sequence."""
        logits = self.blocks_at(taps, ids, starts)
        # [R, b-1]: the tokens each depth should draft
        truth = ids[starts[:, None] + torch.arange(1, self.block_size, device=ids.device)]
        if tree_budget is None:
            return chain_tau(logits, truth)
        if tree_budget <= logits.shape[-1]:  # every position's tree at once
            return 1 + deepest_on_path(logits, truth, tree_budget)
        taus, truth = [], truth.tolist()
        for i in range(len(starts)):  # a budget above the vocabulary: one padded tree a position (`build_tree_device`)
            tree = tree_proposal(logits[i].float(), tree_budget, self.engine.tree_kernel)
            tokens, parents, depths = (t.tolist() for t in (tree.tokens, tree.parents, tree.depths))
            on_path = [True]  # the root, then each node in order (a parent comes before its children)
            for token, parent, depth in zip(tokens, parents, depths):
                on_path.append(on_path[parent] and token == truth[i][depth - 1])
            taus.append(1 + max((d for d, ok in zip(depths, on_path[1:]) if ok), default=0))
        return torch.tensor(taus, device=ids.device)

    @without_grad
    def blocks_at(self, taps: Tensor, ids: Tensor, starts: Tensor) -> Tensor:
        """`[R, b-1, V]` the block's draft logits at each pending position of `starts [R]` (inputs as `taus`), in one
        pass: the block `[ids[n], MASK x (b-1)]` at positions `n .. n+b-1` sees the context rows `t < n` and its own
        block, as `block_logits` after a catch-up to `n`."""
        length, dev = int(starts.max()), ids.device
        cols = torch.arange(length, device=dev)
        context = self._context_kv(taps[:length], cols)
        r, b = starts.shape[0], self.block_size
        offsets = torch.arange(b, device=dev)
        block = torch.full((r, b), self.mask_token_id, dtype=torch.long, device=dev)
        block[:, 0] = ids[starts]
        x = self.target.embed(block.flatten())
        angles = self.rope.angles((starts[:, None] + offsets).flatten(), x.dtype)
        round_of = torch.arange(r, device=dev).repeat_interleave(b)
        mask = torch.cat([cols[None, :] < starts[round_of, None], round_of[:, None] == round_of[None, :]], 1)
        for (k0, v0), layer in zip(context, self.layers):
            q, k, v = layer.pre(x, angles)
            x = layer.post(x, attention(q, torch.cat([k0, k], 1), torch.cat([v0, v], 1), mask))
        return self.target.lm_head(self.norm(x.view(r, b, -1)[:, 1:]))

    def propose(self, pending: Tensor, pos: int, slot: int = 0) -> Proposal:
        return self.draft(pending, pos, None)

    def draft(self, pending: Tensor, pos: int, tree_budget: int | None = None) -> Proposal:
        """The block's argmax chain, or (`tree_budget`) the DDTree of that many nodes over the same pass."""
        logits = self.block_logits(pending, pos)
        if tree_budget is None:
            return Proposal(tokens=logits.argmax(-1))
        if not self.fixed_shapes:
            return tree_proposal(logits, tree_budget, self.engine.tree_kernel)
        # the builder is a few hundred small kernels at fixed shapes: one graph replay instead
        return self.run_fixed(("tree", tree_budget), lambda x: tree_proposal(x, tree_budget, self.engine.tree_kernel), logits)
