"""Routing policies: at the start of every round, pick which of the two slots drafts.

Every router has the same call: the target's final post-norm hidden state `[H]` and next-token
logits `[V]` at the last committed position in, a 0-dim long tensor (the slot) out, left on the
device so the decision travels to the host with the round's one existing read (see
`whiflash.decoding.loop`). The per-round oracle is not a policy but a drafter of its own
(`whiflash.decoding.routed.OracleDrafter`): it needs both slots' drafts, not a prediction. Slot 0 is the diffusion/parallel drafter of the pair (DFlash or
DDTree), slot 1 the other one (EAGLE-3, or DDTree in `df-ddt`).

A policy whose decision depends on the position's hidden state and logits alone may also decide for
every row of a verify pass at once (`rows`, `rows_key`): the target then computes the decisions inside its
verify pass, a CUDA graph, and the loop only picks the row where the accepted path ends. On a small
target the handful of kernels a decision launches after the pass cost a few percent of a round, which
is all the headroom routing has where one drafter accepts long blocks.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from whiflash.router import NeuralRouter
from whiflash.router_context import NO_SLOT, context_now, entropy


class EntropyRouter:
    """WhiFlash-Entropy: the parallel slot when the target is confident (entropy below `threshold` nats)."""

    def __init__(self, threshold: float = 0.2, low_entropy_slot: int = 0) -> None:
        self.threshold, self.low = threshold, low_entropy_slot

    def __call__(self, hidden: Tensor, logits: Tensor) -> Tensor:
        return self.rows(hidden, logits)

    def rows(self, hidden: Tensor, logits: Tensor) -> Tensor:
        """The slot for every row of `logits` `[..., V]` (a verify pass's rows, or one position)."""
        low = entropy(logits) < self.threshold
        return torch.where(low, self.low, 1 - self.low).long()

    @property
    def rows_key(self) -> tuple[Any, ...]:
        """What a captured verify pass that decides with `rows` depends on (the pass is keyed by it)."""
        return (self, self.threshold, self.low)


class NeuralPolicy:
    """WhiFlash-Neural: slot 0 when the predicted gain tau(slot 0) - tau(slot 1) exceeds `threshold`.

    A router trained with context features (`NeuralRouter.context`) also reads the entropy of `logits`
    and the previous round's slot and tau, which the routed drafter reports through `after_round`. One
    trained with `history` also reads the states of the committed positions before the decision point,
    which the policy keeps on the device from each verified path (`observe`).

    A `NeuralRouter` is scored through its weights with the input standardisation folded into the first
    layer (`W / std`, `b - (W / std) @ mean`): three functional ops instead of seven kernels behind five
    module calls, because the decision sits on every round's critical path and on a small target its host
    time is a few percent of a round. The folded weights are taken when the policy first scores on a device:
    a router whose weights change after that needs a new policy. Any other module is called as it is."""

    def __init__(self, router: nn.Module, threshold: float | None = None) -> None:
        self.router = router
        self.threshold = float(threshold if threshold is not None else getattr(router, "threshold", 0.0))
        self.context: tuple[str, ...] = tuple(getattr(router, "context", ()))
        self.history: int = int(getattr(router, "history", 0))
        self._foldable = isinstance(router, NeuralRouter)
        self._folded: tuple[Tensor, Tensor, Any, Tensor, Tensor] | None = None
        self.reset()

    def reset(self) -> None:
        """A new sequence: no round verified yet."""
        self._prev: tuple[float, Tensor | float] = (NO_SLOT, 0.0)
        self._recent: Tensor | None = None  # [1 + history, H]: the last committed positions' states, newest first

    @torch.no_grad()
    def observe(self, hidden: Tensor, keep: Tensor, count: Tensor) -> None:
        """A round was verified and its path committed: rows `keep[:count]` of the pass's `hidden`, root first.
        Keeps the states of the last `1 + history` committed positions, newest first, with no host read of
        `count` (a short path takes the rest from the rounds before)."""
        if not self.history or self._recent is None:
            return
        k = self._ages
        back = count - 1 - k  # the path's rows, newest first; below 0: an earlier round's
        fresh = hidden.index_select(0, keep.index_select(0, back.clamp(min=0)))
        old = self._recent.index_select(0, (k - count).clamp(0, self.history))
        self._recent = torch.where((back >= 0)[:, None], fresh.to(old.dtype), old)

    def after_round(self, slot: int, tau: Tensor) -> None:
        """The round just verified: the slot that drafted it and its tau (0-dim, on the device)."""
        self._prev = (slot, tau)

    @torch.no_grad()
    def _fold(self, device: torch.device) -> tuple[Tensor, Tensor, Any, Tensor, Tensor]:
        """The NeuralRouter's layers with the standardisation folded in, on `device`."""
        r = self.router
        first, last = r.mlp[0], r.mlp[3]
        w1 = (first.weight.float() / r.std).to(device)
        b1 = (first.bias.float() - (first.weight.float() / r.std) @ r.mean).to(device)
        act = {"gelu": F.gelu, "relu": F.relu, "silu": F.silu, "tanh": torch.tanh}[r.activation]
        return w1, b1, act, last.weight.float().to(device), last.bias.float().to(device)

    @torch.no_grad()
    def score(self, hidden: Tensor, context: Tensor | None = None) -> Tensor:
        """The predicted gain `[N]` for `hidden` `[N, H]` (and `context` `[N, C]` when the router reads any)."""
        if not self._foldable:
            return self.router(hidden, context) if context is not None else self.router(hidden)
        if self._folded is None or self._folded[0].device != hidden.device:  # once, and again if moved
            self._folded = self._fold(hidden.device)
        w1, b1, act, w2, b2 = self._folded
        x = hidden.float() if context is None else torch.cat([hidden.float(), context.float()], -1)
        return F.linear(act(F.linear(x, w1, b1)), w2, b2).squeeze(-1)

    @torch.no_grad()
    def __call__(self, hidden: Tensor, logits: Tensor) -> Tensor:
        ctx = context_now(self.context, logits, *self._prev).reshape(1, -1) if self.context else None
        if self.history:
            if self._recent is None:  # the sequence's first decision: its history starts here
                self._recent = hidden.reshape(1, -1).expand(self.history + 1, -1).clone()
                self._ages = torch.arange(self.history + 1, device=hidden.device)  # made once, not every round
            hidden = self._recent  # [h[n], h[n-1], ...]: `observe` made its first row this `hidden`
        gain = self.score(hidden.reshape(1, -1), ctx)[0]
        return (gain <= self.threshold).long()  # 0 when gain > threshold

    @torch.no_grad()
    def rows(self, hidden: Tensor, logits: Tensor) -> Tensor:
        """`[T]` the slot for every row of `hidden` `[T, H]` and `logits` `[T, V]` (a router whose context
        is the entropy at most: the previous round's slot and tau are not known inside the verify pass)."""
        ctx = entropy(logits).reshape(-1, 1) if self.context else None
        return (self.score(hidden, ctx) <= self.threshold).long()

    @property
    def rows_key(self) -> tuple[Any, ...] | None:
        """What a captured verify pass deciding with `rows` depends on; None when the router reads the
        previous round (its decision needs the round's tau, known only after the pass) or earlier positions."""
        return (self, self.threshold) if decides_in_pass(self.router) else None


class FixedRouter:
    """Always the same slot (a standalone drafter run through the routed loop)."""

    def __init__(self, slot: int) -> None:
        if slot not in (0, 1):
            raise ValueError(f"slot must be 0 or 1, got {slot}")
        self.slot = slot

    def __call__(self, hidden: Tensor, logits: Tensor) -> Tensor:
        return slot_tensor(hidden, self.slot)

    def rows(self, hidden: Tensor, logits: Tensor) -> Tensor:
        return hidden.new_full(hidden.shape[:-1], self.slot, dtype=torch.long)

    @property
    def rows_key(self) -> tuple[Any, ...]:
        return (self, self.slot)


class ScriptedRouter:
    """Slots from a fixed sequence, cycled (tests: alternating `[0, 1]`, or any switch pattern)."""

    def __init__(self, slots: Iterable[int] = (0, 1)) -> None:
        self.slots = list(slots)
        self._it = itertools.cycle(self.slots)

    def reset(self) -> None:
        self._it = itertools.cycle(self.slots)

    def __call__(self, hidden: Tensor, logits: Tensor) -> Tensor:
        return slot_tensor(hidden, next(self._it))


def decides_in_pass(router: nn.Module) -> bool:
    """Whether `NeuralPolicy` decides with `router` inside the verify pass: it reads the hidden state and at most
    the entropy. A router that reads the previous round or earlier positions decides after the pass, with kernels
    of its own launched on every round's critical path: the latency profile times the two apart
    (`LatencyProfile.decision_ms`), because on a small target that difference is a few percent of a round."""
    return not int(getattr(router, "history", 0)) and all(n == "entropy" for n in getattr(router, "context", ()))


def slot_tensor(like: Tensor, slot: int) -> Tensor:
    """`slot` as a 0-dim long tensor on `like`'s device, as every routing decision is returned."""
    # a fill kernel on the device: torch.tensor(slot, device=...) copies from pageable host memory,
    # which waits for the GPU to finish and would add a second host synchronisation per round
    return like.new_full((), slot, dtype=torch.long)


class AlternatingRouter(ScriptedRouter):
    """Switches slot every `period` rounds."""

    def __init__(self, period: int = 1) -> None:
        super().__init__([0] * period + [1] * period)
