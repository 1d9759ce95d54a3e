"""The speculative loop shared by every method (DESIGN.md section 3).

State between rounds: the target holds K/V for the committed tokens `x[0..n-1]` and the pending
token `x[n]` has been chosen but has no K/V yet. A round: the drafter proposes a chain or tree
after the pending token, the target verifies `[pending, proposal]` in one pass, the walk accepts
`a` drafted tokens, K/V is compacted along the accepted path, and the target's token after the
path becomes the new pending token. Plain autoregressive decoding is the same loop with an empty
proposal, so all methods share one code path and one definition of tau.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import Tensor

from whiflash.decoding.stats import DecodeStats
from whiflash.decoding.verify import accept, target_tokens
from whiflash.drafters.base import Commit, Drafter, Proposal
from whiflash.runtime.model import Target


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _as_ids(input_ids: Tensor | Sequence[int], device: torch.device) -> Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long, device=device)
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise ValueError(f"input_ids: batch size 1 is supported, got shape {tuple(ids.shape)}")
        ids = ids[0]
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"input_ids: expected a non-empty 1-D sequence of token ids, got shape {tuple(ids.shape)}")
    return ids


def _read(values: list[Tensor], drafter: Drafter | None, flags: Tensor | None) -> list[int]:
    """The round's one host read: the packed `values`, plus the drafter's flags (a router decision)."""
    if flags is not None:
        values = [*values, flags.reshape(-1)]
    host = torch.cat([v.reshape(-1).long() for v in values]).tolist()
    if flags is not None:
        drafter.receive(host[len(host) - flags.numel():])
        host = host[: len(host) - flags.numel()]
    return host


@torch.no_grad()
def generate(
    target: Target,
    drafter: Drafter | None,
    input_ids: Tensor | Sequence[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    stop_token_ids: Sequence[int] | None = None,
    seed: int | None = None,
) -> tuple[list[int], DecodeStats]:
    """Decode up to `max_new_tokens` after `input_ids` (batch 1); `drafter=None` is plain autoregressive.

    Returns the new token ids (cut after the first stop token, if any) and the round statistics.
    Greedy (`temperature=0`) output equals the target's own greedy decoding token for token; at
    T > 0 every token is an exact sample of the target (`seed` makes the run repeatable).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    device = target.device
    ids = _as_ids(input_ids, device)
    n = ids.shape[0]
    limit = target.config.max_position_embeddings
    nodes = drafter.max_nodes if drafter is not None else 0
    max_len = n + max_new_tokens + nodes + 1
    if n + max_new_tokens > limit:
        raise ValueError(f"prompt ({n}) + max_new_tokens ({max_new_tokens}) exceeds the target's {limit} positions")
    generator = None
    if temperature > 0:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
    stops = set(stop_token_ids or ())
    taps = tuple(sorted(set(drafter.tap_layers))) if drafter is not None else ()
    stats = DecodeStats(method=drafter.kind if drafter is not None else "ar", prompt_tokens=n)

    target.setup_cache(max_len)
    if drafter is not None:
        drafter.reset(target, max_len, temperature)
    t0 = time.perf_counter()
    out = target(ids, 0, taps=taps, logits="last")
    pending = target_tokens(out.logits, temperature, generator)
    flags = drafter.decide(out.hidden[-1], out.logits[-1], None) if drafter is not None else None
    emitted = _read([pending], drafter, flags)
    if drafter is not None:
        drafter.observe(Commit(out.feats, torch.cat([ids[1:], pending]), 0, taps))
    _sync(device)
    t1 = time.perf_counter()
    stats.prefill_seconds = t1 - t0

    while emitted[-1] not in stops and len(emitted) < max_new_tokens:
        proposal = drafter.propose(pending, n) if drafter is not None else Proposal(tokens=ids[:0])
        verify_ids = torch.cat([pending, proposal.tokens])
        positions = None
        if proposal.depths is not None:
            positions = n + torch.cat([proposal.depths.new_zeros(1), proposal.depths])
        out = target(verify_ids, n, positions, proposal.tree_mask, taps, logits="all")
        picked = target_tokens(out.logits, temperature, generator)
        count, best, keep = accept(proposal, picked)
        path_ids, nxt = verify_ids[keep], picked[best].reshape(1)
        flags = drafter.decide(out.hidden[best], out.logits[best], picked) if drafter is not None else None
        host = _read([count, path_ids, nxt], drafter, flags)  # the one host synchronisation of the round
        tau = host[0]
        round_tokens = host[2 : 1 + tau] + host[-1:]  # accepted drafts + the next pending token
        if proposal.parents is not None:
            target.compact(n, keep[:tau])
        if drafter is not None:
            new = torch.cat([path_ids[1:tau], nxt])
            drafter.observe(Commit(out.feats[keep[:tau]], new, n, taps))
        pending = nxt
        n += tau
        stats.taus.append(tau)
        emitted.extend(round_tokens)
        if stops and not stops.isdisjoint(round_tokens):
            break

    _sync(device)
    stats.decode_seconds = time.perf_counter() - t1
    for i, tok in enumerate(emitted):
        if tok in stops:
            emitted = emitted[: i + 1]
            break
    emitted = emitted[:max_new_tokens]
    stats.new_tokens = len(emitted)
    if drafter is not None:
        drafter.annotate(stats)
    return emitted, stats
