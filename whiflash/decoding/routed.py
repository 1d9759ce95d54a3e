"""WhiFlash routed decoding: two drafter slots, Lazy Catch-up, and the per-round oracle.

`RoutedDrafter` and `OracleDrafter` are drafters, so `whiflash.generate` runs them in the same
verified loop as the standalone methods and stays lossless whatever is chosen. A routed drafter
carries its routing policy (`.router`) behind the `Drafter.route` hook; `generate` asks it every
round and passes the slot to `propose` (docs/design.md, "Routing"). The oracle's union proposals
use the `Drafter.advance` hook to pick the slot a round advances with. Slot 0 is the pair's parallel drafter, slot 1 the other.

Lazy Catch-up (default): committed positions are queued in every member drafter's backlog; only
the member that drafts consumes its backlog, in one batched prefill, so an inactive drafter is
not touched until a switch. With `lazy_catchup=False` every member catches up every round.
Both EAGLE-3 and DFlash catch up KV-only (see their `catch_up`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from whiflash.drafters.base import Commit, Drafter, Proposal, SequenceState
from whiflash.drafters.ddtree import DDTreeDrafter
from whiflash.drafters.dflash import DFlashDrafter
from whiflash.drafters.eagle3 import Eagle3Drafter
from whiflash.pairs import PAIRS, Pair
from whiflash.router import check_compatible
from whiflash.routers import NeuralPolicy, ScriptedRouter, slot_tensor


@dataclass(slots=True)
class RoundState(SequenceState):
    """A pair's per-round state beside `SequenceState`'s (whose backlog and positions its members hold): a
    routed round made five `nn.Module` attribute sets on the pair before these moved here."""

    catchup_seconds: float = 0.0
    """Seconds spent consuming backlogs since `reset`."""
    slot: int = 0
    """The slot that drafted the round being verified."""
    proposed: bool = False
    """A round was proposed whose commit `observe` has not seen yet."""
    seen: tuple[int, int] | None = None
    """(slot, tau) of the last round whose commit the host has seen."""


class DrafterPair(Drafter):
    """Two slots filled from a pair's members; what routed decoding and the oracle share."""

    State = RoundState
    _seq: RoundState

    def __init__(
        self,
        pair: str | Pair,
        *,
        eagle3: Eagle3Drafter | None = None,
        dflash: DFlashDrafter | None = None,
        tree_budget: int | None = None,
        lazy_catchup: bool = True,
        time_catchup: bool = False,
    ) -> None:
        """pair: "df-e3" | "ddt-e3" | "df-ddt". dflash: a DFlash or DDTree drafter (one model serves
        both DFlash and DDTree slots). tree_budget: DDTree nodes (default: the DDTree drafter's, else
        block_size - 1; pairs without a DDTree slot take none). time_catchup: synchronise around
        catch-up to measure it (adds host synchronisations)."""
        super().__init__()
        pair = Pair.parse(pair, "pair")
        if dflash is None or not isinstance(dflash, DFlashDrafter):
            raise ValueError(f"pair {pair}: dflash= needs a DFlash (or DDTree) drafter, got {type(dflash).__name__}")
        if pair.needs_eagle3 != (eagle3 is not None):
            need = "needs an EAGLE-3 drafter (eagle3=)" if pair.needs_eagle3 else "takes no EAGLE-3 drafter"
            raise ValueError(f"pair {pair} {need}")
        if eagle3 is not None and not isinstance(eagle3, Eagle3Drafter):
            raise ValueError(f"pair {pair}: eagle3= needs an EAGLE-3 drafter, got {type(eagle3).__name__}")
        if tree_budget is not None and not pair.uses_tree:
            raise ValueError(f"pair {pair} has no DDTree slot, so tree_budget={tree_budget} does not apply")
        if tree_budget is None and pair.uses_tree:
            tree_budget = dflash.tree_budget if isinstance(dflash, DDTreeDrafter) else dflash.block_size - 1
        self.pair, self.tree_budget = pair, tree_budget
        self.lazy, self.time_catchup = lazy_catchup, time_catchup
        members = {"dflash": (dflash, None), "ddtree": (dflash, tree_budget), "eagle3": (eagle3, None)}
        self.slots: tuple[tuple[Drafter, int | None], ...] = tuple(members[kind] for kind in pair.slots)
        """(member, tree budget or None for a chain) per slot; df-ddt puts one model in both."""
        self.members: list[Drafter] = [dflash] if pair.shares_dflash else [dflash, eagle3]
        # slot 0's member's layers first, in its order, then the other's: the target stacks its taps in this
        # order, so the drafter of slot 0 (the parallel drafter, the one that runs most rounds where routing has
        # no headroom) reads its features as a view; the other gathers them, as it would in any union
        self.tap_layers = tuple(dict.fromkeys(t for m in self.members for t in m.tap_layers))

    @property
    def catchup_seconds(self) -> float:  # type: ignore[override]
        return self._seq.catchup_seconds

    def slot_nodes(self, slot: int) -> int:
        member, budget = self.slots[slot]
        return budget if budget is not None else member.draft_length

    def use_cuda_graphs(self, enabled: bool = True) -> None:
        for m in self.members:
            m.use_cuda_graphs(enabled)

    def _setup_cache(self, max_len: int) -> None:
        """Members hold the caches."""

    def prefill(self) -> None:
        """Every member takes in the prompt (not a catch-up: it is the prefill's, untimed as catch-up)."""
        for m in self.members:
            m.prefill()

    def reset(self, target: Any, max_len: int, temperature: float = 0.0) -> None:
        super().reset(target, max_len, temperature)
        for m in self.members:
            m.reset(target, max_len, temperature)

    def _catch_up(self, member: Drafter) -> None:
        if not member.backlog:
            return
        timed = self.time_catchup and self.target.device.type == "cuda"
        if timed:
            torch.cuda.synchronize(self.target.device)
        t0 = time.perf_counter()
        member.catch_up()
        if timed:
            torch.cuda.synchronize(self.target.device)
        self._seq.catchup_seconds += time.perf_counter() - t0

    def observe(self, commit: Commit) -> None:
        for m in self.members:
            m.observe(commit)
            if not self.lazy:
                self._catch_up(m)

    def _draft(self, slot: int, pending: Tensor, pos: int) -> Proposal:
        member, budget = self.slots[slot]
        self._catch_up(member)
        return member.draft(pending, pos, budget)


class RoutedDrafter(DrafterPair):
    """WhiFlash: a routing policy picks which slot drafts, every round.

    With `stick_tau` K the policy is not asked while slot 0 is running well: when the round being
    verified and the one before it both drafted with slot 0 and that earlier round (the last one whose
    tau the host has read) accepted at least K tokens, the next round stays with slot 0 and the policy's
    kernels are not launched: the host knows this before it launches the verify pass, so the pass runs
    without the policy's decisions (the drafter alone's pass) and no row is gathered for it. On a small
    target a routing decision costs a few percent of a round, which is all the headroom routing has where
    the parallel drafter accepts long blocks.

    With `tau_rule` (ENTER, LEAVE) the policy picks the first round's slot only, and the round just verified
    picks every later one: after a slot-1 round that accepted at least ENTER tokens (bonus included) the next
    drafts with slot 0, after a slot-0 round that accepted at most LEAVE with slot 1, else with the same slot. A run
    of accepted tokens tends to go on where the text is predictable, which the parallel drafter turns into long
    blocks, and a short block says the run is over. The round's tau is on the device when the decision is made, so
    the rule costs one comparison and no host read, and the verify pass computes no decisions.
    `whiflash.speed_oracle.ruled` replays it."""

    kind = "whiflash"
    routes = True
    force_slot: int | None = None
    """Draft with this slot every round whatever the policy decides (a warm-up sets it, so every slot's passes,
    the policy's verify graph at that slot's width among them, are captured before anything is timed); None:
    the policy's slot."""
    force_stick: bool = False
    """With `stick_tau`: every slot-0 round is one `stick_tau` keeps (its verify pass decides nothing, a graph of
    its own), whatever the rounds before it accepted. A warm-up sets it beside `force_slot` 0, since its own
    slot-0 rounds may never reach `stick_tau` where the timed ones do."""

    def __init__(self, pair: str | Pair, router: Any, stick_tau: int | None = None,
                 tau_rule: tuple[int, int] | None = None, **options: Any) -> None:
        """router: a policy `(hidden [H], logits [V]) -> 0-dim long slot` (whiflash.routers); stick_tau and
        tau_rule: see the class doc (None: the policy decides every round); the other options as `DrafterPair`."""
        if stick_tau is not None and (isinstance(stick_tau, bool) or not isinstance(stick_tau, int) or stick_tau < 1):
            raise ValueError(f"stick_tau: expected an integer >= 1 (or None), got {stick_tau!r}")
        tau_rule = check_tau_rule(tau_rule)
        if tau_rule is not None and stick_tau is not None:
            raise ValueError("tau_rule and stick_tau both decide from earlier rounds' tau; give one of them")
        super().__init__(pair, **options)
        self.router, self.stick_tau, self.tau_rule = router, stick_tau, tau_rule
        if isinstance(router, NeuralPolicy):  # a router trained for another pair or budget is refused
            check_compatible(router.router, "(given)", None, str(self.pair), self.tree_budget)

    @property
    def name(self) -> str:
        return f"whiflash[{self.pair}]"

    @property
    def max_nodes(self) -> int:
        return max(self.slot_nodes(0), self.slot_nodes(1))

    def reset(self, target: Any, max_len: int, temperature: float = 0.0) -> None:
        if isinstance(self.router, NeuralPolicy):
            check_compatible(self.router.router, "(given)", target.config.hidden_size, None, None)
        if isinstance(self.router, (ScriptedRouter, NeuralPolicy)):
            self.router.reset()
        super().reset(target, max_len, temperature)  # a fresh `RoundState`: slot 0, no round seen yet

    def backlog_rows(self, slot: int = 0) -> int:
        return self.slots[slot][0].backlog_len

    def _sticks(self) -> bool:
        """`stick_tau` sends the round after the one being verified to slot 0 without asking the policy: this
        round and the one before it drafted with slot 0, and that earlier round (the last whose tau the host has
        read) accepted at least `stick_tau` tokens. Known before the verify pass is launched."""
        state = getattr(self, "_seq", None)
        if self.stick_tau is None or state is None or not state.proposed or state.slot != 0:
            return False
        return self.force_stick or (state.seen is not None and state.seen[0] == 0 and state.seen[1] >= self.stick_tau)

    @property
    def reads_state(self) -> bool:  # type: ignore[override]
        if self.tau_rule is not None:  # a tau rule reads the round's tau alone
            return False
        # a round that sticks reads nothing, unless the policy keeps a history of every round's path
        return not self._sticks() or bool(getattr(self.router, "history", 0))

    @property
    def row_policy(self) -> Any:
        if self.tau_rule is not None or self._sticks():  # no decisions in this pass (a tau rule: in no pass)
            return None
        return self.router if getattr(self.router, "rows_key", None) is not None else None

    def route(self, hidden: Tensor | None, logits: Tensor | None, tau: Tensor | None = None,
              decided: Tensor | None = None, path: tuple[Tensor, Tensor] | None = None) -> Tensor | int:
        if self.tau_rule is None or tau is None:  # (the prefill's decision has no round before it)
            return self._asked(hidden, logits, tau, decided, path)
        enter, leave = self.tau_rule
        return (tau < enter).long() if self._seq.slot == 1 else (tau <= leave).long()

    def _asked(self, hidden: Tensor | None, logits: Tensor | None, tau: Tensor | None, decided: Tensor | None,
               path: tuple[Tensor, Tensor] | None) -> Tensor | int:
        """The policy's slot for the next round (or stick_tau's, a plain 0: the host knows it)."""
        state = self._seq
        if path is not None and tau is not None and getattr(self.router, "history", 0):
            self.router.observe(*path, tau)  # every round, also those the policy is not asked about
        if tau is not None and self._sticks():  # known on the host: no policy launches, no op, nothing read back
            return 0
        if decided is not None:  # the loop's row is 0-dim already: a reshape would be one more op dispatched
            return decided if decided.dim() == 0 else decided.reshape(())
        if tau is not None and isinstance(self.router, NeuralPolicy):  # its context: the round just verified
            self.router.after_round(state.slot, tau)
        return self.router(hidden, logits).reshape(())

    def propose(self, pending: Tensor, pos: int, slot: int = 0) -> Proposal:
        slot = slot if self.force_slot is None else self.force_slot
        self._seq.slot, self._seq.proposed = slot, True
        return self._draft(slot, pending, pos)

    def observe(self, commit: Commit) -> None:
        state = self._seq
        if state.proposed:  # a round's commit (not the prefill's): its length is that round's tau, on the host
            state.seen, state.proposed = (state.slot, int(commit.next_tokens.shape[0])), False
        super().observe(commit)


class OracleDrafter(DrafterPair):
    """Analysis upper bound: both slots draft from the same state, one verify pass checks their
    union, and the round advances with the longer acceptance. Greedy decoding only.

    The union's `branch` marks where slot 1's nodes start, so `generate` reads each slot's tau off
    the walk (`verify.branch_taus`) in the round's one host read; `advance` picks the slot the
    round continues with (ties: slot 1) and only that slot's branch is accepted. df-ddt drafts its
    one DFlash model twice (chain and tree).

    With `round_times` (each slot's round time, from a latency profile) it is the latency-aware
    (utility) oracle: the round advances with the slot of the higher tau / round time, i.e. the
    slot that would have produced tokens faster this round. With `follow` (0 or 1; settable between
    sequences) every round advances with that slot whatever the taus: the sequence takes that drafter's
    own path while both slots' taus are still measured (datagen's `--path slot0|slot1`). With `policy` (a routing
    policy, settable between sequences) every round advances with the slot the policy picked at the round's start
    from the target's state there, as a routed drafter with that policy would draft: the sequence takes the
    router's own path (datagen's `--path router`, on-policy rows)."""

    kind = "oracle"
    policy: Any = None
    """A routing policy `(hidden [H], logits [V]) -> 0-dim long slot` whose decisions the rounds follow; None: the
    advance rule above."""

    def __init__(self, pair: str | Pair, *, round_times: tuple[float, float] | None = None, follow: int | None = None,
                 **options: Any) -> None:
        """round_times: (slot 0, slot 1) round time in any one unit, each > 0; None: the plain oracle.
        follow: advance with this slot every round (None: the rule above). The other options as `DrafterPair`."""
        super().__init__(pair, **options)
        self.follow = follow
        if round_times is not None:
            times = tuple(float(t) for t in round_times)
            if len(times) != 2 or not all(math.isfinite(t) and t > 0 for t in times):
                raise ValueError(f"round_times: expected two finite times > 0 (slot 0, slot 1), got {round_times!r}")
            round_times = times  # type: ignore[assignment]
        self.round_times = round_times

    @property
    def name(self) -> str:
        return f"{'utility-oracle' if self.round_times else 'oracle'}[{self.pair}]"

    @property
    def max_nodes(self) -> int:
        return self.slot_nodes(0) + self.slot_nodes(1)

    @property
    def routes(self) -> bool:  # type: ignore[override]
        return self.policy is not None

    def reset(self, target: Any, max_len: int, temperature: float = 0.0) -> None:
        if temperature > 0:
            raise ValueError("the oracle is defined for greedy decoding only (temperature=0)")
        if self.policy is not None and self.follow is not None:
            raise ValueError(f"an oracle follows a policy or a slot, not both (follow={self.follow})")
        if self.policy is not None and hasattr(self.policy, "reset"):
            self.policy.reset()
        self._decision: Tensor | None = None
        super().reset(target, max_len, temperature)

    def route(self, hidden: Tensor | None, logits: Tensor | None, tau: Tensor | None = None,
              decided: Tensor | None = None, path: tuple[Tensor, Tensor] | None = None) -> Tensor | None:
        """With `policy`: its slot for the next round (kept for `advance`), from the state at the path's end."""
        if self.policy is None:
            return None
        if path is not None and tau is not None and getattr(self.policy, "history", 0):
            self.policy.observe(*path, tau)
        self._decision = self.policy(hidden, logits).reshape(())
        return self._decision

    def backlog_rows(self, slot: int = 0) -> int:
        return max(m.backlog_len for m in self.members)

    def propose(self, pending: Tensor, pos: int, slot: int = 0) -> Proposal:
        return merge_proposals(self._draft(0, pending, pos), self._draft(1, pending, pos))

    def advance(self, taus: Tensor) -> Tensor:
        """0-dim long slot (on the device) the round advances with, from both slots' `[2]` taus:
        the larger tau, or with `round_times` the larger tau per unit of round time; ties: slot 1. With
        `follow`, that slot; with `policy`, the slot it picked before the round."""
        if self.policy is not None:
            if self._decision is None:
                raise RuntimeError("oracle with a policy: advance before any decision (route runs after the prefill)")
            return self._decision
        if self.follow is not None:
            if self.follow not in (0, 1):
                raise ValueError(f"follow: expected slot 0 or 1 (or None), got {self.follow!r}")
            return slot_tensor(taus, self.follow)
        if self.round_times is None:
            return super().advance(taus)
        t0, t1 = self.round_times
        # tau0 / t0 <= tau1 / t1, multiplied out (times > 0): no division, and no host read
        return (taus[0] * t1 <= taus[1] * t0).long()


def check_tau_rule(rule: Any, flag: str = "tau_rule") -> tuple[int, int] | None:
    """`rule` as (ENTER, LEAVE), two integers >= 1 with LEAVE < ENTER (else a slot-1 round could send the next to
    slot 0 and a slot-0 round of the same tau straight back), or None; `ValueError` naming `flag` otherwise.
    A string "ENTER,LEAVE" is read as the two numbers."""
    if rule is None:
        return None
    parts = rule.split(",") if isinstance(rule, str) else rule
    try:
        enter, leave = (int(p) if isinstance(p, str) else p for p in parts)
    except (TypeError, ValueError):
        enter = leave = None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (enter, leave)) or leave >= enter:
        raise ValueError(f"{flag}: expected ENTER,LEAVE, two integers >= 1 with LEAVE < ENTER (taus, bonus token "
                         f"included), got {rule!r}")
    return enter, leave


def _as_tree(p: Proposal) -> tuple[Tensor, Tensor, Tensor]:
    """(parents, depths, [m+1, m+1] mask) of a proposal, chains included."""
    if p.parents is not None:
        return p.parents, p.depths, p.tree_mask
    m, dev = p.size, p.tokens.device
    ar = torch.arange(m, device=dev)
    return ar, ar + 1, torch.ones(m + 1, m + 1, dtype=torch.bool, device=dev).tril_()


def merge_proposals(a: Proposal, b: Proposal) -> Proposal:
    """Both proposals as branches under one root: `[root, a's nodes, b's nodes]`, `branch = len(a)`."""
    pa, da, ma = _as_tree(a)
    pb, db, mb = _as_tree(b)
    na, nb = a.size, b.size
    pb = torch.where(pb == 0, pb, pb + na)
    mask = torch.zeros(1 + na + nb, 1 + na + nb, dtype=torch.bool, device=a.tokens.device)
    mask[:, 0] = True
    mask[1 : 1 + na, 1 : 1 + na] = ma[1:, 1:]
    mask[1 + na :, 1 + na :] = mb[1:, 1:]
    return Proposal(torch.cat([a.tokens, b.tokens]), torch.cat([pa, pb]), torch.cat([da, db]), mask, branch=na)


__all__ = ["PAIRS", "DrafterPair", "OracleDrafter", "RoutedDrafter", "check_tau_rule", "merge_proposals"]
