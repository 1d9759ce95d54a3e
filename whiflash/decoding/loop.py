"""The speculative loop shared by every method (docs/design.md, "The round").

State between rounds: the target holds K/V for the committed tokens `x[0..n-1]` and the pending
token `x[n]` has been chosen but has no K/V yet. A round: the drafter proposes a chain or tree
after the pending token, the target verifies `[pending, proposal]` in one pass, the walk accepts
`a` drafted tokens, K/V is compacted along the accepted path, and the target's token after the
path becomes the new pending token. Plain autoregressive decoding is the same loop with an empty
proposal, so all methods share one code path and one definition of tau.

The loop talks to drafters only through the `Drafter` hooks: `propose`, `observe`, `route` (the
routing decision: the next round's slot, from the target's state at the last committed position; asked
after prefill, and at the end of each round only of a drafter with `routes`; None for a single drafter;
a drafter whose `row_policy` the verify pass runs for every row gets the path's last row of those
decisions; one whose `reads_state` is False gets no hidden state or logits), `advance` (the branch a
union proposal's round accepts) and `catchup_seconds`. Everything the host needs from a round travels in
one read, unpacked into a `RoundRead`; nothing is gathered for a consumer that is not there (every kernel
launched outside a captured pass is host time each round).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from whiflash.decoding.stats import DecodeStats, RoundRecord
from whiflash.decoding.verify import accept, branch_taus, row, target_tokens
from whiflash.drafters.base import Commit, Drafter, Proposal
from whiflash.runtime.model import Target, TargetOutput


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


class Verdict(NamedTuple):
    """A round's acceptance, on the device: what `accept` walked and what the host will read."""

    count: Tensor
    """0-dim tau (accepted drafted tokens + 1)."""
    keep: Tensor
    """`[m+1]` node order, the accepted path first (root included)."""
    path_ids: Tensor
    """`[m+1]` verified ids in `keep` order."""
    next_token: Tensor
    """`[1]` the target's token after the path: the next pending token."""
    best: Tensor
    """0-dim the path's last node (the next decision point)."""
    decision: Tensor | int | None
    """0-dim the next round's slot (`Drafter.route`), the slot itself where the host knows it, or None without
    routing."""
    slot_taus: Tensor | None
    """`[2]` both slots' tau (a union proposal), or None."""
    advanced: Tensor | None
    """0-dim the slot whose branch was accepted (`Drafter.advance`), or None."""


class RoundRead(NamedTuple):
    """A round's one device-to-host read, by name."""

    tau: int
    tokens: list[int]
    """The tokens the round emits: the accepted drafted ones, then the next pending token."""
    next_slot: int | None
    slot_taus: tuple[int, int] | None
    advanced: int | None

    @staticmethod
    def of(verdict: Verdict) -> RoundRead:
        """Read `verdict` in one `tolist()` and name its parts (the round's only host synchronisation)."""
        known = isinstance(verdict.decision, int)  # the slot is on the host already: not read
        parts = (verdict.count, verdict.path_ids, verdict.next_token, None if known else verdict.decision,
                 verdict.slot_taus, verdict.advanced)
        # flat long fields; those already flat are not reshaped (a reshape is an op dispatched, every round)
        fields = [(v if v.dim() == 1 else v.reshape(-1)).long() if v is not None else None for v in parts]
        host = iter(torch.cat([v for v in fields if v is not None]).tolist())
        # each field back by its own length, in order (an absent one is None)
        count, path, nxt, decision, taus, advanced = (
            [next(host) for _ in range(v.numel())] if v is not None else None for v in fields)
        tau = count[0]
        slot = verdict.decision if known else decision[0] if decision else None
        return RoundRead(tau, path[1:tau] + nxt, slot,
                         (taus[0], taus[1]) if taus else None, advanced[0] if advanced else None)


def _verify(target: Target, drafter: Drafter | None, pending: Tensor, proposal: Proposal, n: int,
            taps: tuple[int, ...]) -> tuple[Tensor, TargetOutput]:
    """`[pending, proposal]` and the target's one pass over it (depth positions and ancestor mask for trees;
    the drafter's `row_policy` decides inside the pass)."""
    verify_ids = torch.cat([pending, proposal.tokens]) if proposal.size else pending  # AR: no cat with nothing
    positions = None
    if proposal.depths is not None:
        positions = n + torch.cat([proposal.depths.new_zeros(1), proposal.depths])
    route = drafter.row_policy if drafter is not None else None
    return verify_ids, target(verify_ids, n, positions, proposal.tree_mask, taps, logits="all", route=route)


def _accept(target: Target, drafter: Drafter | None, proposal: Proposal, verify_ids: Tensor, out: TargetOutput,
            picked: Tensor) -> Verdict:
    """The walk over the target's picks (only the advancing slot's branch of a union), and the next decision."""
    slot_taus = advanced = None
    if proposal.branch is not None and drafter is not None:  # both slots' tau, then the slot the round keeps
        slot_taus = branch_taus(proposal, picked)
        advanced = drafter.advance(slot_taus)
    count, best, keep = accept(proposal, picked, branch=advanced, check=target.engine.check_trees,
                               kernel=target.engine.tree_kernel)
    at = best.reshape(1)  # the path's last node as a [1] index, made once for every row picked below
    decision = None
    if drafter is not None and drafter.routes:  # (the rows are not gathered for a drafter that never routes)
        if out.routes is not None:  # decided inside the pass: pick the path's last row
            decision = drafter.route(None, None, count, row(out.routes, at))
        elif not drafter.reads_state:  # e.g. a tau rule: the round's tau is all it reads
            decision = drafter.route(None, None, count)
        else:
            decision = drafter.route(row(out.hidden, at), row(out.logits, at), count, path=(out.hidden, keep))
    return Verdict(count, keep, verify_ids[keep], picked.index_select(0, at), best, decision, slot_taus, advanced)


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
    taps = tuple(dict.fromkeys(drafter.tap_layers)) if drafter is not None else ()  # the drafter's order
    stats = DecodeStats(method=drafter.name if drafter is not None else "ar", prompt_tokens=n)
    keep_features = on_round is not None

    target.setup_cache(n + max_new_tokens + (drafter.max_nodes if drafter is not None else 0) + 1)
    if drafter is not None:
        drafter.reset(target, target.max_len, temperature)
    t0 = time.perf_counter()
    out = target(ids, 0, taps=taps, logits="last")
    pending = target_tokens(out.logits, temperature, generator)
    features = _features(out.hidden, out.logits, None, keep=keep_features)
    decision = drafter.route(out.hidden[-1], out.logits[-1]) if drafter is not None else None
    emitted, slot = _read_prefill(pending, decision)
    if drafter is not None:
        drafter.observe(Commit(out.feats, torch.cat([ids[1:], pending]), 0, taps))
        drafter.prefill()  # its one-time pass over the prompt is the prefill's: upstream's decode time starts after it
    _sync(device)
    t1 = time.perf_counter()
    stats.prefill_seconds = t1 - t0
    no_proposal = Proposal(tokens=ids[:0])  # AR's every round (made once: a slice is an op dispatched)

    while emitted[-1] not in stops and len(emitted) < max_new_tokens:
        # 1. propose: the chosen slot's member catches up on its backlog, then drafts
        backlog = drafter.backlog_rows(slot or 0) if drafter is not None else 0
        proposal = drafter.propose(pending, n, slot or 0) if drafter is not None else no_proposal
        # 2. verify [pending, proposal] in one target pass
        verify_ids, out = _verify(target, drafter, pending, proposal, n, taps)
        # 3. accept: the target's token at every node, the walk, the next round's decision; one host read
        picked = target_tokens(out.logits, temperature, generator)
        verdict = _accept(target, drafter, proposal, verify_ids, out, picked)
        # 4. commit, dispatched before the round's read, while the GPU is still verifying (after the read the GPU
        # waits for every launch the host makes): K/V and the drafter's rows in `keep` order, the accepted path
        # first. Every node moves, a fixed shape: the rows after the path land in slots past the context, which
        # the next verify overwrites before any query sees them
        if proposal.parents is not None:
            target.compact(n, verdict.keep)
        # the target's pick at each path node is the token after it (the next node's, or the new pending one)
        rows = (out.feats[verdict.keep], picked[verdict.keep]) if drafter is not None else None
        read = RoundRead.of(verdict)
        if rows is not None:
            drafter.observe(Commit(rows[0][: read.tau], rows[1][: read.tau], n, taps))
        if read.advanced is not None:
            slot = read.advanced  # the oracle: the slot its advance rule picked
        record = RoundRecord(stats.rounds, n, read.tau, slot, backlog, read.slot_taus, *features)
        stats.add(record)
        if on_round is not None:
            on_round(record)
        features = _features(out.hidden, out.logits, verdict.best, keep=keep_features)
        slot, pending, n = read.next_slot, verdict.next_token, n + read.tau
        emitted.extend(read.tokens)
        if stops and not stops.isdisjoint(read.tokens):
            break

    _sync(device)
    stats.decode_seconds = time.perf_counter() - t1
    for i, tok in enumerate(emitted):
        if tok in stops:
            emitted = emitted[: i + 1]
            break
    emitted = emitted[:max_new_tokens]
    stats.new_tokens = len(emitted)
    stats.catchup_seconds = drafter.catchup_seconds if drafter is not None else 0.0
    return emitted, stats


def _features(hidden: Tensor, logits: Tensor, at: Tensor | None, keep: bool) -> tuple[Tensor | None, Tensor | None]:
    """The router's features at a decision point (row `at`, a 0-dim device index; None: the last row), gathered
    and copied (graph outputs are overwritten by the next replay) only when a callback will see them: every
    kernel a round launches costs host time."""
    if not keep:
        return None, None
    if at is None:
        return hidden[-1].clone(), logits[-1].clone()
    return row(hidden, at).clone(), row(logits, at).clone()


def _read_prefill(pending: Tensor, decision: Tensor | int | None) -> tuple[list[int], int | None]:
    """The prefill's one host read: the first token and, for routed drafters, the first slot."""
    if isinstance(decision, int):
        return pending.tolist()[:1], decision
    host = torch.cat([pending.long(), *([] if decision is None else [decision.reshape(1).long()])]).tolist()
    return host[:1], (host[1] if len(host) > 1 else None)
