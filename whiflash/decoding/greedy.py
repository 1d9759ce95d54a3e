"""Greedy continuations of many prompts at once with the batch-1 target (`whiflash-datagen --parallel`).

The runtime's passes hold one sequence. A batch of prompts packs into one cache of its own instead:
prompt `b` owns the slots `[lo_b, lo_b + len_b + n)`, a pass's rows carry their own positions and slots,
and a mask shows each row only the earlier slots of its own segment. So a batch is one prefill pass
over every prompt, then one pass a token for all of them, replayed as a CUDA graph when the target
replays graphs: `n` small passes for the batch where decoding each prompt costs its own rounds and
their host syncs. The target's cache and captured graphs are not touched.

In float32 the tokens are each prompt's own greedy decode; in bf16 a near-tie may break the other way
(the packed passes' shapes are not a single decode's).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from whiflash.runtime.cache import write_slots
from whiflash.runtime.graphs import Graphed
from whiflash.runtime.layers import attention
from whiflash.runtime.model import Target

log = logging.getLogger(__name__)


def _pass(target: Target, keys: Tensor, values: Tensor, ids: Tensor, positions: Tensor, slots: Tensor,
          segment: Tensor, fixed_shape: bool) -> Tensor:
    """Final hidden states `[T, H]` of rows `ids [T]` at `positions`, whose K/V go to `slots` of the packed cache
    `keys, values [layers, kv_heads, S, head_dim]`; a row sees the slots from its segment's first (`segment`)
    up to its own."""
    x = target.embed(ids)
    angles = target.rope.angles(positions, x.dtype)
    cols = torch.arange(keys.shape[2], device=ids.device)
    mask = (cols[None, :] >= segment[:, None]) & (cols[None, :] <= slots[:, None])
    for i, layer in enumerate(target.model.layers):
        q, k, v = layer.pre(x, angles)
        write_slots(keys[i], values[i], k, v, slots)
        x = layer.post(x, attention(q, keys[i], values[i], mask, fixed_shape, layer.kernels.attention))
    return target.model.norm(x)


@torch.no_grad()
def greedy_batch(target: Target, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
    """The first `max_new_tokens` greedy tokens after each of `prompts` (no stop token ends one), in one batch."""
    if not prompts or max_new_tokens < 1:
        return [[] for _ in prompts]
    dev, cfg = target.device, target.config
    lengths = torch.tensor([len(p) for p in prompts], device=dev)
    if int(lengths.min()) < 1:
        raise ValueError("greedy_batch: every prompt needs at least one token")
    room = lengths + max_new_tokens
    first = torch.cumsum(room, 0) - room  # each segment's first slot
    shape = (cfg.num_hidden_layers, cfg.num_key_value_heads, int(room.sum()), cfg.head_dim)
    keys = torch.zeros(shape, device=dev, dtype=target.dtype)
    values = torch.zeros_like(keys)
    target.rope.ensure(int(room.max()) + 1, dev, target.dtype)

    owner = torch.repeat_interleave(torch.arange(len(prompts), device=dev), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    positions = torch.arange(len(owner), device=dev) - starts[owner]
    ids = torch.tensor([t for p in prompts for t in p], dtype=torch.long, device=dev)
    hidden = _pass(target, keys, values, ids, positions, first[owner] + positions, first[owner], False)
    token = target.lm_head(hidden[starts + lengths - 1]).argmax(-1)

    def step(token: Tensor, i: Tensor) -> Tensor:  # token `i` of every prompt in, token `i + 1` out
        at = lengths + i
        return target.lm_head(_pass(target, keys, values, token, at, first + at, first, True)).argmax(-1)

    out = torch.empty(len(prompts), max_new_tokens, dtype=torch.long, device=dev)
    out[:, 0] = token
    steps = torch.arange(max_new_tokens, device=dev)[:, None]
    run: Callable[[Tensor, Tensor], Tensor] = step
    if max_new_tokens > 1 and target.graphs is not None and dev.type == "cuda":
        try:  # its warm-up runs step 0 itself: the same writes as the replay
            run = Graphed(step, token, steps[0])
        except RuntimeError as err:  # an op the graph cannot hold: this batch decodes eagerly
            log.warning("greedy batch: CUDA graph capture failed (%s); decoding eagerly", err)
    for i in range(max_new_tokens - 1):
        out[:, i + 1] = run(out[:, i], steps[i])
    return out.tolist()
