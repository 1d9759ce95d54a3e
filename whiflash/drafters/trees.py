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
with Triton two kernels and no depth loop. Which rank paths can be among the first `B` does not depend on the
scores (`candidates`: 321 at `B` = 15 and depth 15), so a table of them is made once; `_tree_rank` scores every
candidate and ranks it against all the others at once, and `_tree_links` reads the parents and the ancestor mask
off the table's prefixes (`scripts/bench_tree.py` times them against the tensor ops).
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


def candidates(budget: int, depth_max: int) -> list[tuple[int, ...]]:
    """Every rank path that can be among the first `budget` prefixes of a `depth_max`-deep draft with at least
    `budget` tokens a depth, whatever the scores, in tie order (depth, then rank path lexicographically).

    A prefix `(r_1 .. r_d)` ranks after every other prefix `(s_1 .. s_e)` with e <= d and s_i <= r_i: its score is
    at least as high (log-probs are sorted and <= 0, and rounded sums are monotone), and on a tie it is shallower
    or earlier in rank-path order. There are sum_e prod_(i<=e) (r_i + 1) - 1 of them, so only paths where that sum
    is at most `budget` can be among the first `budget`: 321 paths at budget 15 and depth 15, 3,576 at 32."""
    out: list[tuple[int, ...]] = []
    level = [((), 0, 1)]  # (path, sum of the products so far, product so far)
    for _ in range(depth_max):
        nxt = []
        for path, total, prod in level:  # parents in tie order, each one's children by rank: tie order again
            for r in range(budget):
                p = prod * (r + 1)
                if total + p > budget:
                    break
                nxt.append((path + (r,), total + p, p))
        out.extend(path for path, _, _ in nxt)
        level = nxt
    return out


_TABLES: dict[tuple[int, int, torch.device], tuple[Tensor, Tensor, Tensor]] = {}


def candidate_table(budget: int, depth_max: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """`candidates` on `device` as `(ranks [N, L], ancestors [N, L], depths [N])` int32: each path's top-k rank at
    every depth and the index of its prefix of every length (itself at its own depth), -1 past its depth. Made
    once per shape and device; the first call comes in a CUDA graph's warm-up, before its capture (a copy from
    the host could not be captured)."""
    key = (budget, depth_max, torch.device(device))
    if key not in _TABLES:
        paths = candidates(budget, depth_max)
        index = {path: i for i, path in enumerate(paths)}
        pad = [-1] * depth_max
        ranks = [list(path) + pad[len(path):] for path in paths]
        ancestors = [[index[path[: e + 1]] for e in range(len(path))] + pad[len(path):] for path in paths]
        as_tensor = lambda rows: torch.tensor(rows, dtype=torch.int32, device=device)  # noqa: E731
        _TABLES[key] = (as_tensor(ranks), as_tensor(ancestors), as_tensor([len(path) for path in paths]))
    return _TABLES[key]


if triton is not None:

    @triton.jit
    def _path_scores(LOGP, RANKS, n, ok, L, K, LP: tl.constexpr):
        # the scores of candidates `n`: every log-prob on their paths loaded at once (a [len(n), LP] tile, no load
        # waiting for the one before), then summed depth by depth as the reference heap sums them, so bit for bit
        # the same (a depth's column is picked out by a sum of it and zeros, which is exact); NaN (a broken draft)
        # and lanes past the table as -inf
        e = tl.arange(0, LP)
        r = tl.load(RANKS + n[:, None] * L + e[None, :], mask=ok[:, None] & (e[None, :] < L), other=-1)
        v = tl.load(LOGP + e[None, :] * K + r, mask=r >= 0, other=0.0)
        s = tl.zeros(n.shape, tl.float64)
        for j in tl.static_range(LP):
            s = s + tl.sum(tl.where(e[None, :] == j, v, 0.0), 1)
        return tl.where(ok & (s == s), s, float("-inf"))

    @triton.jit
    def _tree_rank(LOGP, IDS, RANKS, DEPTH, RANK_OF, NODE_CAND, TOKENS, DEPTHS, N, L, K, B,
                   BLK: tl.constexpr, CH: tl.constexpr, LP: tl.constexpr):
        # Each program ranks BLK candidates against all N under the tie rule (the table is in tie order, so a tie
        # on the score goes to the lower index) and writes the first B's tokens and depths at their ranks.
        n = tl.program_id(0) * BLK + tl.arange(0, BLK)
        live = n < N
        s = _path_scores(LOGP, RANKS, n, live, L, K, LP)
        rank = tl.zeros([BLK], tl.int32)
        for c0 in range(0, N, CH):
            m = c0 + tl.arange(0, CH)
            t = _path_scores(LOGP, RANKS, m, m < N, L, K, LP)
            tie = (t[None, :] == s[:, None]) & (m[None, :] < n[:, None])
            ahead = (m[None, :] < N) & ((t[None, :] > s[:, None]) | tie)
            rank += tl.sum(ahead.to(tl.int32), 1)
        tl.store(RANK_OF + n, rank, mask=live)
        chosen = live & (rank < B)
        d = tl.load(DEPTH + n, mask=live, other=1)
        last = tl.load(RANKS + n * L + d - 1, mask=live, other=0)
        tl.store(TOKENS + rank, tl.load(IDS + (d - 1) * K + last, mask=chosen, other=0), mask=chosen)
        tl.store(DEPTHS + rank, d.to(tl.int64), mask=chosen)
        tl.store(NODE_CAND + rank, n, mask=chosen)

    @triton.jit
    def _tree_links(ANC, DEPTH, RANK_OF, NODE_CAND, PARENTS, MASK, L, B, NP: tl.constexpr):
        # Parents and the ancestor mask over [root, nodes] from the table's prefixes: node b is an ancestor of
        # node a (or a itself) when a's prefix at b's depth is b; the root is every node's.
        a = tl.arange(0, NP)  # 0: the root, i: node i (rank i - 1)
        node = (a >= 1) & (a <= B)
        c = tl.load(NODE_CAND + a - 1, mask=node, other=0)
        d = tl.load(DEPTH + c, mask=node, other=0)
        up = tl.load(ANC + c * L + d - 2, mask=node & (d > 1), other=0)
        parent = tl.where(d > 1, tl.load(RANK_OF + up, mask=node & (d > 1), other=0) + 1, 0)
        tl.store(PARENTS + a - 1, parent.to(tl.int64), mask=node)
        rows, cols = a[:, None], a[None, :]
        prefix = tl.load(ANC + c[:, None] * L + d[None, :] - 1,
                         mask=node[:, None] & node[None, :] & (d[None, :] <= d[:, None]), other=-1)
        seen = (cols == 0) | (rows == cols) | (node[:, None] & node[None, :] & (prefix == c[None, :]))
        tl.store(MASK + rows * (B + 1) + cols, seen.to(tl.int8), mask=(rows <= B) & (cols <= B))

    @triton.jit
    def _top_logp(X, LOGP, IDS, V, K, BV: tl.constexpr):
        # One program a depth row: the row's log-softmax normaliser, then its K largest logits picked one at a time
        # (the largest left, ties to the lower token id), written as log-probs in descending order. The row stays
        # in registers, so a pick costs one reduction over it: each logit and its id packed into one int64 key
        # whose order is (logit, then the lower id) -- the float's bits made order-preserving as a signed integer,
        # then the id's complement below them. NaN reads as -inf (a broken draft ranks last, as `_path_scores`
        # treats it); lanes past the vocabulary hold the smallest key and are never picked.
        row = tl.program_id(0)
        v = tl.arange(0, BV)
        real = v < V
        x = tl.load(X + row * V + v, mask=real, other=float("-inf")).to(tl.float32)
        x = tl.where(x == x, tl.where(x == 0.0, 0.0, x), float("-inf"))  # -0.0 keys as +0.0: they tie
        m = tl.max(x, 0)
        lse = m + tl.log(tl.sum(tl.where(real, tl.exp(x - m), 0.0), 0))
        bits = x.to(tl.int32, bitcast=True)
        ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)
        floor = (tl.zeros([BV], tl.int64) - 2147483648) << 32  # below the key of every real logit, -inf's included
        key = tl.where(real, (ordered << 32) | (BV - 1 - v).to(tl.int64), floor)
        for j in range(0, K):
            best = tl.max(key, 0)
            high = (best >> 32).to(tl.int32)  # the logit's ordered bits, back to the float's
            value = tl.where(high >= 0, high, high ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
            at = BV - 1 - (best - ((best >> 32) << 32))
            tl.store(LOGP + row * K + j, (value - lse).to(tl.float64))
            tl.store(IDS + row * K + j, at)
            key = tl.where(v == at, floor, key)


KERNEL_MAX_BUDGET = 32
"""The largest budget the tree kernels build (larger ones take the tensor ops): at depth 15 the candidate table
holds 321 paths at budget 15, 3,576 at 32 and 29,934 at 64, and every candidate is ranked against all of them."""


TOPK_KERNEL_MAX_VOCAB = 16384
"""The largest draft vocabulary `top_logp` picks from in one kernel (the row is held in one program's registers);
larger ones (Qwen3's 151,936) take log-softmax and top-k as tensor ops."""


def top_logp(logits: Tensor, k: int, kernel: bool = True) -> tuple[Tensor, Tensor]:
    """`(top_logp [L, k] float64, top_ids [L, k])`: each row's `k` most probable tokens under its softmax, in descending
    order. With the kernel (Triton on a GPU, a vocabulary of at most `TOPK_KERNEL_MAX_VOCAB`, `k` at most
    `KERNEL_MAX_BUDGET`) one launch, ties to the lower token id; else `log_softmax` and `topk` (about 50 us of a
    DDTree round's tree on an H100 at a vocabulary of 8,192, against one launch of the K picks)."""
    depth_max, vocab = logits.shape
    dev = logits.device
    if not (kernel and triton is not None and (dev.type == "cuda" or INTERPRET) and vocab <= TOPK_KERNEL_MAX_VOCAB
            and k <= KERNEL_MAX_BUDGET):
        values, ids = torch.log_softmax(logits.float(), -1).topk(k, dim=-1)
        return values.double(), ids
    logp = torch.empty(depth_max, k, dtype=torch.float64, device=dev)
    ids = torch.empty(depth_max, k, dtype=torch.long, device=dev)
    _top_logp[(depth_max,)](logits.contiguous(), logp, ids, vocab, k, BV=triton.next_power_of_2(vocab),
                            num_warps=8)
    return logp, ids


def _tree_by_kernel(logp: Tensor, top_ids: Tensor, budget: int) -> Proposal:
    """The tree of a float64 `logp [L, K]` and its token ids (K >= budget) in two kernel launches: every candidate
    path (`candidate_table`) scored and ranked at once (`_tree_rank`), then parents and the ancestor mask
    (`_tree_links`). No depth waits for the one before it."""
    depth_max, k = logp.shape
    dev = logp.device
    ranks, ancestors, depths_of = candidate_table(budget, depth_max, dev)
    n = ranks.shape[0]
    new = lambda *shape, dtype=torch.long: torch.empty(*shape, dtype=dtype, device=dev)  # noqa: E731
    tokens, parents, depths = new(budget), new(budget), new(budget)
    rank_of, node_cand = new(n, dtype=torch.int32), new(budget, dtype=torch.int32)
    mask = new(budget + 1, budget + 1, dtype=torch.int8)
    logp, top_ids = logp.contiguous(), top_ids.contiguous()
    blk = 64  # candidates a program ranks, each against all n, CH at a time
    _tree_rank[(triton.cdiv(n, blk),)](logp, top_ids, ranks, depths_of, rank_of, node_cand, tokens, depths, n,
                                        depth_max, k, budget, BLK=blk, CH=128,
                                        LP=max(16, triton.next_power_of_2(depth_max)), num_warps=4)
    _tree_links[(1,)](ancestors, depths_of, rank_of, node_cand, parents, mask, depth_max, budget,
                      NP=max(16, triton.next_power_of_2(budget + 1)), num_warps=4)
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
        return _tree_by_kernel(logp, top_ids, budget)  # two launches instead of ~100 tensor ops
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
    logp, ids = top_logp(logits, min(budget, logits.shape[-1]), kernel)
    return build_tree_device(logp, ids, budget, kernel)


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
