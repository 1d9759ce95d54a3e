"""Routed decoding: lossless for every router and pair; Lazy Catch-up and KV-only prefill are exact."""
from __future__ import annotations

import random
import sys

import pytest
import torch

import whiflash
from whiflash.decoding.routed import OracleDrafter, RoutedDrafter
from whiflash.router import NeuralRouter
from whiflash.router_context import CONTEXT_FEATURES, NO_SLOT, context_from_rows
from whiflash.routers import (AlternatingRouter, EntropyRouter, FixedRouter, NeuralPolicy,
                              ScriptedRouter, decides_in_pass, entropy)

PROMPTS = [[7, 8, 9, 10, 11, 12], [40, 3, 3, 17, 29, 30, 31, 2, 5, 5, 6]]


@pytest.fixture(scope="module", params=["qwen3-mixed", "llama-mixed"])
def world(request, worlds):
    target, drafters = worlds[request.param].load()
    return target, drafters["eagle3"], drafters["ddtree"]


@pytest.fixture(scope="module", params=["qwen3-mixed", "qwen3-random"])
def attending_world(request, worlds):
    """A crafted world (long acceptances) and a random one: crafted drafters have zeroed attention
    outputs, so only the random one makes a proposal depend on the drafter's cached K/V."""
    target, drafters = worlds[request.param].load()
    return target, drafters["eagle3"], drafters["ddtree"]


def routers(hidden: int) -> dict[str, object]:
    torch.manual_seed(0)
    return {
        "alternating": AlternatingRouter(),
        "alternating3": AlternatingRouter(period=3),
        "entropy": EntropyRouter(threshold=1.0),
        "fixed0": FixedRouter(0),
        "fixed1": FixedRouter(1),
        "neural": NeuralPolicy(NeuralRouter(hidden, mlp_dim=16), threshold=0.0),
        "neural-context": NeuralPolicy(NeuralRouter(hidden, mlp_dim=16, context=list(CONTEXT_FEATURES)), threshold=0.0),
    }


@pytest.mark.parametrize("pair", whiflash.PAIRS)
def test_every_router_and_pair_is_lossless(world, pair):
    target, eagle, ddtree = world
    for name, router in routers(target.config.hidden_size).items():
        if name.startswith("neural"):
            router.router.drafters, router.router.tree_budget = pair, 12
        for lazy in (True, False):
            drafter = RoutedDrafter(pair, router, eagle3=eagle if "e3" in pair else None, dflash=ddtree,
                                    lazy_catchup=lazy)
            for prompt in PROMPTS:
                ref, _ = whiflash.generate(target, None, prompt, 36)
                out, stats = whiflash.generate(target, drafter, prompt, 36)
                assert out == ref, (pair, name, lazy, prompt)
                assert len(stats.slots) == stats.rounds and stats.method == f"whiflash[{pair}]"


def _proposals(monkeypatch, target, drafter, prompt, n):
    seen = []
    real = RoutedDrafter.propose

    def spy(self, pending, pos, slot=0):
        p = real(self, pending, pos, slot)
        seen.append((slot, p.tokens.tolist(), None if p.parents is None else p.parents.tolist()))
        return p

    monkeypatch.setattr(RoutedDrafter, "propose", spy)
    out, stats = whiflash.generate(target, drafter, prompt, n)
    monkeypatch.setattr(RoutedDrafter, "propose", real)
    return out, seen, stats


@pytest.mark.parametrize("pair", ["df-e3", "ddt-e3"])
def test_lazy_kv_only_catch_up_proposes_exactly_what_eager_full_updates_propose(attending_world, pair, monkeypatch):
    """Any switch pattern: lazy catch-up + KV-only prefill == eager per-round full updates (fp32, CPU)."""
    target, eagle, ddtree = attending_world
    rng = random.Random(0)
    for trial in range(4):
        pattern = [rng.randint(0, 1) for _ in range(rng.randint(2, 9))]
        runs = []
        for lazy in (True, False):
            eagle.full_prefill = not lazy
            drafter = RoutedDrafter(pair, ScriptedRouter(pattern), eagle3=eagle if "e3" in pair else None, dflash=ddtree, lazy_catchup=lazy)
            runs.append(_proposals(monkeypatch, target, drafter, PROMPTS[trial % 2], 40))
        eagle.full_prefill = False
        (out_l, seen_l, stats_l), (out_e, seen_e, stats_e) = runs
        assert out_l == out_e and seen_l == seen_e, pattern
        assert sum(stats_l.switches) > 0 or len(set(pattern)) == 1
        assert max(stats_l.backlogs) > 1 and max(stats_e.backlogs) == 0  # lazy really batched a backlog


def test_kv_only_prefill_writes_the_same_cache_as_a_full_prefill(attending_world):
    target, eagle, _ = attending_world
    caches = []
    for full in (False, True):
        eagle.full_prefill = full
        whiflash.generate(target, eagle, PROMPTS[1], 20)
        caches.append((eagle.cache.k[0, :, : eagle.kv_len].clone(), eagle.cache.v[0, :, : eagle.kv_len].clone(), eagle._seq.last))
    eagle.full_prefill = False
    (k0, v0, last0), (k1, v1, last1) = caches
    torch.testing.assert_close(k0, k1, rtol=0, atol=0)
    torch.testing.assert_close(v0, v1, rtol=0, atol=0)
    torch.testing.assert_close(last0[1], last1[1], rtol=1e-6, atol=1e-6)


def test_backlog_is_what_accumulated_while_inactive(world):
    target, eagle, ddtree = world
    drafter = RoutedDrafter("df-e3", AlternatingRouter(period=2), eagle3=eagle, dflash=ddtree)
    _, stats = whiflash.generate(target, drafter, PROMPTS[0], 40)
    assert stats.slots[:6] == [0, 0, 1, 1, 0, 0]  # the prefill decision is the router's first output
    # a slot's backlog = taus of the rounds since it last drafted (its own last round included)
    last_seen: dict[int, int] = {}
    for r, slot in enumerate(stats.slots):
        # a slot's first round: the rows since the prefill, which took the prompt into every member
        assert stats.backlogs[r] == sum(stats.taus[last_seen.get(slot, 0):r])
        last_seen[slot] = r
    assert stats.backlogs[0] == 0 and 1 in stats.slots[:4] and 0 < stats.switch_rate <= 1


def test_every_drafter_takes_in_the_prompt_during_the_prefill(world, monkeypatch):
    """The prompt's pass is the prefill's (upstream's decode time starts after the drafter's one-time pass over
    the prompt): a single drafter takes in all of the prompt's rows before the first round and then only each
    round's commit; an oracle's first round, which both members draft, catches up nothing."""
    target, eagle, ddtree = world
    prompt = PROMPTS[1] * 3
    for drafter in (eagle, ddtree):
        sizes: list[int] = []
        real = drafter.catch_up
        callers: list[str] = []
        monkeypatch.setattr(drafter, "catch_up", lambda d=drafter, f=real: (
            sizes.append(d.backlog_len), callers.append(sys._getframe(1).f_code.co_name), f())[2])
        _, stats = whiflash.generate(target, drafter, prompt, 24)
        assert (sizes[0], callers[0]) == (len(prompt), "prefill"), drafter.name
        assert sizes[1:] == stats.taus[:len(sizes) - 1] and "prefill" not in callers[1:]
        monkeypatch.undo()
    _, stats = whiflash.generate(target, OracleDrafter("df-e3", eagle3=eagle, dflash=ddtree), prompt, 24)
    assert stats.backlogs[0] == 0 and stats.backlogs[1:] == stats.taus[:-1]


def test_an_oracle_following_a_policy_walks_the_routed_drafters_path(world):
    """datagen's `--path router`: the rows' path is the routed decode's, round for round, both taus logged."""
    target, eagle, ddtree = world
    pattern = [1, 1, 0, 1, 0, 0, 1]
    for prompt in PROMPTS:
        routed = RoutedDrafter("df-e3", ScriptedRouter(pattern), eagle3=eagle, dflash=ddtree)
        out_r, stats_r = whiflash.generate(target, routed, prompt, 40)
        oracle = OracleDrafter("df-e3", eagle3=eagle, dflash=ddtree)
        oracle.policy = ScriptedRouter(pattern)
        records = []
        out_o, stats_o = whiflash.generate(target, oracle, prompt, 40, on_round=records.append)
        assert out_o == out_r
        assert [r.slot for r in records] == stats_r.slots  # the slot each round advanced with
        assert [r.slot_taus[r.slot] for r in records] == stats_r.taus
    oracle.follow = 0
    with pytest.raises(ValueError, match="follows a policy or a slot, not both"):
        whiflash.generate(target, oracle, PROMPTS[0], 4)


def test_oracle_advances_with_the_longer_acceptance(world):
    target, eagle, ddtree = world
    drafter = OracleDrafter("df-e3", eagle3=eagle, dflash=ddtree)
    records = []
    _, stats = whiflash.generate(target, drafter, PROMPTS[1], 40, on_round=records.append)
    assert [r.slot_taus for r in records] == stats.slot_taus and len(stats.slot_taus) == stats.rounds
    assert [r.tau for r in records] == stats.taus and stats.method == "oracle[df-e3]"
    for tau, (t0, t1), slot in zip(stats.taus, stats.slot_taus, stats.slots):
        assert tau == max(t0, t1) and slot == (0 if t0 > t1 else 1)
    # each logged tau is that slot's own: a standalone run from the round's state accepts as much
    out, _ = whiflash.generate(target, None, PROMPTS[1], 40)
    alone = [RoutedDrafter("df-e3", FixedRouter(slot), eagle3=eagle, dflash=ddtree) for slot in (0, 1)]
    done = 0
    for r, logged in enumerate(stats.slot_taus[:6]):
        state = PROMPTS[1] + out[:done]  # committed tokens; the round's pending token is the next output
        assert logged == tuple(whiflash.generate(target, d, state, 40 - done)[1].taus[0] for d in alone), r
        done += stats.taus[r]
    assert any(t0 != t1 for t0, t1 in stats.slot_taus[:6])  # slots that differ: a swap would show
    with pytest.raises(ValueError, match="greedy"):
        whiflash.generate(target, drafter, PROMPTS[1], 5, temperature=0.7)


def test_utility_oracle_advances_with_tau_per_round_time(world):
    """The latency-aware oracle: the round advances with the slot of the higher tau / round time, and
    the committed path is that slot's, so the output is still the target's own."""
    target, eagle, ddtree = world
    ref, _ = whiflash.generate(target, None, PROMPTS[1], 40)
    for times in ((2.0, 1.0), (1.0, 3.0)):
        drafter = OracleDrafter("df-e3", eagle3=eagle, dflash=ddtree, round_times=times)
        out, stats = whiflash.generate(target, drafter, PROMPTS[1], 40)
        assert out == ref and stats.method == "utility-oracle[df-e3]"
        for tau, (t0, t1), slot in zip(stats.taus, stats.slot_taus, stats.slots):
            assert slot == (0 if t0 / times[0] > t1 / times[1] else 1) and tau == (t0, t1)[slot]
    cheap0 = OracleDrafter("df-e3", eagle3=eagle, dflash=ddtree, round_times=(1.0, 1e6))  # slot 1 never pays off
    out, stats = whiflash.generate(target, cheap0, PROMPTS[1], 40)
    assert out == ref and set(stats.slots) == {0} and stats.taus == [t0 for t0, _ in stats.slot_taus]
    for bad in ((1.0,), (0.0, 1.0), (1.0, float("nan"))):
        with pytest.raises(ValueError, match="round_times"):
            OracleDrafter("df-e3", eagle3=eagle, dflash=ddtree, round_times=bad)


def test_entropy_router_and_mismatched_neural_router(world):
    target, eagle, ddtree = world
    logits = torch.tensor([10.0, 0.0, 0.0])
    assert EntropyRouter(0.2)(torch.zeros(4), logits) == 0 and EntropyRouter(0.0001)(torch.zeros(4), logits) == 1
    assert abs(float(entropy(torch.zeros(8))) - torch.log(torch.tensor(8.0)).item()) < 1e-6
    h = target.config.hidden_size
    with pytest.raises(ValueError, match="trained for pair 'df-e3'.*this run uses 'ddt-e3'"):
        RoutedDrafter("ddt-e3", NeuralPolicy(NeuralRouter(h, drafters="df-e3")), eagle3=eagle, dflash=ddtree)
    wrong = RoutedDrafter("df-e3", NeuralPolicy(NeuralRouter(h + 1)), eagle3=eagle, dflash=ddtree)
    with pytest.raises(ValueError, match=f"hidden size {h + 1}.*hidden size {h}"):
        whiflash.generate(target, wrong, PROMPTS[0], 5)
    with pytest.raises(ValueError, match="expected one of"):
        RoutedDrafter("e3-e3", FixedRouter(0), eagle3=eagle, dflash=ddtree)


def test_one_host_read_per_round(world, monkeypatch):
    """Every method, routed ones included, reads from the device once per round (plus once after
    prefill): the router's decision travels with the acceptance count. Reads PyTorch makes inside an
    operation count too (indexing with a 0-dim tensor reads it as an int; boolean masks read a count):
    they are seen at the dispatcher."""
    from torch.utils._python_dispatch import TorchDispatchMode


    class HiddenReads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten._local_scalar_dense, torch.ops.aten.nonzero,
                                       torch.ops.aten.masked_select, torch.ops.aten.is_nonzero):
                reads.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    target, eagle, ddtree = world
    # the suite's tree check reads on purpose
    monkeypatch.setattr(target, "engine", target.engine.with_(check_trees=False))
    reads = []
    for name in ("tolist", "item", "__int__", "__index__", "__bool__", "__float__", "nonzero", "cpu", "numpy"):
        real = getattr(torch.Tensor, name)

        def spy(self, *a, _real=real, _name=name, **k):
            reads.append(_name)
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, spy)
    context = NeuralPolicy(NeuralRouter(target.config.hidden_size, mlp_dim=8, context=list(CONTEXT_FEATURES)), 0.0)
    history = NeuralPolicy(NeuralRouter(target.config.hidden_size, mlp_dim=8, history=2, drafters="ddt-e3"), 0.0)
    drafters = [None, eagle, ddtree, RoutedDrafter("ddt-e3", EntropyRouter(1.0), eagle3=eagle, dflash=ddtree),
                RoutedDrafter("df-e3", context, eagle3=eagle, dflash=ddtree),
                RoutedDrafter("ddt-e3", history, eagle3=eagle, dflash=ddtree),  # its states kept with no read
                RoutedDrafter("df-e3", ScriptedRouter([1]), tau_rule=(3, 1), eagle3=eagle, dflash=ddtree),
                RoutedDrafter("df-e3", FixedRouter(0), stick_tau=1, eagle3=eagle, dflash=ddtree),  # kept: host's 0
                OracleDrafter("df-e3", eagle3=eagle, dflash=ddtree),
                OracleDrafter("df-e3", eagle3=eagle, dflash=ddtree, round_times=(2.0, 1.0))]
    for drafter in drafters:
        reads.clear()
        with HiddenReads():
            _, stats = whiflash.generate(target, drafter, PROMPTS[1], 30)
        assert reads == ["tolist"] * (stats.rounds + 1), (drafter, reads[:10])


def test_a_slot_the_host_knows_is_an_int_the_loop_does_not_read(world):
    """`Drafter.route` may return a plain int where the host knows the slot (here the prefill's): the loop drafts
    with it without reading anything for it, and the output stays AR's."""
    target, eagle, ddtree = world

    class HostFirst(RoutedDrafter):
        def route(self, hidden, logits, tau=None, decided=None, path=None):
            return 1 if tau is None else super().route(hidden, logits, tau, decided, path)

    for prompt in PROMPTS:
        ref, _ = whiflash.generate(target, None, prompt, 30)
        drafter = HostFirst("df-e3", FixedRouter(0), eagle3=eagle, dflash=ddtree)
        out, stats = whiflash.generate(target, drafter, prompt, 30)
        assert out == ref
        assert stats.slots[0] == 1 and set(stats.slots[1:]) == {0}


def test_a_round_gathers_the_decision_row_only_for_a_drafter_that_routes_or_a_callback(world):
    """Every gather a round launches outside a captured pass is host time: the decision point's hidden state
    and logits (two `index_select`s) are gathered for a routed drafter asked after the pass and for an
    `on_round` callback, never for a drafter that does not route (nor the oracle, which advances instead)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Gathers(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket is torch.ops.aten.index_select:
                seen.append(1)
            return func(*args, **(kwargs or {}))

    def per_round(drafter, callback=None):
        seen.clear()
        with Gathers():
            _, stats = whiflash.generate(target, drafter, PROMPTS[1], 30, on_round=callback)
        return len(seen) / stats.rounds

    target, eagle, ddtree = world
    seen: list[int] = []
    after = NeuralPolicy(NeuralRouter(target.config.hidden_size, mlp_dim=8, context=["prev_slot"]), 1e9)  # slot 1
    routed = RoutedDrafter("df-e3", after, eagle3=eagle, dflash=ddtree)
    assert per_round(None) == per_round(eagle) == 1.0  # the next token only (EAGLE-3 reads its taps as a view)
    assert per_round(None, lambda record: None) == 3.0
    for drafter in (eagle, ddtree, OracleDrafter("df-e3", eagle3=eagle, dflash=ddtree)):
        assert per_round(drafter, lambda record: None) == per_round(drafter) + 2.0, drafter.name
    # pinned to EAGLE-3's slot, the routed drafter drafts as EAGLE-3 does; beyond it, the decision row (two
    # gathers) and EAGLE-3's own layers out of the pair's union, which stacks slot 0's layers first
    assert routed.tap_layers == (*ddtree.tap_layers, *(t for t in eagle.tap_layers if t not in ddtree.tap_layers))
    assert per_round(routed) - per_round(eagle) == 3.0
    # deciding inside the verify pass, a policy's decision is one gather of the pass's decisions instead of two
    inside = RoutedDrafter("df-e3", FixedRouter(0), eagle3=eagle, dflash=ddtree)
    outside = RoutedDrafter("df-e3", NeuralPolicy(after.router, -1e9), eagle3=eagle, dflash=ddtree)  # slot 0
    assert per_round(outside) - per_round(inside) == 1.0
    # a tau rule reads the round's tau alone: the same rounds with the decision row gathered cost two gathers more

    class Reading(RoutedDrafter):
        reads_state = True

    ruled = RoutedDrafter("df-e3", ScriptedRouter([1]), tau_rule=(3, 1), eagle3=eagle, dflash=ddtree)
    reading = Reading("df-e3", ScriptedRouter([1]), tau_rule=(3, 1), eagle3=eagle, dflash=ddtree)
    assert per_round(reading) - per_round(ruled) == 2.0


def test_pairs_refuse_members_and_options_that_do_not_apply(world):
    target, eagle, ddtree = world
    with pytest.raises(ValueError, match="df-ddt takes no EAGLE-3"):
        RoutedDrafter("df-ddt", FixedRouter(0), eagle3=eagle, dflash=ddtree)
    with pytest.raises(ValueError, match="df-e3 needs an EAGLE-3"):
        OracleDrafter("df-e3", dflash=ddtree)
    with pytest.raises(ValueError, match="no DDTree slot, so tree_budget=9"):
        RoutedDrafter("df-e3", FixedRouter(0), eagle3=eagle, dflash=ddtree, tree_budget=9)
    with pytest.raises(ValueError, match="dflash= needs a DFlash"):
        RoutedDrafter("ddt-e3", FixedRouter(0), eagle3=eagle, dflash=eagle)
    with pytest.raises(ValueError, match="drafts chains only"):
        eagle.draft(torch.tensor([1]), 0, tree_budget=4)
    assert OracleDrafter("ddt-e3", eagle3=eagle, dflash=ddtree, tree_budget=9).max_nodes == 9 + eagle.num_steps


def test_a_context_router_sees_the_round_it_follows(world):
    """Each decision of a router with context features reads the entropy of the logits it is given and the
    slot and tau of the round just verified (none before the first), the values datagen rows give it."""
    target, eagle, ddtree = world
    router = NeuralRouter(target.config.hidden_size, mlp_dim=8, context=list(CONTEXT_FEATURES))
    policy = NeuralPolicy(router, threshold=0.0)
    seen = []
    real = policy.score

    def spy(hidden, context=None):  # the router's own score, then +-1 in turn, so both slots draft
        seen.append(context.reshape(-1).tolist())
        return real(hidden, context) * 0 + (1.0 if len(seen) % 2 else -1.0)

    policy.score = spy
    drafter = RoutedDrafter("df-e3", policy, eagle3=eagle, dflash=ddtree)
    for prompt in PROMPTS:
        seen.clear()
        _, stats = whiflash.generate(target, drafter, prompt, 30)
        assert len(seen) == stats.rounds + 1  # after the prefill and after every round
        assert seen[0][1:] == [NO_SLOT, 0.0]
        for r in range(stats.rounds):
            assert seen[r + 1][1:] == [float(stats.slots[r]), float(stats.taus[r])]
        assert all(x[0] >= 0 for x in seen) and set(stats.slots) == {0, 1}


def test_context_from_rows_follows_each_prompt_in_round_order():
    import numpy as np

    # two prompts, rows shuffled; prompt 1 lacks round 1, so its round 2 has no previous round
    prompt = np.array([1, 0, 0, 1, 0])
    rnd = np.array([2, 1, 0, 0, 2])
    ent = np.array([0.5, 0.25, 1.0, 2.0, 0.0], dtype=np.float32)
    tau_0, tau_1 = np.array([9, 3, 4, 5, 6]), np.array([1, 7, 2, 8, 1])
    active = np.array([0, 1, 0, 1, 0])
    ctx = context_from_rows(CONTEXT_FEATURES, prompt, rnd, ent, tau_0, tau_1, active)
    assert ctx.dtype == np.float32 and ctx.shape == (5, 3)
    assert ctx[:, 0].tolist() == ent.tolist()
    assert ctx[2].tolist()[1:] == [NO_SLOT, 0] and ctx[3].tolist()[1:] == [NO_SLOT, 0] and ctx[0].tolist()[1:] == [NO_SLOT, 0]
    assert ctx[1].tolist()[1:] == [0, 4]  # round 0 of prompt 0: slot 0, tau_0 = 4
    assert ctx[4].tolist()[1:] == [1, 7]  # round 1 of prompt 0: slot 1, tau_1 = 7
    assert context_from_rows(["prev_tau"], prompt, rnd, ent, tau_0, tau_1, active).shape == (5, 1)
    with pytest.raises(ValueError, match="distinct names"):
        NeuralRouter(4, context=["entropy", "entropy"])
    with pytest.raises(ValueError, match="context of shape"):
        NeuralRouter(4, context=["entropy"])(torch.zeros(2, 4))


def test_stick_tau_keeps_slot_0_without_asking_the_router(world):
    """`RoutedDrafter(stick_tau=K)`: a round after two slot-0 rounds, the earlier of which accepted >= K tokens,
    drafts with slot 0 and the policy is not called for it; every other decision is the policy's; the output
    stays AR's; the replay's `stick` makes the same choices from the same taus."""
    import numpy as np

    from whiflash.speed_oracle import stick

    target, eagle, ddtree = world
    calls = []

    class Counting(ScriptedRouter):
        def __call__(self, hidden, logits):
            calls.append(1)
            return super().__call__(hidden, logits)

    with pytest.raises(ValueError, match="stick_tau: expected an integer >= 1"):
        RoutedDrafter("df-e3", FixedRouter(0), stick_tau=0, eagle3=eagle, dflash=ddtree)
    policy = Counting([0, 0, 0, 1])  # mostly slot 0, with switches
    for prompt in PROMPTS:
        ref, _ = whiflash.generate(target, None, prompt, 40)
        drafter = RoutedDrafter("df-e3", policy, stick_tau=2, eagle3=eagle, dflash=ddtree)
        calls.clear()
        out, stats = whiflash.generate(target, drafter, prompt, 40)
        assert out == ref
        slots, taus = stats.slots, stats.taus
        # decision r (r = rounds: the one after the last round, which no round uses) follows the rule
        rule = [r for r in range(2, stats.rounds + 1) if slots[r - 1] == 0 and slots[r - 2] == 0 and taus[r - 2] >= 2]
        stuck = [r for r in rule if r < stats.rounds]
        assert stuck and all(slots[r] == 0 for r in stuck)
        assert len(calls) == stats.rounds + 1 - len(rule)  # after the prefill and every round, but the rule's
        # the replay: the policy's own choices on the rounds it decided, the rule on the others
        asked = np.array([s == 0 for s in slots])
        replayed, routed = stick(asked, np.array(taus), np.zeros(len(taus)), 2)
        assert replayed.tolist() == asked.tolist() and (~routed).nonzero()[0].tolist() == stuck


def test_stick_tau_verifies_the_rounds_it_keeps_without_the_policy(world):
    """With a policy that decides inside the verify pass, a pass whose next round `stick_tau` keeps on slot 0 runs
    without it (the drafter alone's pass: no decisions computed, no row gathered), and its decision is a plain int
    (known on the host: no op dispatched, nothing read back); every other round's pass decides on the device; the
    output stays AR's."""
    target, eagle, ddtree = world
    passes = []

    class Counting(FixedRouter):
        def rows(self, hidden, logits):
            passes.append(1)
            return super().rows(hidden, logits)

    kept = 0
    for prompt in PROMPTS:
        ref, _ = whiflash.generate(target, None, prompt, 40)
        drafter = RoutedDrafter("df-e3", Counting(0), stick_tau=2, eagle3=eagle, dflash=ddtree)
        on_host = []
        asked = drafter.route

        def spied(*args, **kwargs):
            slot = asked(*args, **kwargs)
            on_host.append(isinstance(slot, int))
            return slot

        drafter.route = spied
        passes.clear()
        out, stats = whiflash.generate(target, drafter, prompt, 40)
        assert out == ref
        slots, taus = stats.slots, stats.taus
        # round q's pass decides round q + 1 (the prefill decides round 0, outside any verify pass)
        stuck = [r for r in range(2, stats.rounds + 1) if slots[r - 1] == 0 and slots[r - 2] == 0 and taus[r - 2] >= 2]
        assert len(passes) == stats.rounds - len(stuck)
        assert sum(on_host) == len(stuck)
        kept += len(stuck)
    assert kept  # the rule kept rounds: the count above is not the trivial one


def test_tau_rule_picks_every_round_after_the_first_from_the_round_before(world):
    """`RoutedDrafter(tau_rule=(ENTER, LEAVE))`: the policy picks the first round's slot (it is asked once a
    sequence); after a slot-1 round of tau >= ENTER the next drafts with slot 0, after a slot-0 round of tau <= LEAVE
    with slot 1, else with the same slot; the output stays AR's; the replay's `ruled` makes the same choices from
    the same taus."""
    import numpy as np

    from whiflash.speed_oracle import ruled

    target, eagle, ddtree = world
    for bad in ((2, 2), (0, -1), "5", (3.0, 1)):
        with pytest.raises(ValueError, match="tau_rule: expected ENTER,LEAVE"):
            RoutedDrafter("df-e3", FixedRouter(0), tau_rule=bad, eagle3=eagle, dflash=ddtree)
    with pytest.raises(ValueError, match="give one of them"):
        RoutedDrafter("df-e3", FixedRouter(0), tau_rule=(3, 1), stick_tau=2, eagle3=eagle, dflash=ddtree)
    calls = []

    class Counting(ScriptedRouter):
        def __call__(self, hidden, logits):
            calls.append(1)
            return super().__call__(hidden, logits)

    switches = 0
    for prompt in PROMPTS:
        ref, _ = whiflash.generate(target, None, prompt, 40)
        for first, (enter, leave) in ((1, (2, 1)), (0, (4, 2))):
            drafter = RoutedDrafter("df-e3", Counting([first]), tau_rule=f"{enter},{leave}", eagle3=eagle,
                                    dflash=ddtree)
            assert drafter.row_policy is None and not drafter.reads_state  # no decisions in the passes, no gathers
            calls.clear()
            out, stats = whiflash.generate(target, drafter, prompt, 40)
            assert out == ref and len(calls) == 1
            slots, taus = stats.slots, stats.taus
            assert slots[0] == first
            for r in range(1, stats.rounds):
                assert slots[r] == (int(taus[r - 1] < enter) if slots[r - 1] == 1 else int(taus[r - 1] <= leave))
            switches += int(np.count_nonzero(np.diff(slots)))
            cols = {"prompt_id": np.zeros(len(taus)), "tau_0": np.array(taus), "tau_1": np.array(taus)}
            policy = np.full(len(taus), first == 0) ^ (np.arange(len(taus)) % 2 == 1)  # only row 0 is read
            assert ruled(policy, cols, (enter, leave)).tolist() == [s == 0 for s in slots]
    assert switches > 0


def test_the_policy_scores_a_router_as_its_forward_does():
    """`NeuralPolicy.score` (standardisation folded into the first layer) equals `NeuralRouter.forward` to float
    rounding, for every activation and with context features; another module is called as it is."""
    torch.manual_seed(0)
    for activation in ("gelu", "relu", "silu", "tanh"):
        for context in ([], ["entropy", "prev_tau"]):
            router = NeuralRouter(12, mlp_dim=16, activation=activation, context=context).eval()
            router.set_normalization(torch.randn(12 + len(context)), torch.rand(12 + len(context)) + 0.5)
            h, c = torch.randn(5, 12), torch.randn(5, len(context)) if context else None
            policy = NeuralPolicy(router)
            torch.testing.assert_close(policy.score(h, c), router(h, c), rtol=1e-5, atol=1e-5)
    plain = torch.nn.Linear(12, 1)
    torch.testing.assert_close(NeuralPolicy(plain).score(torch.ones(2, 12)), plain(torch.ones(2, 12)))


def _between(values: torch.Tensor) -> float:
    """A threshold halfway between the two middle values: no row sits on it, so rounding flips no decision."""
    v = values.sort().values
    return float(v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def test_a_row_policy_decides_every_verify_row_as_it_decides_one(world):
    """Policies that decide from the position alone (entropy, a neural router without context or with the
    entropy only, a fixed slot) decide inside the target's verify pass, eager and fixed-shape alike, exactly
    as they decide for each row on its own; a router that reads the previous round cannot."""
    target, eagle, ddtree = world
    h = target.config.hidden_size
    torch.manual_seed(1)
    plain, with_entropy = NeuralRouter(h, mlp_dim=16), NeuralRouter(h, mlp_dim=16, context=["entropy"])
    ids = torch.tensor(PROMPTS[1])
    target.setup_cache(64)
    out = target(ids, 0, logits="all")
    ent = entropy(out.logits)
    policies = [EntropyRouter(_between(ent)), FixedRouter(1),
                NeuralPolicy(plain, _between(NeuralPolicy(plain).score(out.hidden))),
                NeuralPolicy(with_entropy, _between(NeuralPolicy(with_entropy).score(out.hidden, ent[:, None])))]
    for policy in policies:
        one_by_one = [int(policy(out.hidden[i], out.logits[i])) for i in range(len(ids))]
        assert policy.rows_key is not None
        if not isinstance(policy, FixedRouter):
            assert set(one_by_one) == {0, 1}, policy
        for static in (False, True):
            target.static = static
            try:
                routed = target(ids, 0, logits="all", route=policy).routes
            finally:
                target.static = False
            assert routed.tolist() == one_by_one, (policy, static)
    with pytest.raises(ValueError, match="route= decides for every row and needs logits='all'"):
        target(ids, 0, logits="last", route=policies[0])
    reads_back = NeuralPolicy(NeuralRouter(h, context=["entropy", "prev_tau"]))
    assert reads_back.rows_key is None
    # what the latency profile prices a decision by: inside the pass, or after it (the previous round, history)
    assert [decides_in_pass(NeuralRouter(h, **kw)) for kw in ({}, {"context": ["entropy"]}, {"context": ["prev_slot"]},
                                                               {"history": 2})] == [True, True, False, False]
    assert RoutedDrafter("df-e3", reads_back, eagle3=eagle, dflash=ddtree).row_policy is None
    assert RoutedDrafter("df-e3", policies[2], eagle3=eagle, dflash=ddtree).row_policy is policies[2]
    # a captured pass is keyed by rows_key: a policy whose threshold moves must key a new pass
    for policy in (policies[0], policies[2]):
        before = policy.rows_key
        policy.threshold += 1.0
        assert policy.rows_key != before, policy


def test_routing_inside_the_verify_pass_chooses_what_the_policy_chooses_after_it(world):
    """A routed drafter whose policy decides inside the verify pass takes, every round, the decision at the
    accepted path's last row: the same slots as the same policy asked after the pass, the same output."""
    target, eagle, ddtree = world
    torch.manual_seed(2)
    router = NeuralRouter(target.config.hidden_size, mlp_dim=16)
    target.setup_cache(64)
    out = target(torch.tensor(PROMPTS[0] + PROMPTS[1]), 0, logits="all")
    policy = NeuralPolicy(router, _between(NeuralPolicy(router).score(out.hidden)))

    class AfterThePass:  # the same decisions, without `rows`: the loop asks it after the pass
        def __call__(self, hidden, logits):
            return policy(hidden, logits)

    for pair in ("df-e3", "ddt-e3"):
        router.drafters = pair
        for prompt in PROMPTS:
            ref, _ = whiflash.generate(target, None, prompt, 40)
            inside = RoutedDrafter(pair, policy, eagle3=eagle, dflash=ddtree)
            after = RoutedDrafter(pair, AfterThePass(), eagle3=eagle, dflash=ddtree)
            assert inside.row_policy is policy and after.row_policy is None
            a, sa = whiflash.generate(target, inside, prompt, 40)
            b, sb = whiflash.generate(target, after, prompt, 40)
            assert a == b == ref and sa.slots == sb.slots, (pair, prompt)
            assert set(sa.slots) == {0, 1}, (pair, prompt, sa.slots)
