"""DDTree trees: from one DFlash pass, the `B` most probable prefixes (best-first over top-k).

Under the factorised draft distribution Q(y) = prod_i q_i(y_i), the expected acceptance of a tree
is the sum of its nodes' prefix probabilities, so the best `B`-node tree is the `B` most probable
prefixes (docs/design.md, "DDTree").

**Tie rule.** Prefixes are ranked by score (prefix log-probability) descending, then depth
ascending, then their rank path (the top-k rank of each token, root to leaf) lexicographically.
A child's score never exceeds its parent's (log-probs are <= 0, and rounding is monotone), and it
is one deeper, so a parent always ranks before its child: the first `B` prefixes of this order
form a prefix-closed tree for any scores, ties, exact zeros and -inf included. Scores are summed
in float64, depth by depth in the same order by both builders, so they agree bit for bit.

Two builders give the same tree under that rule: `build_tree`, the reference heap on the host
(upstream's best-first search), and `build_tree_device`, fixed-shape tensor ops (a per-depth beam
of the `B` best prefixes, then the global first `B`) that stay on the GPU, so a DDTree round needs
no host round trip of its own. Both emit nodes in rank order, so parents precede children. The device
builder is replayed as one CUDA graph whose kernels run back to back, so its kernel count is its cost: as
tensor ops ~100 (two sorts a depth, ancestors by pointer jumping; `tests/test_trees.py` bounds them); on a GPU
with Triton one (`_tree`): every depth's beam, then the global first `B`, each as the first `B` of the few
candidates that can be among them, ranked all at once (no step-by-step merge), then the parents and the ancestor
mask, all in one program (`scripts/bench_tree.py` times it against the tensor ops).
"""
from __future__ import annotations

import heapq

import torch
from torch import Tensor

from whiflash.drafters.base import Proposal
from whiflash.runtime.decode_attention import INTERPRET, triton

if triton is not None:
    import triton.language as tl



def build_tree(top_logp: list[list[float]], top_ids: list[list[int]], budget: int) -> tuple[list[int], list[int], list[int]]:
    """Best-first selection of up to `budget` nodes from per-depth sorted top-k lists (the reference).

    Returns (tokens, parents, depths) in rank order (the module's tie rule); parents index
    `[root, node_0, ...]`, so a node's parent always precedes it. Fewer than `budget` nodes come
    back when fewer distinct prefixes exist.
    """
    depth_max, k = len(top_logp), len(top_logp[0]) if top_logp else 0
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    if budget <= 0 or depth_max == 0 or k == 0:
        return tokens, parents, depths
    # (negated score, depth, rank path | parent index, parent's score); the key is the tie rule,
    # and rank paths are unique, so the comparison never reaches the payload
    heap = [(-float(top_logp[0][0]), 1, (0,), 0, 0.0)]
    while heap and len(tokens) < budget:
        neg, depth, path, parent, parent_score = heapq.heappop(heap)
        tokens.append(int(top_ids[depth - 1][path[-1]]))
        parents.append(parent)
        depths.append(depth)
        me, rank = len(tokens), path[-1]  # this node's index in [root, nodes...] and its top-k rank
        if rank + 1 < k:  # next sibling: same parent, next-best token at this depth
            score = parent_score + float(top_logp[depth - 1][rank + 1])
            heapq.heappush(heap, (-score, depth, path[:-1] + (rank + 1,), parent, parent_score))
        if depth < depth_max:  # first child: this prefix extended by the best token one deeper
            heapq.heappush(heap, (neg - float(top_logp[depth][0]), depth + 1, path + (0,), me, -neg))
    return tokens, parents, depths


def ancestor_mask(parents: Tensor) -> Tensor:
    """`[m+1, m+1]` bool: row i is True on node i's ancestors and itself (root = row 0)."""
    m = parents.shape[0]
    vis = torch.eye(m + 1, dtype=torch.bool)
    for i, p in enumerate(parents.tolist(), start=1):
        vis[i] |= vis[p]
    return vis


def _first(score: Tensor, valid: Tensor | None, n: int) -> Tensor:
    """Indices of the first `n` entries ordered by (valid first, score descending, index ascending); `valid`
    None: every entry is valid."""
    order = torch.sort(score, descending=True, stable=True).indices
    if valid is None:
        return order[:n]
    return order[torch.sort((~valid[order]).to(torch.uint8), stable=True).indices][:n]


if triton is not None:

    @triton.jit
    def _tree(LOGP, IDS, SORTED, SLOT_OF, PICKS, NODE_OF, CAND_V, CAND_F, CAND_IN, PAR, TOKENS, PARENTS, DEPTHS, MASK,
              L, K, B, BP: tl.constexpr, MP: tl.constexpr, EP: tl.constexpr, CH: tl.constexpr, LP: tl.constexpr,
              NP: tl.constexpr, RC: tl.constexpr):
        # One program builds the whole tree. (1) Every depth's beam, the first B of its candidates: a candidate is
        # a row of the previous beam (its score) and a token of this depth (its log-prob), and the tie rule orders
        # them by score, then flat index (row slot * K + token rank). The r-th row in rule order (0-based) has r
        # rows at least as good, and the first j tokens of each of those r + 1 rows are ahead of its j-th token, so
        # that token is among the first B only if (r + 1)(j + 1) <= B: only the M ~ B ln B candidates with
        # j < B // (r + 1) are ranked, each against all of them at once (no B-step merge a depth). The chosen
        # come in rule order (SORTED / SLOT_OF, for the next depth and for (2)); the next beam holds them in flat
        # index (rank-path) order, which PICKS records. (2) The global first B, ranked the same way among the
        # entries that can be among them; a node's parent is read off the previous depth's slots. (3) The ancestor
        # mask by walking up the parents.
        i = tl.arange(0, BP)
        row_ok = i < B
        s = tl.load(LOGP + i, mask=row_ok, other=float("-inf")).to(tl.float64)  # depth 1: ranks 0 .. B-1 (K >= B)
        tl.store(SORTED + i, s, mask=row_ok)
        tl.store(SLOT_OF + i, i.to(tl.int64), mask=row_ok)
        tl.store(PICKS + i, i.to(tl.int64), mask=row_ok)  # depth 1: a slot's flat index is its rank (parent: root)
        # candidate m -> (row r in rule order, token rank j), the same at every depth
        width = tl.where(row_ok, tl.minimum(B // (i + 1), K), 0)
        ends = tl.cumsum(width, 0)
        m = tl.arange(0, MP)
        live = m < tl.sum(width, 0)
        r = tl.minimum(tl.sum((ends[None, :] <= m[:, None]).to(tl.int32), 1), B - 1)
        j = m - tl.sum(tl.where(i[None, :] == r[:, None], (ends - width)[None, :], 0), 1)
        for d in range(1, L):
            tl.debug_barrier()  # the previous depth's stores, by every lane
            v = tl.load(SORTED + (d - 1) * B + r, mask=live, other=float("-inf")) + tl.load(
                LOGP + d * K + j, mask=live, other=0.0)
            v = tl.where(live & (v == v), v, float("-inf"))  # NaN scores (a broken draft): still a tree
            flat = tl.where(live, tl.load(SLOT_OF + (d - 1) * B + r, mask=live, other=0) * K + j, K * B)
            tl.store(CAND_V + m, v)
            tl.store(CAND_F + m, flat)
            tl.debug_barrier()
            rank = tl.zeros([MP], tl.int32)  # candidates ahead of m under the tie rule
            for c0 in range(0, MP, CH):
                ov = tl.load(CAND_V + c0 + tl.arange(0, CH))
                of = tl.load(CAND_F + c0 + tl.arange(0, CH))
                ahead = (ov[None, :] > v[:, None]) | ((ov[None, :] == v[:, None]) & (of[None, :] < flat[:, None]))
                rank += tl.sum(ahead.to(tl.int32), 1)
            chosen = live & (rank < B)
            tl.store(CAND_IN + m, chosen.to(tl.int32))
            tl.debug_barrier()
            pos = tl.zeros([MP], tl.int64)  # chosen candidates before m in flat-index order: its beam slot
            for c0 in range(0, MP, CH):
                oin = tl.load(CAND_IN + c0 + tl.arange(0, CH))
                of = tl.load(CAND_F + c0 + tl.arange(0, CH))
                pos += tl.sum(((oin[None, :] != 0) & (of[None, :] < flat[:, None])).to(tl.int64), 1)
            tl.store(SORTED + d * B + rank, v, mask=chosen)
            tl.store(SLOT_OF + d * B + rank, pos, mask=chosen)
            tl.store(PICKS + d * B + pos, flat, mask=chosen)
        tl.debug_barrier()  # (2) reads what every lane stored above
        # entry e -> (depth d, place q in that depth's rule order): only q < B - d can be among the first B, as the
        # q entries before it in its depth and its d ancestors rank before it; the global rule order is the score,
        # then depth * B + beam slot (the flattened depth-major order)
        dl = tl.arange(0, LP)
        width = tl.where(dl < L, tl.maximum(B - dl, 0), 0)
        ends = tl.cumsum(width, 0)
        e = tl.arange(0, EP)
        live = e < tl.sum(width, 0)
        de = tl.minimum(tl.sum((ends[None, :] <= e[:, None]).to(tl.int32), 1), L - 1)
        q = e - tl.sum(tl.where(dl[None, :] == de[:, None], (ends - width)[None, :], 0), 1)
        v = tl.load(SORTED + de * B + q, mask=live, other=float("-inf"))
        v = tl.where(live & (v == v), v, float("-inf"))
        slot = tl.load(SLOT_OF + de * B + q, mask=live, other=0)
        key = tl.where(live, de * B + slot, L * B)
        tl.store(CAND_V + e, v)
        tl.store(CAND_F + e, key)
        tl.debug_barrier()
        rank = tl.zeros([EP], tl.int32)
        for c0 in range(0, EP, CH):
            ov = tl.load(CAND_V + c0 + tl.arange(0, CH))
            ok = tl.load(CAND_F + c0 + tl.arange(0, CH))
            rank += tl.sum(((ov[None, :] > v[:, None]) | ((ov[None, :] == v[:, None]) & (ok[None, :] < key[:, None])))
                           .to(tl.int32), 1)
        chosen = live & (rank < B)  # node rank + 1, in rank order
        flat = tl.load(PICKS + de * B + slot, mask=chosen, other=0)
        tl.store(NODE_OF + de * B + slot, (rank + 1).to(tl.int64), mask=chosen)
        tl.store(TOKENS + rank, tl.load(IDS + de * K + flat % K, mask=chosen, other=0), mask=chosen)
        tl.store(DEPTHS + rank, (de + 1).to(tl.int64), mask=chosen)
        tl.debug_barrier()  # a parent's node, stored by another lane (a parent always ranks before its child)
        parent = tl.load(NODE_OF + (de - 1) * B + flat // K, mask=chosen & (de > 0), other=0)
        tl.store(PARENTS + rank, parent, mask=chosen)
        tl.store(PAR + 1 + rank, parent, mask=chosen)  # [root, nodes]: each node's parent, the root its own
        tl.store(PAR + tl.arange(0, 1), tl.zeros([1], tl.int64))
        tl.debug_barrier()  # (3) gathers parents other lanes stored
        cols = tl.arange(0, NP)
        for r0 in range(0, B + 1, RC):
            rows = r0 + tl.arange(0, RC)
            real = rows < B + 1  # a new name: a loop may not change the shape of a variable from before it
            up = tl.load(PAR + rows, mask=real, other=0)
            seen = rows[:, None] == cols[None, :]
            for _ in range(L):  # a node is at most L deep: L steps up reach the root
                seen = seen | (up[:, None] == cols[None, :])
                up = tl.load(PAR + up)
            tl.store(MASK + rows[:, None] * (B + 1) + cols[None, :], seen.to(tl.int8),
                     mask=real[:, None] & (cols[None, :] < B + 1))


KERNEL_MAX_BUDGET = 32
"""The largest budget the tree kernel builds (larger ones take the tensor ops). On an H100 (depth 15, vocabulary
8192, `scripts/bench_tree.py`) a proposal (top-k and tree) takes 117 / 186 us with the kernel against 760 / 794 us
with the tensor ops at B = 15 / 32, but 1,769 against 955 us at B = 64, where one program ranks 4x the candidates
of B = 32 (16x the comparisons); past 100 the kernel's compile for sm_90 also grows from seconds to minutes."""


def _tree_launch(depth_max: int, k: int, budget: int) -> dict[str, int]:
    """`_tree`'s compile-time sizes and warps for a `[depth_max, k]` draft and a budget: the candidates it ranks,
    a depth's (its r-th row's first budget // r tokens) and the global first B's, rounded up to powers of two."""
    mp = max(16, triton.next_power_of_2(sum(min(k, budget // r) for r in range(1, budget + 1))))
    ep = max(16, triton.next_power_of_2(sum(budget - d for d in range(min(depth_max, budget)))))
    # a chunk of CH candidates is ranked against all MP (or EP) at once: at most 4,096 comparisons a chunk, or
    # the tile outgrows the registers; the chunks are a loop, not unrolled, which keeps B = 64's compile in seconds
    return dict(BP=max(16, triton.next_power_of_2(budget)), MP=mp, EP=ep, CH=min(mp, ep, 32, 4096 // max(mp, ep)),
                LP=max(16, triton.next_power_of_2(depth_max)), NP=max(16, triton.next_power_of_2(budget + 1)), RC=16,
                num_warps=1 if max(mp, ep) <= 64 else 4)


def _tree_by_kernel(logp: Tensor, top_ids: Tensor, budget: int) -> Proposal:
    """The tree of a float64 `logp [L, K]` and its token ids (K >= budget) in one kernel launch (`_tree`)."""
    depth_max, k = logp.shape
    dev = logp.device
    new = lambda *shape, dtype=torch.long: torch.empty(*shape, dtype=dtype, device=dev)  # noqa: E731
    tokens, parents, depths, par = new(budget), new(budget), new(budget), new(budget + 1)
    mask = new(budget + 1, budget + 1, dtype=torch.int8)
    launch = _tree_launch(depth_max, k, budget)
    mp, ep = launch["MP"], launch["EP"]
    beams = new(depth_max, budget, dtype=torch.float64), new(depth_max, budget), new(depth_max, budget)
    ranked = new(depth_max, budget), new(max(mp, ep), dtype=torch.float64), new(max(mp, ep)), new(mp, dtype=torch.int32)
    _tree[(1,)](logp.contiguous(), top_ids.contiguous(), *beams, *ranked, par, tokens, parents, depths, mask,
                depth_max, k, budget, **launch)
    return Proposal(tokens=tokens, parents=parents, depths=depths, tree_mask=mask.view(torch.bool))


def build_tree_device(top_logp: Tensor, top_ids: Tensor, budget: int, kernel: bool = True) -> Proposal:
    """The first `budget` prefixes under the tie rule, from sorted per-depth top-k `[L, K]`, with tensor ops only.

    Each depth keeps a beam of its first `budget` prefixes, grown from the previous depth's beam:
    a prefix among the global first `budget` has its parent there too (a parent ranks before its
    child), so the beams hold the answer; the global first `budget` over the `L x budget` beam
    entries is the tree. Beams are kept in rank-path order, so a candidate's flat index is its
    rank-path order and the stable sorts of `_first` apply the whole tie rule.

    When fewer than `budget` prefixes exist (a vocabulary smaller than the budget), the remaining
    nodes repeat the best depth-1 token as extra children of the root: still a well-formed tree
    (fixed shapes need `budget` nodes), and a duplicate can only be accepted where its twin is.
    """
    depth_max, k = top_logp.shape
    dev = top_logp.device
    logp = top_logp.double()  # float64 sums: the same scores as the reference, bit for bit
    # With at least `budget` tokens a depth (any real vocabulary) every beam slot holds a real prefix, so
    # no validity is tracked: one sort a depth fewer and about half the kernels of the graph this becomes.
    full = k >= budget
    if full and kernel and budget <= KERNEL_MAX_BUDGET and triton is not None and (dev.type == "cuda" or INTERPRET):
        return _tree_by_kernel(logp, top_ids, budget)  # one launch instead of ~100 tensor ops
    slot = torch.arange(budget, device=dev)
    first_ranks = slot.clamp_max(k - 1)  # depth 1: the beam is simply ranks 0 .. budget-1
    valid = [None if full else slot < k]
    scores = [logp[0, first_ranks] if full else torch.where(valid[0], logp[0, first_ranks], float("-inf"))]
    picks = []
    for d in range(1, depth_max):
        cand = (scores[-1][:, None] + logp[d][None, :]).flatten()
        ok = None if full else valid[-1][:, None].expand(budget, k).flatten()
        pick = _first(cand, ok, budget).sort().values  # back to rank-path order for the next depth
        scores.append(cand[pick])
        valid.append(None if full else ok[pick])
        picks.append(pick)
    all_scores = torch.stack(scores)
    steps = torch.stack(picks) if picks else slot.new_zeros(0, budget)
    parent_slot = torch.cat([slot.new_zeros(1, budget), steps // k])
    ranks = torch.cat([first_ranks[None], steps % k])
    real_all = None if full else torch.stack(valid)
    chosen = _first(all_scores.flatten(), None if full else real_all.flatten(), budget)
    depth0, local = chosen // budget, chosen % budget  # depth index (0-based) and beam slot
    node_of = torch.zeros(depth_max, budget, dtype=torch.long, device=dev)
    node_of[depth0, local] = torch.arange(1, budget + 1, device=dev)
    parents = torch.where(depth0 > 0, node_of[(depth0 - 1).clamp_min(0), parent_slot[depth0, local]], 0)
    if not full:
        real = real_all[depth0, local]
        parents = torch.where(real, parents, 0)
        depth0 = torch.where(real, depth0, 0)
    tokens = top_ids[depth0, ranks[depth0, local]]
    if not full:
        tokens = torch.where(real, tokens, top_ids[0, 0])
    # ancestors by pointer jumping: after j doublings the mask holds every ancestor closer than 2^(j+1)
    up = torch.cat([parents.new_zeros(1), parents])  # each node's parent; the root is its own
    eye = torch.eye(budget + 1, dtype=torch.bool, device=dev)
    mask = eye | eye[up]
    for _ in range(depth_max.bit_length() - 1):
        up = up[up]
        mask = mask | mask[up]
    return Proposal(tokens=tokens, parents=parents, depths=depth0 + 1, tree_mask=mask)


def tree_proposal(logits: Tensor, budget: int, kernel: bool = True) -> Proposal:
    """The best `budget`-node tree for per-depth draft `logits [L, V]` (the DDTree proposal; `kernel`:
    `EngineOptions.tree_kernel`)."""
    k = min(budget, logits.shape[-1])
    top_logp, top_ids = torch.log_softmax(logits.float(), -1).topk(k, dim=-1)
    return build_tree_device(top_logp, top_ids, budget, kernel)


def deepest_on_path(logits: Tensor, truth: Tensor, budget: int) -> Tensor:
    """`[R]` depth of the deepest node on `truth [R, L]` (0: none) in each of `R` DDTree trees of `budget` nodes over
    per-depth draft `logits [R, L, V]`: `tree_proposal` of every row at once, the datagen's teacher-forced tau of a
    tree (`DFlash.taus`) without a tree a position. Each depth's beam grows as `build_tree_device`'s sort-based loop
    grows it (same float64 scores, same stable sorts, so the same tie rule), batched over the rows; an entry is on
    the path when its token is the depth's truth and its parent entry is on the path. Needs `budget` <= the
    vocabulary (every beam slot a real prefix), as any real drafter has."""
    r, depth_max, vocab = logits.shape
    if budget > vocab:
        raise ValueError(f"deepest_on_path: a budget of {budget} nodes needs a vocabulary of at least that many, "
                         f"got {vocab}")
    top_logp, top_ids = torch.log_softmax(logits.float(), -1).topk(budget, dim=-1)
    logp = top_logp.double()
    rows = torch.arange(r, device=logits.device)[:, None]
    scores = [logp[:, 0]]  # [R, B] per depth, in rank-path order
    on = [top_ids[:, 0] == truth[:, :1]]
    for d in range(1, depth_max):
        cand = (scores[-1][:, :, None] + logp[:, d, None, :]).flatten(1)  # [R, B*K], flat index = rank path
        pick = torch.sort(cand, dim=1, descending=True, stable=True).indices[:, :budget].sort(dim=1).values
        scores.append(cand[rows, pick])
        parent, rank = pick // budget, pick % budget
        on.append(on[-1][rows, parent] & (top_ids[:, d][rows, rank] == truth[:, d : d + 1]))
    flat = torch.stack(scores, 1).flatten(1)  # [R, L*B]: depth-major, as build_tree_device's global pick
    chosen = torch.sort(flat, dim=1, descending=True, stable=True).indices[:, :budget]
    hit = torch.stack(on, 1).flatten(1)[rows, chosen]  # [R, B]: a chosen node on the path
    return torch.where(hit, chosen // budget + 1, 0).amax(1)
