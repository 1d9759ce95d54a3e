"""Acceptance: the target's token at every verified node, and the walk from the root.

Proposals are one-hot (the drafter's argmax), so sample-and-walk is exact at any temperature:
the target draws one token per node from its own distribution given that node's ancestors, and
the walk follows drafted children while they equal the draw. Every emitted token is therefore a
genuine target sample, and with T = 0 the output is the target's greedy decoding.
"""
from __future__ import annotations

import torch
from torch import Tensor

from whiflash.drafters.base import Proposal


def target_tokens(logits: Tensor, temperature: float, generator: torch.Generator | None) -> Tensor:
    """`[N]` argmax (T = 0) or one independent sample per row from softmax(logits / T)."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def accept(proposal: Proposal, picked: Tensor) -> Tensor:
    """Indices (into `[root, nodes]`) of the accepted path, root first, as a device tensor.

    `picked[i]` is the target's token at node i. Chains accept the leading run of matches; trees
    accept every node whose whole ancestry matches, and the deepest such node ends the path.
    """
    m = proposal.size
    if m == 0:
        return torch.zeros(1, dtype=torch.long, device=picked.device)
    if proposal.parents is None:
        run = torch.cumprod((proposal.tokens == picked[:-1]).long(), 0).sum()
        return torch.arange(m + 1, device=picked.device)[: int(run) + 1]
    ok = torch.cat([torch.ones(1, dtype=torch.bool, device=picked.device), proposal.tokens == picked[proposal.parents]])
    anc = proposal.tree_mask
    accepted = ~(anc & ~ok).any(1)  # every ancestor (and the node) matched its parent's pick
    depth = torch.cat([torch.zeros(1, dtype=torch.long, device=picked.device), proposal.depths])
    best = torch.where(accepted, depth, -1).argmax()
    return anc[best].nonzero().squeeze(-1)  # ancestors come before descendants in index order
