"""DDTree trees are prefix-closed for any draft scores, and decoding with them stays lossless.

Confident drafts are where this breaks: a top-1 log-prob of exactly 0 gives a child the same
score as its parent, and in float32 any small depth penalty vanishes once scores are large.
"""
from __future__ import annotations

import pytest
import torch

import whiflash
from whiflash.decoding.verify import accept, check_tree
from whiflash.drafters.base import Proposal
from whiflash.drafters.trees import ancestor_mask, build_tree, build_tree_device, deepest_on_path, tree_proposal
from whiflash.drafters.dflash import DFlashDrafter
from whiflash.routers import ScriptedRouter


def _logits(kind: str, seed: int, depth: int = 7, vocab: int = 64) -> torch.Tensor:
    """Draft logits `[depth, vocab]` of one family: random, tied, huge-gap (top-1 log-prob 0) or bf16-rounded."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(depth, vocab, generator=g) * 2
    if kind == "tied":  # a few distinct values only: ties everywhere, between siblings and across depths
        x = torch.randint(0, 3, (depth, vocab), generator=g).float()
    elif kind.startswith("gap"):  # the top token `gap` nats ahead: log-prob exactly 0 in float32 from ~22 on
        x[:, 0] += float(kind[3:])
    elif kind == "bf16":
        x = (x * 4).bfloat16().float()
    elif kind == "neginf":  # masked vocabulary entries
        x[:, vocab // 2 :] = float("-inf")
    return x


KINDS = ["random", "tied", "gap25", "gap30", "gap40", "gap100", "bf16", "neginf"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("budget", [1, 6, 15, 40, 200])
def test_device_builder_is_prefix_closed_and_equals_the_heap(kind, budget):
    """Node for node (tokens, parents, depths, in order) the reference heap under the tie rule."""
    for seed in range(12):
        logits = _logits(kind, seed)
        k = min(budget, logits.shape[-1])
        top_logp, top_ids = torch.log_softmax(logits, -1).topk(k, -1)
        if kind == "bf16":
            top_logp = top_logp.bfloat16()  # scores arriving in bf16: ties after rounding
        tree = build_tree_device(top_logp, top_ids, budget)
        check_tree(tree)
        assert torch.equal(tree.tree_mask, ancestor_mask(tree.parents))
        tokens, parents, depths = build_tree(top_logp.tolist(), top_ids.tolist(), budget)
        n = len(tokens)
        assert n == min(budget, sum(k ** d for d in range(1, logits.shape[0] + 1)))
        assert (tree.tokens[:n].tolist(), tree.parents[:n].tolist(), tree.depths[:n].tolist()) == (tokens, parents, depths)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("budget", [1, 6, 15, 40])
def test_the_deepest_node_on_a_path_of_a_batch_of_trees_is_each_trees(kind, budget):
    """`deepest_on_path` (datagen's DDTree tau at every position at once) equals, row by row, the deepest node on
    the path in the reference heap's tree of that row, ties included; paths follow top-1, top-2 or random tokens."""
    g = torch.Generator().manual_seed(budget)
    logits = torch.stack([_logits(kind, seed) for seed in range(16)])  # [R, depth, vocab]
    ranked = logits.float().log_softmax(-1).topk(3, -1).indices
    pick = torch.randint(0, 4, logits.shape[:2], generator=g)  # 0-2: that rank's token, 3: any token
    truth = torch.where(pick < 3, ranked.gather(-1, pick.clamp_max(2)[..., None])[..., 0],
                        torch.randint(0, logits.shape[-1], logits.shape[:2], generator=g))
    expected = []
    for row, path in zip(logits, truth.tolist()):
        top_logp, top_ids = torch.log_softmax(row.float(), -1).topk(budget, -1)
        tokens, parents, depths = build_tree(top_logp.tolist(), top_ids.tolist(), budget)
        on = [True]
        for token, parent, depth in zip(tokens, parents, depths):
            on.append(on[parent] and token == path[depth - 1])
        expected.append(max((d for d, ok in zip(depths, on[1:]) if ok), default=0))
    assert deepest_on_path(logits, truth, budget).tolist() == expected
    assert len(set(expected)) > 1 or budget == 1  # paths of several depths
    with pytest.raises(ValueError, match="needs a vocabulary of at least"):
        deepest_on_path(logits, truth, logits.shape[-1] + 1)


def test_device_builder_stays_a_short_graph():
    """The builder is replayed as one CUDA graph a DDTree round, its kernels run back to back: with a vocabulary
    of at least the budget (no validity to track) it is ~6 kernels a depth (257 before, 2026-12-01)."""
    import collections

    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: collections.Counter = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    views = {"view", "unsqueeze", "select", "slice", "expand", "_unsafe_view", "alias"}
    with Count() as count:
        tree = tree_proposal(_logits("random", 0, depth=15, vocab=512), 32)
    check_tree(tree)
    kernels = sum(n for op, n in count.ops.items() if op not in views)
    assert kernels <= 110 and count.ops["sort"] <= 2 * 14 + 1, count.ops


def test_budget_above_the_candidates_pads_with_root_children():
    """3 depths over a 4-token vocabulary: 84 prefixes exist; a budget of 100 stays well formed."""
    top_logp, top_ids = torch.log_softmax(_logits("gap40", 0, depth=3, vocab=4), -1).topk(4, -1)
    tree = build_tree_device(top_logp, top_ids, 100)
    check_tree(tree)
    tokens, parents, depths = build_tree(top_logp.tolist(), top_ids.tolist(), 100)
    assert len(tokens) == 84 and tree.tokens[:84].tolist() == tokens and tree.parents[:84].tolist() == parents
    assert set(tree.parents[84:].tolist()) == {0} and set(tree.tokens[84:].tolist()) == {int(top_ids[0, 0])}


def test_a_malformed_tree_is_refused_before_it_is_walked():
    # node 2 claims depth 2 but hangs off the root: the walk would accept it as a two-token path
    bad = Proposal(tokens=torch.tensor([3, 3]), parents=torch.tensor([0, 0]), depths=torch.tensor([1, 2]),
                   tree_mask=ancestor_mask(torch.tensor([0, 0])))
    with pytest.raises(ValueError, match="depth 2"):
        check_tree(bad)
    with pytest.raises(ValueError, match="malformed tree"):
        accept(bad, torch.tensor([3, 9, 9]), check=True)  # EngineOptions.check_trees
    accept(bad, torch.tensor([3, 9, 9]))  # unchecked by default: the check costs a host read
    loose = Proposal(tokens=torch.tensor([3, 4]), parents=torch.tensor([0, 1]), depths=torch.tensor([1, 2]),
                     tree_mask=torch.eye(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="ancestor"):
        check_tree(loose)


def test_confident_drafts_build_well_formed_trees():
    """The drafts that broke the old builder: random logits whose top token leads by 25-40 nats."""
    for gap in (25, 30, 40):
        for seed in range(72):
            check_tree(tree_proposal(_logits(f"gap{gap}", seed, depth=15, vocab=1000), 32))


@pytest.fixture
def confident_draft(monkeypatch):
    """Every DFlash pass drafts the true next token `r` at every depth with a 40-nat lead (top-1
    log-prob exactly 0: a confident repeated-token draft), the other tokens at random.

    Right at depth 1 only (unless the target repeats `r`); its siblings at large negative scores
    carry chains of exactly tied descendants. `expect(sequence)` sets the reference continuation.
    """
    state: dict[str, list[int]] = {"seq": []}
    real = DFlashDrafter._block

    def block(self, ids, positions, start, mask):
        out = real(self, ids, positions, start, mask)
        pos = int(positions[0])
        seq = state["seq"]
        nxt = seq[pos + 1] if pos + 1 < len(seq) else 0
        g = torch.Generator().manual_seed(pos)
        crafted = torch.randn(out.shape, generator=g) * 2
        crafted[:, nxt] = crafted.max(-1).values + 40.0
        return crafted.to(out.device)

    monkeypatch.setattr(DFlashDrafter, "_block", block)
    return lambda seq: state.__setitem__("seq", list(seq))


@pytest.mark.parametrize("static", [False, True])
def test_confident_drafts_stay_lossless(worlds, confident_draft, tmp_path, static):
    """DDTree and the routed pairs that use it, on the eager and the fixed-shape path."""
    world = worlds["qwen3-random"]
    target, drafters = world.load()
    eagle = drafters["eagle3"]
    ddtree = whiflash.load_drafter("ddtree", world.dflash_dir, target, tree_budget=12)
    routed = [
        whiflash.RoutedDrafter("ddt-e3", ScriptedRouter([0, 0, 1]), eagle3=eagle, dflash=ddtree),
        whiflash.RoutedDrafter("df-ddt", ScriptedRouter([1, 1, 0]), dflash=ddtree),
        whiflash.OracleDrafter("ddt-e3", eagle3=eagle, dflash=ddtree),
    ]
    for m in (target, eagle, ddtree):
        m.static = static
    for prompt in ([1, 2, 3], [7, 8, 9, 10, 11, 12], [40, 3, 3, 17, 29, 30, 31, 2, 5, 5, 6]):
        ref, _ = whiflash.generate(target, None, prompt, 40)
        confident_draft(prompt + ref)
        for drafter in [ddtree, *routed]:
            out, stats = whiflash.generate(target, drafter, prompt, 40)
            assert out == ref, (drafter.kind, getattr(drafter, "pair", ""), prompt)
            assert stats.rounds < 40  # the crafted drafts are accepted, at least at depth 1


@pytest.mark.parametrize("kind", KINDS)
def test_every_tree_lies_in_the_candidate_table(kind):
    """The tree kernels rank only `candidates(budget, depth)`: the rank paths that can be among the first `budget`
    prefixes whatever the scores. The reference heap's nodes are always among them (ties, zero and -inf log-probs
    included), and the table is in tie order (depth, then rank path), so a tie on the score goes to the lower
    index."""
    from whiflash.drafters.trees import candidates

    assert len(candidates(15, 15)) == 321 and len(candidates(32, 15)) == 3576
    for budget in (1, 4, 15, 20):
        table = candidates(budget, 7)
        assert table == sorted(table, key=lambda p: (len(p), p)) and len(set(table)) == len(table)
        for seed in range(6):
            logits = _logits(kind, seed)
            top_logp, top_ids = torch.log_softmax(logits, -1).topk(budget, -1)
            tokens, parents, depths = build_tree(top_logp.tolist(), top_ids.tolist(), budget)
            rank = [top_ids[d - 1].tolist().index(t) for t, d in zip(tokens, depths)]
            paths = [()]  # [root, nodes]: each node's rank path is its parent's and its own rank
            for r, p in zip(rank, parents):
                paths.append(paths[p] + (r,))
            assert set(paths[1:]) <= set(table), (budget, seed)
