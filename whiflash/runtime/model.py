"""Our own forward for Qwen3- and Llama-family targets, over a static KV cache.

One method, `forward`, serves every shape the speculative loop needs: prefill, a one-token
decode step, chain verify and tree verify (ancestor mask + depth positions). New K/V are written
at cache slots `[start, start + T)`; `compact` then keeps an accepted tree path. The same pass can
return the output of any set of "tap" layers and the final post-norm hidden state, which is what
drafters and routers read.

Tap `i` is transformers' `hidden_states[i + 1]` (`TAP_CONVENTION`): the residual stream after
layer `i`, except for the last layer, whose entry transformers returns after the final norm. The
upstream drafters' feature extraction reads exactly those tensors, so a drafter trained by them
drafts the same here, the last-layer tap included.

State-dict names mirror transformers' (`model.layers.0.self_attn.q_proj.weight`, ...) so HF safetensors
load strictly, key for key; inside, Q/K/V and gate/up are stacked into one Linear each (`layers.stacked`).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor, nn

from whiflash.runtime.cache import KVCache, Rows
from whiflash.runtime.config import ModelConfig
from whiflash.runtime.graphs import FixedShapePasses, without_grad
from whiflash.runtime.options import EngineOptions
from whiflash.runtime.layers import DecoderLayer, RMSNorm, Rotary
from whiflash.runtime.weights import load_strict, read_state_dict, resolve_checkpoint

log = logging.getLogger(__name__)

HEAD_LAYERS = 3
"""Layers of a fixed-shape target pass captured as a graph of their own, launched before the rest
(`Target._fixed`): at Qwen3-8B shapes three layers are ~0.4 ms of GPU work, longer than launching the rest."""

TAP_CONVENTION = "hf-hidden_states[i+1], last layer post-norm"
"""What a tap means; part of the testbed's drafter-stage fingerprints, so builds made under
another meaning are retrained."""


class RowPolicy(Protocol):
    """A routing policy that decides for many rows at once (`whiflash.routers`): what a verify pass can capture."""

    rows_key: Hashable
    """Everything its decisions depend on besides the rows (the policy itself, its threshold)."""

    def rows(self, hidden: Tensor, logits: Tensor) -> Tensor:
        """`[T]` long slot for every row of `hidden` `[T, H]` and `logits` `[T, V]`."""
        ...


@dataclass
class TargetOutput:
    """What one target pass returns, one row per input token."""

    logits: Tensor | None
    """`[T, V]` (or `[1, V]` when only the last row was asked for), float32."""
    hidden: Tensor
    """`[T, H]` final post-norm hidden state (the LM head's input; the router's feature)."""
    feats: Tensor | None
    """`[T, len(taps), H]` each tap layer's output (`hidden_states[i + 1]`), in the order asked for."""
    routes: Tensor | None = None
    """`[T]` a routing policy's slot for every row (`forward(..., route=)`), or None."""


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                         cfg.head_dim, cfg.rms_norm_eps, cfg.attention_bias, cfg.qk_norm, cfg.mlp_bias)
            for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Target(nn.Module, FixedShapePasses):
    """A causal LM with a static KV cache (batch 1). Call `setup_cache(max_len)` before `forward`.

    `static = True` or `use_cuda_graphs(True)` runs every pass but the prefill at fixed shapes
    (decode step, chain and tree verify; one graph per (tokens, taps, logits) shape). The target owns
    the run's `EngineOptions` (`set_engine`; from the environment's defaults until then), and its
    drafters take them when they attach (`Drafter.reset`)."""

    def __init__(self, cfg: ModelConfig, name: str = "") -> None:
        super().__init__()
        self.config, self.name = cfg, name
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rope = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.cache = KVCache()
        self.max_len = 0
        self._cols = torch.empty(0, dtype=torch.long)  # slot indices 0..max_len-1, for fixed-shape passes
        self.static, self.graphs = False, None
        self.set_engine(EngineOptions.from_environment())

    @property
    def graph_device(self) -> torch.device:
        return self.device

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def setup_cache(self, max_len: int) -> None:
        """Allocate K/V for `max_len` slots once; a later call only reallocates when it must grow."""
        cfg = self.config
        if not self.cache.ensure(cfg.num_hidden_layers, cfg.num_key_value_heads, max_len, cfg.head_dim, self.device,
                                 self.dtype, grow_only=True):
            return
        self.rope.ensure(max_len + 1, self.device, self.dtype)
        self.max_len = max_len
        self._cols = torch.arange(max_len, device=self.device)
        self.drop_graphs()  # captured graphs point at the old cache

    def embed(self, ids: Tensor) -> Tensor:
        return self.model.embed_tokens(ids)

    @without_grad
    def forward(
        self,
        ids: Tensor,
        start: int,
        positions: Tensor | None = None,
        tree_mask: Tensor | None = None,
        taps: tuple[int, ...] = (),
        logits: str = "all",
        route: RowPolicy | None = None,
    ) -> TargetOutput:
        """Run `ids [T]` whose K/V go to slots `[start, start+T)`.

        `positions` default to the slots themselves (chains); trees pass depth positions and a
        `[T, T]` boolean `tree_mask` (True where a node may see another: its ancestors and itself).
        `logits` is "all", "last" or "none". `route` (with `logits="all"`): a routing policy whose
        `rows(hidden, logits)` decides for every row inside the pass (`TargetOutput.routes`), so a
        fixed-shape pass captures the decision with the layers.
        """
        t = ids.shape[0]
        end = start + t
        if end > self.max_len:
            raise ValueError(f"target cache holds {self.max_len} slots; a pass up to slot {end} does not fit")
        layers = len(self.model.layers)  # once, not per tap: two submodule look-ups and a call, every pass
        bad = [layer for layer in taps if not 0 <= layer < layers]
        if bad:
            raise ValueError(f"tap layers {bad} are outside the target's {layers} layers")
        if route is not None and logits != "all":
            raise ValueError(f"route= decides for every row and needs logits='all', got logits={logits!r}")
        if not self.fixed_shapes or logits == "last":  # prefill: eager, exact shapes
            if positions is None:
                positions = torch.arange(start, end, device=ids.device)
            return self._run(ids, positions, Rows(start), self._mask(t, start, tree_mask, ids.device), taps, logits,
                             route)
        # fixed shapes: slots, positions and mask are made inside the pass from the first slot (a device
        # slice), so a round's host work is the graphs' input copies and their replays
        first = self._cols[start : start + 1]
        if tree_mask is None and positions is None:
            def chain(first: Tensor) -> tuple[Tensor, Tensor, Tensor]:
                slots = first + self._cols[:t]
                return slots, slots, self._cols[None, :] <= slots[:, None]  # the committed prefix, a causal block

            return self._fixed((t, taps, logits, "chain"), chain, taps, logits, route, ids, first)

        def tree(first: Tensor, positions: Tensor, tree_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            slots = first + self._cols[:t]
            rel = self._cols - first  # column offset into the block
            inside = (rel >= 0) & (rel < t)
            block = tree_mask.gather(1, rel.clamp(0, t - 1).expand(t, -1)) & inside  # the tree's ancestors
            return positions, slots, (rel < 0)[None, :] | block

        if tree_mask is None:
            tree_mask = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril_()
        if positions is None:
            positions = torch.arange(start, end, device=ids.device)
        return self._fixed((t, taps, logits, "tree"), tree, taps, logits, route, ids, first, positions, tree_mask)

    @without_grad
    def full_pass(self, ids: Tensor, taps: tuple[int, ...] = ()) -> TargetOutput:
        """One eager causal pass over the whole sequence `ids [T]` from slot 0, every row's logits, whatever the
        engine's fixed shapes (a length seen once is not worth a graph); it overwrites the cache's first T slots."""
        t = ids.shape[0]
        if t > self.max_len:
            raise ValueError(f"target cache holds {self.max_len} slots; a pass of {t} tokens does not fit")
        return self._run(ids, self._cols[:t], Rows(0), self._mask(t, 0, None, ids.device), taps, "all")

    def _fixed(self, key: tuple, where: Callable[..., tuple[Tensor, Tensor, Tensor]], taps: tuple[int, ...],
               logits: str, route: RowPolicy | None, ids: Tensor, *inputs: Tensor) -> TargetOutput:
        """A fixed-shape pass as two graphs, its first `HEAD_LAYERS` layers and the rest: CUDA starts a
        graph's first kernel only once the whole graph is launched (~0.6 us of host time a kernel, 0.26 ms
        for a compiled Qwen3-8B step), so the GPU runs the short head while the host launches the tail.
        `where(*inputs)` gives the rows' positions, slots and mask; the tail reads the head's outputs in
        place (no input copies); a `route` policy decides inside the tail, which is keyed by it."""
        n = len(self.model.layers)
        split = min(HEAD_LAYERS, n - 1)
        head_taps = [i for i in taps if i < split]

        def head(ids: Tensor, *inputs: Tensor) -> tuple[Tensor, ...]:
            positions, slots, mask = where(*inputs)
            x = self.embed(ids)
            angles = self.rope.angles(positions, x.dtype)
            x, captured = self._layers(x, angles, Rows(slots=slots), mask, 0, split, taps)
            return x, angles, slots, mask, *(captured[i] for i in head_taps)

        def tail(x: Tensor, angles: Tensor, slots: Tensor, mask: Tensor, *head_feats: Tensor) -> TargetOutput:
            x, captured = self._layers(x, angles, Rows(slots=slots), mask, split, n, taps)
            return self._output(x, {**dict(zip(head_taps, head_feats)), **captured}, taps, logits, route)

        parts = self.run_fixed(key + ("head",), head, ids, *inputs)
        tail_key = key + (route.rows_key if route is not None else None, "tail")
        return self.run_fixed(tail_key, tail, *parts, alias_inputs=True)

    def _run(self, ids: Tensor, positions: Tensor, rows: Rows, mask: Tensor | None,
             taps: tuple[int, ...], logits: str, route: RowPolicy | None = None) -> TargetOutput:
        x = self.embed(ids)
        angles = self.rope.angles(positions, x.dtype)
        x, captured = self._layers(x, angles, rows, mask, 0, len(self.model.layers), taps)
        return self._output(x, captured, taps, logits, route)

    def _layers(self, x: Tensor, angles: Tensor, rows: Rows, mask: Tensor | None, lo: int, hi: int,
                taps: tuple[int, ...]) -> tuple[Tensor, dict[int, Tensor]]:
        """Layers `lo..hi-1` over rows `x`; returns their output and the outputs of the tap layers among them."""
        captured: dict[int, Tensor] = {}
        for i in range(lo, hi):
            x = self.model.layers[i](x, angles, self.cache, i, rows, mask)
            if i in taps:
                captured[i] = x
        return x, captured

    def _output(self, x: Tensor, captured: dict[int, Tensor], taps: tuple[int, ...], logits: str,
                route: RowPolicy | None = None) -> TargetOutput:
        """Final norm, the stacked taps, the logits asked for and `route`'s decisions, from the last layer's
        output `x`."""
        hidden = self.model.norm(x)
        if len(self.model.layers) - 1 in taps:  # transformers' last hidden state is post-norm
            captured[len(self.model.layers) - 1] = hidden
        stacked = torch.stack([captured[layer] for layer in taps], dim=1) if taps else None
        out_logits = None
        if logits == "all":
            out_logits = self.lm_head(hidden).float()
        elif logits == "last":
            out_logits = self.lm_head(hidden[-1:]).float()
        routes = route.rows(hidden, out_logits) if route is not None else None
        return TargetOutput(out_logits, hidden, stacked, routes)

    @staticmethod
    def _mask(t: int, start: int, tree_mask: Tensor | None, device: torch.device) -> Tensor | None:
        if t == 1 and tree_mask is None:
            return None  # one query sees the whole prefix
        block = tree_mask if tree_mask is not None else torch.ones(t, t, dtype=torch.bool, device=device).tril_()
        prefix = torch.ones(t, start, dtype=torch.bool, device=device)
        return torch.cat([prefix, block], dim=1)

    def compact(self, start: int, keep: Tensor) -> None:
        """Move the K/V of slots `start + keep` to `[start, start + len(keep))` (an accepted tree path).

        RoPE baked into K stays valid: accepted nodes sit at depth positions start, start+1, ...
        """
        self.cache.compact(start, keep)


def load_target(
    name_or_path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> Target:
    """Load a Qwen3/Llama-family causal LM from a Hub repo id or a local folder (safetensors only, strict)."""
    folder = resolve_checkpoint(name_or_path, "target")
    cfg = ModelConfig.from_json(folder / "config.json")
    with torch.device("meta"):
        model = Target(cfg, name=str(name_or_path))
    model = model.to(dtype=dtype).to_empty(device=device)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    allow = ("lm_head.weight",) if cfg.tie_word_embeddings else ()
    load_strict(model, read_state_dict(folder), str(folder), allow_missing=allow)
    model.eval()
    log.info("loaded target %s (%s, %d layers, hidden %d) on %s/%s", name_or_path, cfg.model_type,
             cfg.num_hidden_layers, cfg.hidden_size, device, dtype)
    return model
