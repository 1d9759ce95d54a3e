"""Decoding statistics: one `RoundRecord` per round, gathered into a `DecodeStats` per sequence.

tau of a round = accepted draft tokens + 1 (the target's bonus token included); its maximum is the
chain length or tree depth + 1. Plain autoregressive decoding has tau = 1 every round
(docs/design.md, "Tau").
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from torch import Tensor

TAU_DEFINITION = ("tau of a round = accepted draft tokens + 1 (bonus token included); reported tau = mean over "
                  "rounds per sequence, then over sequences")
"""The one definition of tau, printed under every table and written into every manifest."""


@dataclass
class RoundRecord:
    """What one round did, handed to `generate`'s `on_round` callback right after the round's host read."""

    index: int
    """Round number in the sequence (0 is the first round after prefill)."""
    position: int
    """Absolute position of the pending token when the round started."""
    tau: int
    """Acceptance length of the round (accepted drafts + 1)."""
    slot: int | None
    """Routed decoding: the slot that drafted (the oracle: the slot the round advanced with, see
    `OracleDrafter.advance`); else None."""
    backlog: int
    """Committed rows the drafting member consumed in its catch-up before drafting (Lazy Catch-up)."""
    slot_taus: tuple[int, int] | None = None
    """The oracle: the tau each slot's branch reached from this round's state; else None."""
    hidden: Tensor | None = None
    """The router's feature at the round's decision point: the target's final post-norm hidden state
    `[H]` at the last committed position (a device copy, kept only when a callback is given)."""
    logits: Tensor | None = None
    """The target's next-token logits `[V]` there (float32, same conditions as `hidden`)."""


@dataclass
class DecodeStats:
    """Per-sequence record of one `generate` call."""

    method: str = "ar"
    taus: list[int] = field(default_factory=list)
    """tau of every round (bonus included), in order; the prefill's first token is not a round."""
    new_tokens: int = 0
    """Tokens returned (after stop-token and max_new_tokens truncation)."""
    prompt_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    """Wall time of the rounds (device-synchronised at the end), excluding prefill."""
    slots: list[int] = field(default_factory=list)
    """Routed decoding: the slot that drafted each round."""
    backlogs: list[int] = field(default_factory=list)
    """Routed decoding: catch-up backlog length consumed by the active drafter each round."""
    slot_taus: list[tuple[int, int]] = field(default_factory=list)
    """The oracle: (tau of slot 0, tau of slot 1) of every round."""
    catchup_seconds: float = 0.0
    """Routed decoding: time spent in catch-up prefills (only measured when timing is requested)."""

    def add(self, record: RoundRecord) -> None:
        """Append one round."""
        self.taus.append(record.tau)
        if record.slot is not None:
            self.slots.append(record.slot)
            self.backlogs.append(record.backlog)
        if record.slot_taus is not None:
            self.slot_taus.append(record.slot_taus)

    @property
    def rounds(self) -> int:
        return len(self.taus)

    @property
    def mean_tau(self) -> float:
        """Mean tau over this sequence's rounds."""
        return sum(self.taus) / len(self.taus) if self.taus else 0.0

    @property
    def histogram(self) -> dict[int, int]:
        """Rounds per tau value."""
        return dict(sorted(Counter(self.taus).items()))

    @property
    def switches(self) -> list[bool]:
        """Routed decoding: whether each round's slot differs from the previous round's."""
        return [i > 0 and s != self.slots[i - 1] for i, s in enumerate(self.slots)]

    @property
    def switch_rate(self) -> float:
        return sum(self.switches) / max(1, len(self.slots) - 1)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


def summarize(stats: list[DecodeStats]) -> dict[str, float]:
    """tau as the mean of per-sequence means (the reported figure), the pooled mean, and totals."""
    seqs = [s for s in stats if s.rounds]
    rounds = sum(s.rounds for s in seqs)
    return {
        "tau": sum(s.mean_tau for s in seqs) / len(seqs) if seqs else 0.0,
        "tau_pooled": sum(sum(s.taus) for s in seqs) / rounds if rounds else 0.0,
        "rounds": float(rounds),
        "tokens": float(sum(s.new_tokens for s in stats)),
        "decode_seconds": sum(s.decode_seconds for s in stats),
    }
