"""Acceptance: the target's token at every verified node, and the walk from the root.

Proposals are one-hot (the drafter's argmax), so sample-and-walk is exact at any temperature:
the target draws one token per node from its own distribution given that node's ancestors, and
the walk follows drafted children while they equal the draw. Every emitted token is therefore a
genuine target sample, and with T = 0 the output is the target's greedy decoding.

The walk runs on the device with fixed shapes; its result reaches the host in the round's one
read (see `whiflash.decoding.loop`).
"""
from __future__ import annotations

import torch
from torch import Tensor

from whiflash.drafters.base import Proposal
from whiflash.runtime.decode_attention import INTERPRET, triton

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _tree_walk(TOKENS, PARENTS, DEPTHS, MASK, PICKED, OUT, KEEP, M, NP: tl.constexpr):
        # `accept` of a tree in one program: a node is accepted when every node on its path (the mask's row)
        # drew its own token; the deepest accepted node ends the path (ties: the lower index, as `argmax`); the
        # permutation puts the path's nodes first, then the rest, each in index order (a stable partition).
        a = tl.arange(0, NP)  # 0: the root, i: node i
        node = (a >= 1) & (a <= M)
        parent = tl.load(PARENTS + a - 1, mask=node, other=0)
        drew = tl.load(TOKENS + a - 1, mask=node, other=0) == tl.load(PICKED + parent, mask=node, other=0)
        ok = (a == 0) | (node & drew)
        live = a <= M
        rows, cols = a[:, None], a[None, :]
        on = tl.load(MASK + rows * (M + 1) + cols, mask=live[:, None] & live[None, :], other=0) != 0
        accepted = live & (tl.sum((on & ~ok[None, :]).to(tl.int32), 1) == 0)
        depth = tl.where(node, tl.load(DEPTHS + a - 1, mask=node, other=0), 0)
        reach = tl.where(accepted, depth, -1)
        deepest = tl.max(reach, 0)
        best = tl.min(tl.where(reach == deepest, a, NP), 0)
        path = live & (tl.load(MASK + best * (M + 1) + a, mask=live, other=0) != 0)
        before_on = tl.cumsum(path.to(tl.int32), 0) - path.to(tl.int32)
        before_off = tl.cumsum((live & ~path).to(tl.int32), 0) - (live & ~path).to(tl.int32)
        place = tl.where(path, before_on, tl.sum(path.to(tl.int32), 0) + before_off)
        tl.store(KEEP + place, a.to(tl.int64), mask=live)
        tl.store(OUT + tl.arange(0, 2), tl.where(tl.arange(0, 2) == 0, deepest + 1, best).to(tl.int64))


def check_tree(tree: Proposal) -> None:
    """Raise unless `tree` is prefix-closed: every parent precedes its node, every depth is its
    parent's + 1, and the mask is exactly the ancestor-or-self relation. `accept` reads tau off a
    node's depth, so a node whose recorded depth is not its path's length would be accepted as if
    a whole path had matched."""
    parents, depths, mask = tree.parents.tolist(), tree.depths.tolist(), tree.tree_mask.cpu()
    rows = [{0}]
    for i, (p, d) in enumerate(zip(parents, depths), start=1):
        if not 0 <= p < i:
            raise ValueError(f"malformed tree: node {i} has parent {p}, which does not precede it")
        if d != len(rows[p]):
            raise ValueError(f"malformed tree: node {i} has depth {d} but its path from the root has {len(rows[p])} nodes")
        rows.append(rows[p] | {i})
    expect = torch.zeros_like(mask)
    for i, row in enumerate(rows):
        expect[i, list(row)] = True
    if not torch.equal(mask, expect):
        raise ValueError("malformed tree: tree_mask is not the ancestor-or-self relation of its parents")


def row(x: Tensor, i: Tensor) -> Tensor:
    """`x[i]` for a 0-dim device index `i`, without reading `i` on the host (PyTorch turns a 0-dim
    integer index into a Python int: a device synchronisation that stalls the round's launches).
    `i` may also be that index as `[1]`: a caller picking several rows reshapes it once (each reshape is
    one more op dispatched, host time every round)."""
    return x.index_select(0, i if i.dim() == 1 else i.reshape(1))[0]


def target_tokens(logits: Tensor, temperature: float, generator: torch.Generator | None) -> Tensor:
    """`[N]` argmax (T = 0) or one independent sample per row from softmax(logits / T)."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def accepted_nodes(tree: Proposal, picked: Tensor) -> tuple[Tensor, Tensor]:
    """For a tree over `[root, nodes]`: which nodes are accepted (their whole ancestry matched the
    target's picks) and every node's depth (root 0), as `[m+1]` device tensors."""
    ok = torch.cat([picked.new_ones(1, dtype=torch.bool), tree.tokens == picked[tree.parents]])
    accepted = ~(tree.tree_mask & ~ok).any(1)
    return accepted, torch.cat([tree.depths.new_zeros(1), tree.depths])


def _walk_by_kernel(tree: Proposal, picked: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """`accept`'s (count, best, keep) of a tree in one launch instead of ~20 small kernels after the verify pass."""
    m = tree.size
    out = torch.empty(2, dtype=torch.long, device=picked.device)
    keep = torch.empty(m + 1, dtype=torch.long, device=picked.device)
    np_ = max(16, triton.next_power_of_2(m + 1))  # the mask is one [NP, NP] tile: more warps for large trees
    _tree_walk[(1,)](tree.tokens, tree.parents, tree.depths, tree.tree_mask.view(torch.int8), picked, out, keep, m,
                     NP=np_, num_warps=4 if np_ <= 64 else 8)
    return out[0], out[1], keep


def accept(proposal: Proposal, picked: Tensor, branch: Tensor | None = None,
           check: bool = False, kernel: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Walk `[root, nodes]` given the target's token `picked[i]` at every node.

    Returns device tensors `(count, best, keep)`: the accepted path's length (root included, so
    count = tau), its last node, and a permutation of all node indices whose first `count`
    entries are the path, root first. Chains accept the leading run of matches; trees accept
    every node whose whole ancestry matches, and the deepest such node ends the path.
    `branch` (a 0-dim slot, for a union with `Proposal.branch`): only that slot's nodes may be on
    the path, so the round advances with the slot the oracle picked, not always the deeper one.
    `check` (`EngineOptions.check_trees`): `check_tree` a tree first (one extra host read; skipped while a
    CUDA graph is being captured). `kernel` (`EngineOptions.tree_kernel`): a tree without `branch` is walked by one
    Triton launch where it can run (a GPU, or Triton's interpreter), the same result as the tensor ops below.
    """
    m = proposal.size
    device = picked.device
    if proposal.parents is None:
        keep = torch.arange(m + 1, device=device)
        # cumprod promotes the bool run to long itself (one call fewer); the last node first, tau = it + 1
        best = torch.cumprod(proposal.tokens == picked[:-1], 0).sum() if m else keep.new_zeros(())
        return best + 1, best, keep
    if check and not (picked.is_cuda and torch.cuda.is_current_stream_capturing()):
        check_tree(proposal)
    if kernel and branch is None and triton is not None and (picked.is_cuda or INTERPRET):
        return _walk_by_kernel(proposal, picked)
    accepted, depth = accepted_nodes(proposal, picked)
    if branch is not None:
        accepted &= on_branch(proposal, branch)
    best = torch.where(accepted, depth, -1).argmax()
    on_path = row(proposal.tree_mask, best)
    keep = torch.argsort((~on_path).to(torch.uint8), stable=True)  # path first, in index (= depth) order
    return row(depth, best) + 1, best, keep


def on_branch(union: Proposal, slot: Tensor) -> Tensor:
    """`[m+1]` the root and the nodes of `slot`'s branch of a union tree (slot 0's nodes come first)."""
    index = torch.arange(union.size + 1, device=union.tokens.device)
    return (index == 0) | ((index > union.branch).long() == slot)


def branch_taus(union: Proposal, picked: Tensor) -> Tensor:
    """`[2]` tau each slot's branch of a union tree (`Proposal.branch`) reaches, read off the target's
    picks at every node: the oracle's two acceptance lengths from one verify pass (on the device)."""
    accepted, depth = accepted_nodes(union, picked)
    reach = torch.where(accepted, depth, 0)
    split = 1 + union.branch
    return torch.stack([reach[1:split].max(), reach[split:].max()]) + 1
