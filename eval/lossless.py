"""The lossless check: every greedy output must equal the AR baseline's, token for token.

A mismatch is located (first differing position, both tokens) and judged by the target's top-2
logit margin at that position, recomputed by a float32 forward of the target (transformers,
loaded once on demand) over the prompt plus AR's tokens before the position. A tiny margin means
the two continuations were a near tie that low-precision arithmetic can flip; a large margin
means the method is not lossless.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

__all__ = ["Mismatch", "MarginProbe", "first_difference"]


@dataclass
class Mismatch:
    """Where a method's greedy output first departs from AR's."""

    sample: str
    turn: int
    method: str
    position: int
    """Index into the generated tokens (0 = the first new token)."""
    ar_token: int | None
    method_token: int | None
    """None where one output ended (stop token or length) before the other."""
    margin_fp32: float | None = None
    """Target's top-1 minus top-2 logit there, float32 forward (None: not computed)."""
    logit_gap_fp32: float | None = None
    """Target's logit of AR's token minus that of the method's token, float32."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def first_difference(ar: list[int], other: list[int]) -> int | None:
    """First index where the two token lists differ (a length difference counts), or None if equal."""
    for i, (a, b) in enumerate(zip(ar, other)):
        if a != b:
            return i
    return None if len(ar) == len(other) else min(len(ar), len(other))


class MarginProbe:
    """Float32 logits of the target for a prefix, from a transformers copy loaded on first use."""

    def __init__(self, target_path: str | None, device: str = "cpu") -> None:
        self.target_path, self.device = target_path, device
        self._model: Any = None

    def _load(self) -> Any:
        if self._model is None:
            from transformers import AutoModelForCausalLM

            log.info("loading a float32 copy of the target from %s for mismatch margins", self.target_path)
            self._model = AutoModelForCausalLM.from_pretrained(self.target_path, dtype=torch.float32)
            self._model.to(self.device).eval()
        return self._model

    @torch.no_grad()
    def logits(self, prefix: list[int]) -> torch.Tensor:
        model = self._load()
        ids = torch.tensor([prefix], dtype=torch.long, device=self.device)
        return model(input_ids=ids).logits[0, -1].float().cpu()

    def judge(self, m: Mismatch, prompt: list[int], ar: list[int]) -> Mismatch:
        """Fill `m`'s margins (left None if the target cannot be loaded with transformers)."""
        if self.target_path is None:
            return m
        try:
            logits = self.logits(list(prompt) + list(ar[: m.position]))
        except Exception as err:  # a custom target transformers cannot load: report the mismatch anyway
            log.warning("could not recompute the float32 margin (%s: %s)", type(err).__name__, err)
            return m
        top = torch.topk(logits, 2).values
        m.margin_fp32 = float(top[0] - top[1])
        if m.ar_token is not None and m.method_token is not None:
            m.logit_gap_fp32 = float(logits[m.ar_token] - logits[m.method_token])
        return m
