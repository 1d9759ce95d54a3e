"""EAGLE-3: one Llama-style decoder layer over [embedding of the next token; fused target features].

Checkpoint contract (SpecForge / EAGLE; docs/design.md, "EAGLE-3"): flat keys
`fc.weight`, `midlayer.*` (alias `layers.0.*`), `norm.weight`, `lm_head.weight` over a reduced draft
vocabulary, and int64 `d2t` offsets (target id = draft id + d2t[draft id]). The token embedding is
the target's unless the checkpoint carries `embed_tokens.weight`. Optional flags: `fc_norm`
(per-tap RMSNorm before `fc`), `norm_before_fc` (one RMSNorm over the concatenated taps, key
`input_norm`), `norm_before_residual` (residual from the normalised feature), `norm_output`.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from whiflash.drafters.base import Drafter, Proposal
from whiflash.runtime import gemv
from whiflash.runtime.cache import KVCache, Rows
from whiflash.runtime.config import rope_from_config
from whiflash.runtime.graphs import Prefix, without_grad
from whiflash.runtime.layers import Attention, RMSNorm, Rotary, SwiGLU


def default_layer_ids(target_layers: int) -> list[int]:
    """SpecForge's tap layers when a checkpoint names none: `[1, L//2 - 1, L - 4]` (output-of-layer ids)."""
    return [1, target_layers // 2 - 1, target_layers - 4]


def normalise_config(cfg: dict[str, Any], target_layers: int) -> dict[str, Any]:
    """Flatten the speculators layout and resolve defaults, so the module sees one schema."""
    cfg = dict(cfg)
    nested = cfg.pop("transformer_layer_config", None)
    hf_index_ids = cfg.get("eagle_aux_hidden_state_layer_ids")  # speculators: HF hidden_states indices
    if isinstance(nested, dict):
        cfg = {**nested, **{k: v for k, v in cfg.items() if v is not None}}
    eagle = cfg.get("eagle_config") or {}
    if eagle.get("eagle_aux_hidden_state_layer_ids"):
        taps = list(eagle["eagle_aux_hidden_state_layer_ids"])  # SpecForge: "output of layer i"
    elif nested is not None and hf_index_ids:
        taps = [i - 1 for i in hf_index_ids]
    else:
        taps = default_layer_ids(target_layers)
    cfg["tap_layers"] = taps
    cfg.setdefault("draft_vocab_size", cfg.get("vocab_size"))
    if cfg.get("target_hidden_size") is None:
        cfg["target_hidden_size"] = cfg["hidden_size"]
    cfg["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    cfg["num_key_value_heads"] = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    return cfg


class MidLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        h, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.hidden_norm = RMSNorm(h, eps)
        self.input_layernorm = RMSNorm(h, eps)
        # input [norm(embed); norm(feature)], 2H wide; no Q/K norms
        self.self_attn = Attention(2 * h, h, cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
                                   bool(cfg.get("attention_bias", False)))
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.mlp = SwiGLU(h, cfg["intermediate_size"], bool(cfg.get("mlp_bias", False)))


class Eagle3Drafter(Drafter):
    """EAGLE-3 chain drafting of `num_steps` tokens per round (greedy, one-hot proposals)."""

    kind = "eagle3"

    def __init__(self, cfg: dict[str, Any], num_steps: int = 6, own_embedding: bool = False) -> None:
        super().__init__()
        if num_steps < 1:
            raise ValueError(f"eagle3: num_steps must be >= 1, got {num_steps}")
        self.cfg, self.num_steps = cfg, num_steps
        h, t = cfg["hidden_size"], cfg["target_hidden_size"]
        eps = cfg.get("rms_norm_eps", 1e-6)
        self.tap_layers = tuple(cfg["tap_layers"])
        n_taps = len(self.tap_layers)
        if cfg.get("norm_before_fc"):
            self.input_norm = RMSNorm(n_taps * t, eps)
        if cfg.get("fc_norm"):
            self.fc_norm = nn.ModuleList(RMSNorm(t, eps) for _ in range(n_taps))
        self.fc = nn.Linear(n_taps * t, h, bias=False)
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(h, eps)
        self.lm_head = nn.Linear(h, cfg["draft_vocab_size"], bias=False)
        self.register_buffer("d2t", torch.zeros(cfg["draft_vocab_size"], dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg["vocab_size"], dtype=torch.bool))
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], h) if own_embedding else None
        self.full_prefill = False  # True: run the whole layer on every backlog row (reference for KV-only)
        theta, scaling = rope_from_config(cfg)
        self.rope = Rotary(cfg["head_dim"], theta, scaling)
        self.cache = KVCache()  # one layer

    @property
    def draft_length(self) -> int:
        return self.num_steps

    @property
    def catch_up_rows(self) -> int:
        return self.num_steps + 1

    def _setup_cache(self, max_len: int) -> None:
        a = self.midlayer.self_attn
        w = self.fc.weight
        slots = max_len + 4 * self.catch_up_rows  # room for a padded fixed-shape catch-up pass at the end
        # grow only: a shorter sequence reuses the cache, and so the graphs captured against it
        if self.cache.ensure(1, a.nkv, slots, a.hd, w.device, w.dtype, grow_only=True):
            self._cols = torch.arange(self.cache.slots, device=w.device)
            self.drop_graphs()  # captured graphs point at the old cache
        self.rope.ensure(self.cache.slots + 1, w.device, w.dtype)

    def embed(self, ids: Tensor) -> Tensor:
        return self.embed_tokens(ids) if self.embed_tokens is not None else self.target.embed(ids)

    def fuse(self, taps: Tensor) -> Tensor:
        """`[n, k*T]` concatenated target taps to the `[n, H]` feature stream."""
        if self.cfg.get("norm_before_fc"):
            taps = self.input_norm(taps)
        if self.cfg.get("fc_norm"):
            chunks = taps.chunk(len(self.fc_norm), dim=-1)
            taps = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], dim=-1)
        return gemv.linear(taps, self.fc, table=self.kernels.gemv)

    def _rows(self, feature: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Attention input `[n, 2H]` and residual `[n, H]` of rows (feature, next token)."""
        layer = self.midlayer
        normed = layer.hidden_norm(feature)
        x = torch.cat([layer.input_layernorm(self.embed(tokens)), normed], dim=-1)
        return x, normed if self.cfg.get("norm_before_residual") else feature

    def _write(self, x: Tensor, positions: Tensor, rows: Rows) -> None:
        """Cache the K/V of rows `x` at `rows`."""
        self.cache.write(0, *self.midlayer.self_attn.kv(x, self.rope, positions), rows)

    def _finish(self, x: Tensor, residual: Tensor, positions: Tensor, end: int | None, mask: Tensor | None = None
                ) -> tuple[Tensor, Tensor]:
        """Attention output, MLP and head for rows `x` whose K/V are cached: keys are slots `< end`
        (eager), or the whole cache under `mask` (static shapes, `end=None`)."""
        keys = self.cache.k[0] if end is None else self.cache.k[0, :, :end]
        values = self.cache.v[0] if end is None else self.cache.v[0, :, :end]
        fixed_shape = mask is not None  # static passes bring their mask; eager ones see a new key length
        if mask is None and x.shape[0] > 1:  # the rows are the last keys: a causal block after a visible prefix
            mask = torch.ones(x.shape[0], keys.shape[1], dtype=torch.bool, device=x.device).tril_(keys.shape[1] - x.shape[0])
        return self._layer(x, residual, positions, keys, values, mask, fixed_shape)

    def _layer(self, x: Tensor, residual: Tensor, positions: Tensor, keys: Tensor, values: Tensor,
               mask: Tensor | None, fixed_shape: bool) -> tuple[Tensor, Tensor]:
        """Rows `x` through attention over `keys, values` (under `mask`), MLP and head: (pre-norm output, logits)."""
        layer = self.midlayer
        h = layer.self_attn.attend(x, self.rope, positions, keys, values, mask, fixed_shape, residual=residual)
        h = layer.mlp(layer.post_attention_layernorm(h), residual=h)
        logits = self.lm_head(self.norm(h) if self.cfg.get("norm_output", True) else h)
        return h, logits

    @without_grad
    def taus(self, taps: Tensor, ids: Tensor, starts: Tensor, tree_budget: int | None = None) -> Tensor:
        """`[R]` tau of the chain this drafter proposes at each pending position of `starts [R]`, teacher-forced,
        in one pass per step over the rounds whose drafts all hit so far (`Drafter.taus`).

        A round at pending position `n` sees the rows `t < n` (the feature at `t` with the token at `t + 1`, as
        after its catch-up); step `i` then writes position `n + i - 1` and sees those rows and its own earlier
        steps: every round shares the committed keys, a step's keys are its own round's.
        """
        if tree_budget is not None:
            raise ValueError(f"eagle3: drafts chains; got tree_budget={tree_budget}")
        length, dev = int(starts.max()), ids.device  # rows 0 .. n-1 of the latest start
        x, residual = self._rows(self.fuse(taps[:length]), ids[1 : length + 1])
        attn = self.midlayer.self_attn
        cols = torch.arange(length, device=dev)
        keys, values = attn.kv(x, self.rope, cols)
        last = starts - 1
        h, logits = self._layer(x[last], residual[last], last, keys, values, cols[None, :] < starts[:, None], False)
        tau = torch.ones_like(starts)
        alive = torch.arange(len(starts), device=dev)  # rounds whose drafts all hit so far
        own_k = own_v = None  # [kv heads, alive, steps, head dim]: each alive round's step keys
        for i in range(1, self.num_steps + 1):
            n = starts[alive]
            hit = self._to_target(logits.argmax(-1)) == ids[n + i]  # draft i-1 predicts position n + i
            alive, n, h = alive[hit], n[hit], h[hit]
            tau[alive] += 1
            if i == self.num_steps or alive.numel() == 0:
                break
            # up to its first miss the chain is the sequence: its next step reads the sequence's token
            positions = n + i - 1
            x, residual = self._rows(h, ids[n + i])
            k, v = attn.kv(x, self.rope, positions)
            own_k = k[:, :, None] if own_k is None else torch.cat([own_k[:, hit], k[:, :, None]], 2)
            own_v = v[:, :, None] if own_v is None else torch.cat([own_v[:, hit], v[:, :, None]], 2)
            a = alive.numel()
            mask = torch.cat([cols[None, :] < n[:, None], torch.eye(a, dtype=torch.bool, device=dev).repeat_interleave(i, 1)], 1)
            h, logits = self._layer(x, residual, positions, torch.cat([keys, own_k.flatten(1, 2)], 1),
                                    torch.cat([values, own_v.flatten(1, 2)], 1), mask, False)
        return tau

    def _to_target(self, draft_ids: Tensor) -> Tensor:
        return draft_ids + self.d2t[draft_ids]

    @without_grad
    def catch_up(self) -> tuple[Tensor, Tensor] | None:
        """KV-only prefill of the backlog: K/V for every row, the full layer only for the last.

        Returns the last row's pre-norm output and logits (they start the next draft). Fixed
        shapes: `catch_up_passes`, K/V only but for the last, which is padded (`Prefix`) and also
        runs its last row through the layer and head; padded rows write slots past the context that
        drafting overwrites before reading them.
        """
        commit = self.take_backlog()
        if commit is None:
            return None
        taps, tokens, start = self.select_taps(commit), commit.next_tokens, commit.start
        n = taps.shape[0]
        end = start + n
        seq = self._seq
        seq.kv_len = end
        if self.fixed_shapes and not self.full_prefill:
            c, passes = self.catch_up_passes(n)
            for s in passes:
                slots = self._cols[start + s : start + s + c]
                if s + c < n:  # not the last pass: only its K/V are read later, so no attention, MLP or head
                    self.run_fixed(f"context{c}", self._context, taps[s : s + c], tokens[s : s + c], slots,
                                   compile=True)
                    continue
                m = n - s  # rows of the last pass; the rest of its `c` is padding
                seq.last = self.run_fixed(f"catch_up{c}", self._catch_up, Prefix(taps[s : s + c], c),
                                          Prefix(tokens[s : s + c], c), slots, self._cols[m - 1 : m], compile=True)
            return seq.last
        positions = self._cols[start:end]
        x, residual = self._rows(self.fuse(taps), tokens)
        self._write(x, positions, Rows(start))
        if self.full_prefill:
            h, logits = self._finish(x, residual, positions, end)
            seq.last = h[-1:], logits[-1:]
        else:
            seq.last = self._finish(x[-1:], residual[-1:], positions[-1:], end)
        return seq.last

    def _context(self, taps: Tensor, tokens: Tensor, slots: Tensor) -> tuple[Tensor, Tensor]:
        """Fixed-shape K/V-only pass: the rows' K/V at `slots` (a long backlog's passes before the last);
        returns the rows' attention input and residual."""
        x, residual = self._rows(self.fuse(taps), tokens)
        self._write(x, slots, Rows(slots=slots))
        return x, residual

    def _catch_up(self, taps: Tensor, tokens: Tensor, slots: Tensor, last: Tensor) -> tuple[Tensor, Tensor]:
        """Fixed-shape catch-up pass: K/V of every row at `slots`, then row `last` ([1] index) through
        attention (keys up to its slot: the mask is made inside the pass, no launches before it), MLP and head."""
        x, residual = self._context(taps, tokens, slots)
        return self._finish(x[last], residual[last], slots[last], None, (self._cols <= slots[last])[None])

    def _step(self, h: Tensor, token: Tensor, positions: Tensor, slots: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """One static-shape drafting step: (feature, token) at `slots` -> (pre-norm output, next target id)."""
        x, residual = self._rows(h, token)
        self._write(x, positions, Rows(slots=slots))
        h, logits = self._finish(x, residual, positions, None, mask)
        return h, self._to_target(logits[-1].argmax(-1, keepdim=True))

    @without_grad
    def propose(self, pending: Tensor, pos: int, slot: int = 0) -> Proposal:
        seq = self._seq
        if seq.backlog:  # a routed drafter caught its member up already: skip the call for nothing
            self.catch_up()
        if seq.kv_len != pos:
            raise RuntimeError(f"eagle3: drafter holds {seq.kv_len} positions, pending token sits at {pos}")
        h, logits = seq.last
        if self.fixed_shapes and self.num_steps > 1:  # every step in one pass: one graph replay per round
            return Proposal(tokens=self.run_fixed("steps", self._steps, h, logits, self._cols[pos : pos + 1],
                                                  compile=True))
        tokens = [self._to_target(logits[-1].argmax(-1, keepdim=True))]
        for step in range(1, self.num_steps):
            p = pos + step - 1  # speculative slots: overwritten by the next catch-up
            positions = self._cols[p : p + 1]
            x, residual = self._rows(h, tokens[-1])
            self._write(x, positions, Rows(p))
            h, logits = self._finish(x, residual, positions, p + 1)
            tokens.append(self._to_target(logits[-1].argmax(-1, keepdim=True)))
        return Proposal(tokens=torch.cat(tokens))

    def _steps(self, h: Tensor, logits: Tensor, first: Tensor) -> Tensor:
        """The whole draft at fixed shapes from the catch-up's (feature, logits) for slot `first` ([1], on the
        device): its token (picked inside the pass, no launches before it), then steps 1..num_steps-1, step i
        writing slot `first + i - 1` and seeing the slots up to it."""
        token = self._to_target(logits[-1].argmax(-1, keepdim=True))
        tokens = [token]
        for i in range(self.num_steps - 1):
            p = first + i
            h, token = self._step(h, token, p, p, (self._cols <= p)[None])
            tokens.append(token)
        return torch.cat(tokens)
