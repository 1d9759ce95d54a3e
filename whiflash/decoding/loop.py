"""The speculative loop shared by every method (docs/design.md, "The round").

State between rounds: the target holds K/V for the committed tokens `x[0..n-1]` and the pending
token `x[n]` has been chosen but has no K/V yet. A round: the drafter proposes a chain or tree
after the pending token, the target verifies `[pending, proposal]` in one pass, the walk accepts
`a` drafted tokens, K/V is compacted along the accepted path, and the target's token after the
path becomes the new pending token. Plain autoregressive decoding is the same loop with an empty
proposal, so all methods share one code path and one definition of tau.

Routed drafters carry a routing policy; the loop asks it for the next round's slot at the end of
each round (and after prefill), from the target's state at the last committed position, and the
slot reaches the host in the round's one read.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from whiflash.decoding.stats import DecodeStats, RoundRecord
from whiflash.decoding.verify import accept, branch_taus, row, target_tokens
from whiflash.drafters.base import Commit, Drafter, Proposal
from whiflash.runtime.model import Target


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _as_ids(input_ids: Tensor | Sequence[int], vocab: int, device: torch.device) -> Tensor:
    """The prompt as a `[n]` long tensor on `device`, checked against the vocabulary on the host
    (a tensor prompt is read once for that, before the prefill)."""
    host = input_ids.tolist() if isinstance(input_ids, Tensor) else input_ids
    if isinstance(host, Sequence) and len(host) > 0 and isinstance(host[0], Sequence):
        if len(host) != 1:
            raise ValueError(f"input_ids: batch size 1 is supported, got {len(host)} sequences")
        host = host[0]
    if not isinstance(host, Sequence) or len(host) == 0 or not all(isinstance(t, int) and not isinstance(t, bool) for t in host):
        raise ValueError("input_ids: expected a non-empty 1-D sequence of integer token ids")
    bad = [t for t in host if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"input_ids: {bad[:5]} are not token ids of the target's vocabulary (0..{vocab - 1})")
    return torch.tensor(host, dtype=torch.long, device=device)


def _check_arguments(target: Target, max_new_tokens: int, temperature: float,
                     stop_token_ids: Sequence[int] | None) -> None:
    vocab = target.config.vocab_size
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature) \
            or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    bad = [t for t in stop_token_ids or () if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab]
    if bad:
        raise ValueError(f"stop_token_ids: {bad} are not token ids of the target's vocabulary (0..{vocab - 1})")


def prompt_room(target: Target, max_new_tokens: int, max_nodes: int = 0) -> int:
    """Most prompt tokens that leave `max_new_tokens` and a round's drafted nodes (`max_nodes` per drafter, two
    drafters at most) inside the target's positions; callers keep a prompt's last this-many tokens."""
    return target.config.max_position_embeddings - max_new_tokens - 2 * max_nodes - 2


@torch.no_grad()
def generate(
    target: Target,
    drafter: Drafter | None,
    input_ids: Tensor | Sequence[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    stop_token_ids: Sequence[int] | None = None,
    seed: int | None = None,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> tuple[list[int], DecodeStats]:
    """Decode up to `max_new_tokens` after `input_ids` (batch 1); `drafter=None` is plain autoregressive.

    Returns the new token ids (cut after the first stop token, if any) and the round statistics.
    Greedy (`temperature=0`) output equals the target's own greedy decoding token for token; at
    T > 0 every token is an exact sample of the target (`seed` makes the run repeatable).
    `on_round(record)` is called after every round with its `RoundRecord`, router features included.
    """
    device = target.device
    _check_arguments(target, max_new_tokens, temperature, stop_token_ids)
    ids = _as_ids(input_ids, target.config.vocab_size, device)
    n = ids.shape[0]
    limit = target.config.max_position_embeddings
    if n + max_new_tokens > limit:
        raise ValueError(f"prompt ({n}) + max_new_tokens ({max_new_tokens}) exceeds the target's {limit} positions")
    generator = None
    if temperature > 0:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
    stops = set(stop_token_ids or ())
    taps = tuple(sorted(set(drafter.tap_layers))) if drafter is not None else ()
    router = getattr(drafter, "router", None)  # routed drafters carry their policy
    stats = DecodeStats(method=drafter.name if drafter is not None else "ar", prompt_tokens=n)

    target.setup_cache(n + max_new_tokens + (drafter.max_nodes if drafter is not None else 0) + 1)
    if drafter is not None:
        drafter.reset(target, target.max_len, temperature)
    t0 = time.perf_counter()
    out = target(ids, 0, taps=taps, logits="last")
    pending = target_tokens(out.logits, temperature, generator)
    features = _features(out.hidden[-1], out.logits[-1], keep=on_round is not None)
    decision = router(out.hidden[-1], out.logits[-1]).reshape(1) if router is not None else pending[:0]
    emitted, slot = _read_prefill(pending, decision)
    if drafter is not None:
        drafter.observe(Commit(out.feats, torch.cat([ids[1:], pending]), 0, taps))
    _sync(device)
    t1 = time.perf_counter()
    stats.prefill_seconds = t1 - t0

    while emitted[-1] not in stops and len(emitted) < max_new_tokens:
        # 1. draft: the chosen slot's member catches up on its backlog, then proposes
        backlog = drafter.backlog_rows(slot or 0) if drafter is not None else 0
        proposal = drafter.propose(pending, n, slot or 0) if drafter is not None else Proposal(tokens=ids[:0])
        # 2. verify [pending, proposal] in one target pass (depth positions and ancestor mask for trees)
        verify_ids = torch.cat([pending, proposal.tokens])
        positions = None
        if proposal.depths is not None:
            positions = n + torch.cat([proposal.depths.new_zeros(1), proposal.depths])
        out = target(verify_ids, n, positions, proposal.tree_mask, taps, logits="all")
        # 3. accept: the target's token at every node, the walk, and the next round's decision
        picked = target_tokens(out.logits, temperature, generator)
        if proposal.branch is not None:  # the oracle: both slots' tau, then the slot it advances with
            slot_taus = branch_taus(proposal, picked)
            advance = drafter.advance(slot_taus)
            count, best, keep = accept(proposal, picked, branch=advance)
        else:
            count, best, keep = accept(proposal, picked)
        path_ids, nxt = verify_ids[keep], row(picked, best).reshape(1)
        extra: list[Tensor] = []
        if router is not None:
            extra.append(router(row(out.hidden, best), row(out.logits, best)).reshape(1))
        if proposal.branch is not None:
            extra += [slot_taus, advance.reshape(1)]
        # the one host synchronisation of the round
        host = torch.cat([v.reshape(-1).long() for v in (count, path_ids, nxt, *extra)]).tolist()
        tau, rest = host[0], host[2 + path_ids.shape[0] :]
        round_tokens = host[2 : 1 + tau] + host[1 + path_ids.shape[0] : 2 + path_ids.shape[0]]
        next_slot = rest.pop(0) if router is not None else None
        taus = (rest[0], rest[1]) if proposal.branch is not None else None
        # 4. commit: K/V along the accepted path, the drafter's view of the new positions
        if proposal.parents is not None:
            target.compact(n, keep[:tau])
        if drafter is not None:
            drafter.observe(Commit(out.feats[keep[:tau]], torch.cat([path_ids[1:tau], nxt]), n, taps))
        if taus is not None:
            slot = rest[2]  # the oracle: the slot its advance rule picked (OracleDrafter.advance)
        record = RoundRecord(stats.rounds, n, tau, slot, backlog, taus, *features)
        stats.add(record)
        if on_round is not None:
            on_round(record)
        features = _features(row(out.hidden, best), row(out.logits, best), keep=on_round is not None)
        slot, pending, n = next_slot, nxt, n + tau
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
    stats.catchup_seconds = getattr(drafter, "catchup_seconds", 0.0)
    return emitted, stats


def _features(hidden: Tensor, logits: Tensor, keep: bool) -> tuple[Tensor | None, Tensor | None]:
    """The router's features at a decision point, copied (graph outputs are overwritten by the next
    replay) only when a callback will see them."""
    return (hidden.clone(), logits.clone()) if keep else (None, None)


def _read_prefill(pending: Tensor, decision: Tensor) -> tuple[list[int], int | None]:
    """The prefill's one host read: the first token and, for routed drafters, the first slot."""
    host = torch.cat([pending.long(), decision.long()]).tolist()
    return host[:1], (host[1] if len(host) > 1 else None)
