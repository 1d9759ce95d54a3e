"""DDTree: one DFlash pass, then the `B` most probable prefixes as a tree (best-first over top-k).

Under the factorised draft distribution Q(y) = prod_i q_i(y_i), the expected acceptance of a tree
is the sum of its nodes' prefix probabilities, so the best `B`-node tree is the `B` most probable
prefixes; it is prefix-closed and is enumerated exactly by a heap over rank tuples that only
needs each depth's top-`B` tokens (reference/dflash_ddtree.md section 4).

Two builders give the same tree: `build_tree`, the reference heap on the host, and
`build_tree_device`, fixed-shape tensor ops (a per-depth beam of the `B` best prefixes, then the
global top `B`) that stay on the GPU, so a DDTree round needs no host round trip of its own.
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


def build_tree_device(top_logp: Tensor, top_ids: Tensor, budget: int) -> Proposal:
    """The `budget` most probable prefixes from sorted per-depth top-k `[L, K]`, with tensor ops only.

    A prefix in the global top `B` has its parent in the global top `B` (log-probs are <= 0), so the
    `B` best prefixes of each depth, grown from the previous depth's `B` best, contain every depth's
    share of the answer; the global top `B` over those `L x B` candidates is the tree. Nodes come out
    ordered by depth, then score, so parents precede children. A 1e-6 per-depth penalty breaks ties
    between a parent and a child of probability 1 in the parent's favour (the tree stays prefix-closed).
    """
    depth_max, k = top_logp.shape
    dev = top_logp.device
    width = min(budget, k)
    score = torch.full((budget,), float("-inf"), device=dev)
    score[:width] = top_logp[0, :width]
    scores, ranks = [score], [torch.arange(budget, device=dev).clamp_max(k - 1)]
    parents_local = [torch.zeros(budget, dtype=torch.long, device=dev)]
    for d in range(1, depth_max):  # beam: the best `budget` prefixes of depth d+1
        cand = (scores[-1][:, None] + top_logp[d][None, :]).flatten()
        best, idx = cand.topk(budget)
        scores.append(best)
        parents_local.append(idx // k)
        ranks.append(idx % k)
    flat = torch.stack(scores) - 1e-6 * torch.arange(depth_max, device=dev)[:, None]
    _, chosen = flat.flatten().topk(budget)
    depth0, local = chosen // budget, chosen % budget  # depth index (0-based) and slot in that depth's beam
    order = torch.argsort(depth0, stable=True)  # by depth; within a depth, topk's score order is kept
    depth0, local = depth0[order], local[order]
    node_of = torch.zeros(depth_max, budget, dtype=torch.long, device=dev)
    node_of[depth0, local] = torch.arange(1, budget + 1, device=dev)
    par_local = torch.stack(parents_local)[depth0, local]
    parents = torch.where(depth0 > 0, node_of[(depth0 - 1).clamp_min(0), par_local], 0)
    tokens = top_ids[depth0, torch.stack(ranks)[depth0, local]]
    ext = torch.cat([parents.new_zeros(1), parents])
    eye = torch.eye(budget + 1, dtype=torch.bool, device=dev)
    mask = eye
    for _ in range(depth_max):  # each pass adds one more generation of ancestors
        mask = eye | mask[ext]
    return Proposal(tokens=tokens, parents=parents, depths=depth0 + 1, tree_mask=mask)


def tree_proposal(logits: Tensor, budget: int) -> Proposal:
    """The best `budget`-node tree for per-depth draft `logits [L, V]` (the DDTree proposal)."""
    k = min(budget, logits.shape[-1])
    top_logp, top_ids = torch.log_softmax(logits.float(), -1).topk(k, dim=-1)
    return build_tree_device(top_logp, top_ids, budget)


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
