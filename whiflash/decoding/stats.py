"""Decoding statistics (DESIGN.md section 3).

tau of a round = accepted draft tokens + 1 (the target's bonus token included); its maximum is the
chain length or tree depth + 1. Plain autoregressive decoding has tau = 1 every round.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

TAU_DEFINITION = ("tau of a round = accepted draft tokens + 1 (bonus token included); reported tau = mean over "
                  "rounds per sequence, then over sequences")
"""The one definition of tau, printed under every table and written into every manifest."""


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
    catchup_seconds: float = 0.0
    """Routed decoding: time spent in catch-up prefills (only measured when timing is requested)."""

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
