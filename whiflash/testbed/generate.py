"""Batched continuation of many prompts by a testbed target, with a static KV cache.

The testbed distils its drafters on millions of the target's own tokens and sharpens the target on
its own continuations, so generation runs many sequences per forward: prompts are left-padded into
one batch, every layer's keys and values go into a cache allocated once for the batch (no per-step
concatenation), and each step attends over the whole cache under a mask (one shape per batch). The forward is the
``transformers`` Qwen3 model's own modules (norms, projections, rotary table, MLP), applied row by
row exactly as ``model(input_ids, attention_mask, position_ids)`` would: the tests check the tokens
against that forward.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

__all__ = ["continue_prompts", "decode_batch"]

log = logging.getLogger(__name__)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class _StaticCache:
    """Per-layer ``[B, kv_heads, columns, head_dim]`` keys and values of one batch."""

    def __init__(self, layers: int, batch: int, heads: int, columns: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        shape = (batch, heads, columns, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only batch rows ``rows`` (new tensors, in that order)."""
        self.k = [k[rows] for k in self.k]
        self.v = [v[rows] for v in self.v]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, fold_heads: bool) -> torch.Tensor:
    """Attention of queries ``[B, H, T, D]`` over the cache's grouped K/V ``[B, KV, C, D]`` under ``visible``
    ``[B, T, C]``. ``fold_heads``: the ``H / KV`` query heads of each K/V head become query rows of one head
    (query head ``h`` reads K/V head ``h // (H / KV)``), so the kernel needs no grouped-head support; the
    same sums, in another layout."""
    if not fold_heads:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible[:, None], enable_gqa=True)
    b, h, t, d = q.shape
    g = h // k.shape[1]
    mask = visible[:, None].expand(b, g, t, visible.shape[-1]).reshape(b, 1, g * t, visible.shape[-1])
    out = F.scaled_dot_product_attention(q.reshape(b, k.shape[1], g * t, d), k, v, attn_mask=mask)
    return out.reshape(b, h, t, d)


def _forward(model, cache: _StaticCache, ids: torch.Tensor, cols: torch.Tensor, pad: torch.Tensor,
             fold_heads: bool = False, span: int | None = None) -> torch.Tensor:
    """Logits of the last column of ``ids`` ``[B, T]``, written at cache columns ``cols`` ``[T]``.

    Row ``b`` holds ``pad[b]`` padding columns before its prompt: its positions count from there and its
    queries see its own columns only (a padding query sees itself, so softmax has a key). The columns
    are a device tensor, not host integers, so a decode step has no host values and can be captured
    as a CUDA graph. ``fold_heads``: see ``_attend``. ``span``: attend over the cache's first ``span``
    columns only (all of them by default); it must cover ``cols``.
    """
    inner = model.model
    b, t = ids.shape
    positions = (cols[None, :] - pad[:, None]).clamp(min=0)  # [B, T]
    # A step attends over the first ``span`` columns (unwritten ones masked): a shape that changes every
    # ``SPAN_CHUNK`` steps only, so a step is one graph per span and backends that plan per shape plan rarely.
    span = span or cache.k[0].shape[2]
    keys = torch.arange(span, device=ids.device)
    visible = (keys[None, None, :] <= cols[None, :, None]) & (
        (keys[None, None, :] >= pad[:, None, None]) | (keys[None, None, :] == cols[None, :, None]))
    x = inner.embed_tokens(ids)
    cos, sin = inner.rotary_emb(x, positions)
    cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
    for i, layer in enumerate(inner.layers):
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        hd = attn.head_dim
        q = attn.q_norm(attn.q_proj(h).view(b, t, -1, hd)).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(h).view(b, t, -1, hd)).transpose(1, 2)
        v = attn.v_proj(h).view(b, t, -1, hd).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        cache.k[i].index_copy_(2, cols, k.to(cache.k[i].dtype))
        cache.v[i].index_copy_(2, cols, v.to(cache.v[i].dtype))
        out = _attend(q.to(cache.k[i].dtype), cache.k[i][:, :, :span], cache.v[i][:, :, :span], visible, fold_heads)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(b, t, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.lm_head(inner.norm(x[:, -1])).float()


def _capture(step: Callable[[], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """``step`` (reading and writing only static tensors) captured as a CUDA graph, and its output tensor.

    A few eager runs on a side stream first, as CUDA graph capture requires. Under autocast the
    capture runs with autocast's weight-cast cache off: a cast cached during capture would live in
    the graph's private memory.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    autocast = torch.is_autocast_enabled("cuda")
    dtype = torch.get_autocast_dtype("cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.autocast("cuda", dtype=dtype, enabled=autocast, cache_enabled=False), torch.cuda.graph(graph):
        out = step()
    return graph, out


DONE_CHECK_EVERY = 8
"""Decode steps between checks of how many rows still decode (each check waits for the device)."""

SHED_MIN_ROWS = 64
"""A batch sheds its ended rows only while it holds at least this many. A responses batch of 1,024 runs until its
longest row ends (256 steps) while its rows average ~110 tokens, so most of a step's rows decode for nothing; but
below a few dozen rows a step's time is the weights' reads and the launches, which fewer rows do not shorten,
and every shed costs a graph capture."""

SPAN_CHUNK = 64
"""A decode step attends over the cache's columns up to the next multiple of this past its own (0: over all of
them). At batch 1,024 the cache a step reads is ~19 GB on ``small`` and most of its time; a 256-token prompt's
batch reads 512 columns a step where it needs 384 on average. Each new span costs a graph capture (4 a batch)."""


@torch.no_grad()
def decode_batch(model, prompts: list[list[int]], max_new_tokens: int, *, eos: int, pad_id: int,
                 temperature: float = 0.0, generator: torch.Generator | None = None,
                 cuda_graphs: bool = True, fold_heads: bool = False) -> list[list[int]]:
    """Continuations of ``prompts`` (token-id lists, one batch): greedy, or sampled at ``temperature``.

    Each continuation is cut after its first ``eos`` (kept: drafters learn to predict it). Every
    ``DONE_CHECK_EVERY`` steps the batch stops if every row has ended, and sheds its ended rows (their
    cache rows too) once at most half of its rows still decode, while it holds ``SHED_MIN_ROWS`` or more:
    each row's tokens are its own greedy decode whatever rows share its batch (sampled rows draw from one
    generator, so their draws depend on the batch). A step attends over the columns written so far, rounded up
    to ``SPAN_CHUNK``. On CUDA with ``cuda_graphs`` the decode step is captured once per batch size and span,
    and replayed:
    eager, a step of a deep, narrow model is bound by kernel launches, not by the GPU. If capture
    fails the batch decodes eagerly (with a warning). ``fold_heads``: attention with the query heads of
    each K/V head folded into its query rows (``_attend``; `scripts/bench_generate.py --layouts folded` times it).
    """
    device = next(model.parameters()).device
    cfg = model.config
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], device=device)
    pad = torch.tensor([width - len(p) for p in prompts], device=device)
    kv_dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else \
        next(model.parameters()).dtype
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    cache = _StaticCache(cfg.num_hidden_layers, len(prompts), cfg.num_key_value_heads, width + max_new_tokens,
                         head_dim, kv_dtype, device)
    logits = _forward(model, cache, ids, torch.arange(width, device=device), pad, fold_heads)
    out_ids = torch.full((len(prompts), max_new_tokens), eos, dtype=torch.long, device=device)
    source = torch.arange(len(prompts), device=device)  # the prompt each row of the (shed) batch decodes
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    tok = torch.zeros(len(prompts), dtype=torch.long, device=device)  # the step's static input token and column
    col = torch.full((1,), width, dtype=torch.long, device=device)

    columns, span = width + max_new_tokens, 0

    def step() -> torch.Tensor:
        return _forward(model, cache, tok[:, None], col, pad, fold_heads, span)

    graph: torch.cuda.CUDAGraph | None = None
    for i in range(max_new_tokens):
        if temperature > 0:
            probs = (logits / temperature).softmax(-1)
            nxt = torch.multinomial(probs, 1, generator=generator)[:, 0]
        else:
            nxt = logits.argmax(-1)
        out_ids[source, i] = nxt
        done |= nxt == eos
        if i + 1 == max_new_tokens:
            break
        if (i + 1) % DONE_CHECK_EVERY == 0:
            live = int((~done).sum())
            if not live:
                break
            if 2 * live <= len(done) and len(done) >= SHED_MIN_ROWS:
                keep = (~done).nonzero()[:, 0]
                log.debug("batch decode: %d of %d rows still decode at step %d; shedding the rest", live,
                          len(done), i + 1)
                cache.keep(keep)
                source, done, tok, pad, nxt = source[keep], done[keep], tok[keep], pad[keep], nxt[keep]
                graph = out = None  # the step's shapes changed: capture again (and free the old graph's memory)
        tok.copy_(nxt)
        if i:
            col.add_(1)
        need = width + i + 1  # this step writes column width + i
        wanted = min(columns, -(-need // SPAN_CHUNK) * SPAN_CHUNK) if SPAN_CHUNK else columns
        if wanted != span:
            span, graph, out = wanted, None, None
        if graph is None and cuda_graphs and device.type == "cuda":
            try:
                graph, out = _capture(step)
            except RuntimeError as err:  # an op the graph cannot hold: this batch decodes eagerly
                log.warning("batch decode: CUDA graph capture failed (%s); decoding eagerly", err)
                cuda_graphs = False
        if graph is not None:
            graph.replay()
            logits = out.clone()  # the next replay overwrites ``out``
        else:
            logits = step()
    rows = out_ids.tolist()
    return [row[:row.index(eos) + 1] if eos in row else row for row in rows]


def continue_prompts(model, prompts: list[list[int]], max_new_tokens: int, *, eos: int, pad_id: int,
                     batch_size: int, temperature: float = 0.0, seed: int = 0, bf16: bool = False,
                     desc: str = "generate", cuda_graphs: bool = True) -> list[list[int]]:
    """``decode_batch`` over ``prompts`` in batches of ``batch_size``, results in the prompts' order.

    Prompts are batched by length (less padding, fewer columns read per step); the batches and their
    order depend only on the prompts, so a build is a function of its inputs. ``bf16`` runs the
    forward under bf16 autocast with a bf16 cache (on GPUs: half the cache traffic; the tokens then
    follow bf16 logits). Sampling uses one seeded generator on the model's device. ``cuda_graphs``:
    see ``decode_batch``.
    """
    if not prompts:
        return []
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed) if temperature > 0 else None
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    out: list[list[int]] = [[] for _ in prompts]
    ctx = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    model.eval()
    with ctx:
        for i in tqdm(range(0, len(order), batch_size), desc=desc, leave=False):
            chunk = order[i:i + batch_size]
            for j, cont in zip(chunk, decode_batch(model, [prompts[j] for j in chunk], max_new_tokens, eos=eos,
                                                   pad_id=pad_id, temperature=temperature, generator=generator,
                                                   cuda_graphs=cuda_graphs)):
                out[j] = cont
    return out
