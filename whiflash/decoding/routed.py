"""WhiFlash routed decoding: two drafter slots, a router per round, Lazy Catch-up.

`RoutedDrafter` is itself a `Drafter`, so `whiflash.generate(target, RoutedDrafter(...), ...)` runs
the same verified loop as the standalone methods and is lossless whatever the router decides.

Pairs (`--whiflash-drafters`): `df-e3` (DFlash | EAGLE-3, default), `ddt-e3` (DDTree | EAGLE-3)
and `df-ddt` (DFlash chain | DDTree tree over one shared DFlash model and cache).

Lazy Catch-up (default): committed positions are queued in every member drafter's backlog; only
the drafter that proposes consumes its backlog, in one batched prefill, so an inactive drafter
is not touched until a switch. With `lazy_catchup=False` every member catches up every round.
Both EAGLE-3 and DFlash catch up KV-only (see their `catch_up`).
"""
from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from whiflash.decoding.stats import DecodeStats
from whiflash.decoding.verify import accepted_nodes
from whiflash.drafters.base import Commit, Drafter, Proposal
from whiflash.drafters.ddtree import DDTreeDrafter, tree_proposal
from whiflash.drafters.dflash import DFlashDrafter
from whiflash.drafters.eagle3 import Eagle3Drafter
from whiflash.router import DRAFTER_PAIRS, check_compatible
from whiflash.routers import NeuralPolicy, OracleRouter, ScriptedRouter

PAIRS = DRAFTER_PAIRS


class RoutedDrafter(Drafter):
    """Routes every round to slot 0 or slot 1 of a drafter pair."""

    kind = "whiflash"

    def __init__(
        self,
        pair: str,
        router: Any,
        *,
        eagle3: Eagle3Drafter | None = None,
        dflash: DFlashDrafter | None = None,
        tree_budget: int | None = None,
        lazy_catchup: bool = True,
        time_catchup: bool = False,
    ) -> None:
        """pair: "df-e3" | "ddt-e3" | "df-ddt". dflash: a DFlash or DDTree drafter (one model serves
        both DFlash and DDTree slots). tree_budget: DDTree nodes (default: the DDTree drafter's, else
        block_size - 1). time_catchup: synchronise around catch-up to measure it (adds syncs)."""
        super().__init__()
        if pair not in PAIRS:
            raise ValueError(f"drafter pair {pair!r} is not one of {PAIRS}")
        if dflash is None:
            raise ValueError(f"pair {pair!r} needs a DFlash (or DDTree) drafter")
        if "e3" in pair and eagle3 is None:
            raise ValueError(f"pair {pair!r} needs an EAGLE-3 drafter")
        if tree_budget is None:
            tree_budget = dflash.tree_budget if isinstance(dflash, DDTreeDrafter) else dflash.block_size - 1
        self.pair, self.router, self.tree_budget = pair, router, tree_budget
        if isinstance(router, NeuralPolicy):  # a router trained for another pair or budget is refused
            check_compatible(router.router, "(given)", None, pair, tree_budget if "ddt" in pair else None)
        self.lazy, self.time_catchup = lazy_catchup, time_catchup
        # (owning drafter, tree budget or None for a chain); df-ddt puts one model in both slots.
        first = (dflash, tree_budget if pair == "ddt-e3" else None)
        second = (dflash, tree_budget) if pair == "df-ddt" else (eagle3, None)
        self.slots = (first, second)
        self.members = [dflash] if pair == "df-ddt" else [dflash, eagle3]
        self.tap_layers = tuple(sorted({t for m in self.members for t in m.tap_layers}))
        self.oracle = isinstance(router, OracleRouter)
        self.slot = 1
        self._union: tuple[Proposal, int] | None = None  # the oracle's last union tree and slot 0's node count
        self.slot_log: list[int] = []
        self.backlog_log: list[int] = []
        self.tau_log: list[tuple[int, int]] = []
        self.catchup_seconds = 0.0

    def _size(self, i: int) -> int:
        drafter, budget = self.slots[i]
        if budget is not None:
            return budget
        return drafter.max_nodes if isinstance(drafter, Eagle3Drafter) else drafter.block_size - 1

    @property
    def max_nodes(self) -> int:
        return self._size(0) + self._size(1) if self.oracle else max(self._size(0), self._size(1))

    def use_cuda_graphs(self, enabled: bool = True) -> None:
        for m in self.members:
            m.use_cuda_graphs(enabled)

    def _setup_cache(self, max_len: int) -> None:
        """Members hold the caches; the router itself has none."""

    def reset(self, target: Any, max_len: int, temperature: float = 0.0) -> None:
        if self.oracle and temperature > 0:
            raise ValueError("the oracle router is defined for greedy decoding only (temperature=0)")
        if isinstance(self.router, NeuralPolicy):
            check_compatible(self.router.router, "(given)", target.config.hidden_size, None, None)
        super().reset(target, max_len, temperature)
        for m in self.members:
            m.reset(target, max_len, temperature)
        if isinstance(self.router, ScriptedRouter):
            self.router.reset()
        self.slot, self._union = 1, None
        self.slot_log, self.backlog_log, self.tau_log = [], [], []
        self.catchup_seconds = 0.0

    def _sync(self) -> None:
        if self.time_catchup and self.target.device.type == "cuda":
            torch.cuda.synchronize(self.target.device)

    def _catch_up(self, drafter: Drafter) -> None:
        if not drafter.backlog:
            return
        self._sync()
        t0 = time.perf_counter()
        drafter.catch_up()
        self._sync()
        self.catchup_seconds += time.perf_counter() - t0

    def observe(self, commit: Commit) -> None:
        for m in self.members:
            m.observe(commit)
            if not self.lazy:
                self._catch_up(m)

    def decide(self, hidden: Tensor, logits: Tensor, picked: Tensor | None) -> Tensor | None:
        if self.oracle:
            return self._oracle_taus(picked) if picked is not None else None
        return self.router(hidden, logits).reshape(1)

    def receive(self, values: list[int]) -> None:
        if self.oracle:
            tau0, tau1 = values
            self.tau_log.append((tau0, tau1))
            self.slot = 0 if tau0 > tau1 else 1  # ties go to slot 1
            self.slot_log.append(self.slot)
        else:
            self.slot = int(values[0])

    def _slot_proposal(self, i: int, pending: Tensor, pos: int, logits: Tensor | None = None) -> Proposal:
        drafter, budget = self.slots[i]
        if isinstance(drafter, Eagle3Drafter):
            return drafter.propose(pending, pos)
        logits = drafter.block_logits(pending, pos) if logits is None else logits
        return Proposal(tokens=logits.argmax(-1)) if budget is None else tree_proposal(logits, budget)

    def propose(self, pending: Tensor, pos: int) -> Proposal:
        if self.oracle:
            return self._oracle_proposal(pending, pos)
        drafter = self.slots[self.slot][0]
        self.slot_log.append(self.slot)
        self.backlog_log.append(drafter.backlog_len)
        self._catch_up(drafter)
        return self._slot_proposal(self.slot, pending, pos)

    # --- oracle: both slots draft from the same state, one verify pass over their union ---

    def _oracle_proposal(self, pending: Tensor, pos: int) -> Proposal:
        self.backlog_log.append(max(m.backlog_len for m in self.members))
        for m in self.members:
            self._catch_up(m)
        shared = self.members[0].block_logits(pending, pos) if self.pair == "df-ddt" else None
        a, b = (self._slot_proposal(i, pending, pos, shared) for i in (0, 1))
        union = merge_proposals(a, b)
        self._union = (union, a.size)
        return union

    def _oracle_taus(self, picked: Tensor) -> Tensor:
        """tau of each slot's branch, read off the target's picks at every union node (on device)."""
        union, split = self._union
        accepted, depth = accepted_nodes(union, picked)
        reach = torch.where(accepted, depth, 0)
        return torch.stack([reach[1 : 1 + split].max(), reach[1 + split :].max()]) + 1

    def annotate(self, stats: DecodeStats) -> None:
        stats.method = f"whiflash[{self.pair}]"
        stats.slots = list(self.slot_log)
        stats.backlogs = list(self.backlog_log)
        stats.catchup_seconds = self.catchup_seconds


def _as_tree(p: Proposal) -> tuple[Tensor, Tensor, Tensor]:
    """(parents, depths, [m+1, m+1] mask) of a proposal, chains included."""
    if p.parents is not None:
        return p.parents, p.depths, p.tree_mask
    m, dev = p.size, p.tokens.device
    ar = torch.arange(m, device=dev)
    return ar, ar + 1, torch.ones(m + 1, m + 1, dtype=torch.bool, device=dev).tril_()


def merge_proposals(a: Proposal, b: Proposal) -> Proposal:
    """Both proposals as branches under one root: `[root, a's nodes, b's nodes]`."""
    pa, da, ma = _as_tree(a)
    pb, db, mb = _as_tree(b)
    na, nb = a.size, b.size
    pb = torch.where(pb == 0, pb, pb + na)
    mask = torch.zeros(1 + na + nb, 1 + na + nb, dtype=torch.bool, device=a.tokens.device)
    mask[:, 0] = True
    mask[1 : 1 + na, 1 : 1 + na] = ma[1:, 1:]
    mask[1 + na :, 1 + na :] = mb[1:, 1:]
    return Proposal(torch.cat([a.tokens, b.tokens]), torch.cat([pa, pb]), torch.cat([da, db]), mask)
