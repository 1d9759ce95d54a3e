"""Router rows from parallel passes instead of oracle rounds (`whiflash-datagen --parallel`).

At T = 0 every lossless decode of a prompt emits the target's greedy sequence, and a chain drafter's tau at
a round depends only on where the round starts: its state there is the committed rows, on which each member
catches up whichever slot drafted before (the same assumption the replay and the speed oracle make). So the
greedy sequence (a shard's prompts continued in one batch, `whiflash.decoding.greedy`), one causal target pass
over it and a few teacher-forced passes per slot (`Drafter.taus`) give both slots' tau at every position of the
sequence, and the path (`--path`) is walked over them: a round at position `n` advances by the tau of the slot
it takes. The rows are those oracle decoding logs, computed with a few large passes instead of a round's small
ones. They are equal in float32; in bf16 a near-tie may break the other way, the passes' shapes being other
than the rounds'.
"""
from __future__ import annotations

import numpy as np
import torch

import whiflash
from whiflash.datagen.record import columns
from whiflash.decoding.greedy import greedy_batch
from whiflash.decoding.routed import OracleDrafter
from whiflash.drafters.base import Commit
from whiflash.routers import entropy


def walk(taus: np.ndarray, sequence: list[int], first: int, max_new_tokens: int, stops: set[int],
         follow: int | None, every: bool = False) -> list[tuple[int, int]]:
    """The rounds `(pending position, slot)` a decode takes over `taus [R, 2]` (row `n - first`: both slots' tau
    at pending position `n`) of the greedy `sequence`, as `generate` runs them: from the first generated token
    (position `first`), each round takes `follow`'s slot or the larger tau (ties: slot 1) and emits its tau tokens,
    until `max_new_tokens` are out or a round emitted a stop token. `every`: a round at every position a decode
    can start one at (before `max_new_tokens` are out and up to the first stop token), with the larger tau's slot."""
    rounds: list[tuple[int, int]] = []
    n, emitted = first, 1  # the prefill emitted the token at `first`
    if sequence[first] in stops:
        return rounds
    while emitted < max_new_tokens:
        t0, t1 = (int(t) for t in taus[n - first])
        slot = follow if follow is not None else int(t1 >= t0)
        rounds.append((n, slot))
        step = 1 if every else (t0, t1)[slot]
        emitted += step
        if not stops.isdisjoint(sequence[n + 1 : n + 1 + step]):
            break
        n += step
    return rounds


def continuations(target: whiflash.runtime.model.Target, oracle: OracleDrafter, prompts: list[list[int]],
                  max_new_tokens: int) -> list[list[int]]:
    """Each prompt's greedy continuation as far as `record_prompt_parallel` reads it, in one batch: past
    `max_new_tokens` by a draft and its bonus token (every draft of the last round meets the sequence), with
    no stop token (the walk stops)."""
    return greedy_batch(target, prompts, max_new_tokens + max(d.draft_length for d, _ in oracle.slots) + 1)


@torch.no_grad()
def record_prompt_parallel(target: whiflash.runtime.model.Target, oracle: OracleDrafter, ids: list[int],
                           max_new_tokens: int, stop_token_ids: list[int] | None = None, chunk: int = 64,
                           every: bool = False, continuation: list[int] | None = None) -> dict[str, np.ndarray]:
    """`record_prompt`'s rows for one prompt, from parallel passes (module docstring); `chunk` rounds a pass.
    `every`: a row at every position a round can start at (`walk`), not only those of the path. `continuation`:
    the prompt's `continuations` when a batch already made them (else they are made here)."""
    new = continuation if continuation is not None else continuations(target, oracle, [ids], max_new_tokens)[0]
    sequence = list(ids) + new
    first = len(ids)
    target.setup_cache(len(sequence))
    seq = torch.tensor(sequence, dtype=torch.long, device=target.device)
    taps = oracle.tap_layers
    out = target.full_pass(seq, taps)
    commit = Commit(out.feats, seq[1:], 0, taps)
    for member in oracle.members:  # sized, and given the target's engine, for the passes
        member.reset(target, target.max_len)
    starts = torch.arange(first, first + max_new_tokens, device=target.device)
    taus = torch.cat([
        torch.stack([d.taus(d.select_taps(commit), seq, starts[i : i + chunk], budget) for d, budget in oracle.slots], 1)
        for i in range(0, len(starts), chunk)]).cpu().numpy()
    rounds = walk(taus, sequence, first, max_new_tokens, set(stop_token_ids or ()), oracle.follow, every)
    if not rounds:
        return {}
    positions = [n for n, _ in rounds]
    last = torch.tensor(positions, device=target.device) - 1  # the decision point: the last committed position
    return columns(positions, out.hidden[last], entropy(out.logits[last]),
                   taus[np.array(positions) - first], [slot for _, slot in rounds])
