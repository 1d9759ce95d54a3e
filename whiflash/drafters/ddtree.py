"""DDTree: one DFlash pass, then the `B` most probable prefixes as a tree (best-first over top-k).

Under the factorised draft distribution Q(y) = prod_i q_i(y_i), the expected acceptance of a tree
is the sum of its nodes' prefix probabilities, so the best `B`-node tree is the `B` most probable
prefixes; it is prefix-closed and is enumerated exactly by a heap over rank tuples that only
needs each depth's top-`B` tokens (reference/dflash_ddtree.md section 4).
"""
from __future__ import annotations

import heapq
from typing import Any

import torch
from torch import Tensor

from whiflash.drafters.base import Proposal
from whiflash.drafters.dflash import DFlashDrafter


def build_tree(top_logp: list[list[float]], top_ids: list[list[int]], budget: int) -> tuple[list[int], list[int], list[int]]:
    """Best-first selection of `budget` nodes from per-depth sorted top-k lists.

    Returns (tokens, parents, depths) in pop order; parents index `[root, node_0, ...]`, so a
    node's parent always precedes it. Scores are prefix log-probabilities; ties break by push order.
    """
    depth_max, k = len(top_logp), len(top_logp[0]) if top_logp else 0
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    if budget <= 0 or depth_max == 0:
        return tokens, parents, depths
    counter = 0
    # (negated prefix log-prob, tie-break, depth, rank, parent index, parent's prefix log-prob)
    heap = [(-top_logp[0][0], counter, 1, 0, 0, 0.0)]
    while heap and len(tokens) < budget:
        neg, _, depth, rank, parent, parent_score = heapq.heappop(heap)
        score = -neg
        tokens.append(top_ids[depth - 1][rank])
        parents.append(parent)
        depths.append(depth)
        me = len(tokens)  # index of this node in [root, nodes...]
        if rank + 1 < k:  # next sibling: same parent, next-best token at this depth
            counter += 1
            heapq.heappush(heap, (-(parent_score + top_logp[depth - 1][rank + 1]), counter, depth, rank + 1, parent, parent_score))
        if depth < depth_max:  # first child: this prefix extended by the best token one deeper
            counter += 1
            heapq.heappush(heap, (-(score + top_logp[depth][0]), counter, depth + 1, 0, me, score))
    return tokens, parents, depths


def ancestor_mask(parents: Tensor) -> Tensor:
    """`[m+1, m+1]` bool: row i is True on node i's ancestors and itself (root = row 0)."""
    m = parents.shape[0]
    vis = torch.eye(m + 1, dtype=torch.bool)
    for i, p in enumerate(parents.tolist(), start=1):
        vis[i] |= vis[p]
    return vis


def tree_proposal(logits: Tensor, budget: int) -> Proposal:
    """The best `budget`-node tree for per-depth draft `logits [L, V]` (the DDTree proposal)."""
    k = min(budget, logits.shape[-1])
    top_logp, top_ids = torch.log_softmax(logits, -1).topk(k, dim=-1)
    tokens, parents, depths = build_tree(top_logp.cpu().tolist(), top_ids.cpu().tolist(), budget)
    parents_t = torch.tensor(parents, dtype=torch.long)
    device = logits.device
    return Proposal(
        tokens=torch.tensor(tokens, dtype=torch.long, device=device),
        parents=parents_t.to(device),
        depths=torch.tensor(depths, dtype=torch.long, device=device),
        tree_mask=ancestor_mask(parents_t).to(device),
    )


class DDTreeDrafter(DFlashDrafter):
    """DFlash drafting verified as a tree of `tree_budget` nodes."""

    kind = "ddtree"

    def __init__(self, cfg: dict[str, Any], block_size: int | None = None, tree_budget: int | None = None) -> None:
        super().__init__(cfg, block_size)
        self.tree_budget = int(tree_budget if tree_budget is not None else self.block_size - 1)
        if self.tree_budget < 1:
            raise ValueError(f"ddtree: tree_budget must be >= 1, got {self.tree_budget}")

    @property
    def max_nodes(self) -> int:
        return self.tree_budget

    def propose(self, pending: Tensor, pos: int) -> Proposal:
        return tree_proposal(self.block_logits(pending, pos), self.tree_budget)
