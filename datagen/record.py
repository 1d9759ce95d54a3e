"""Per-round router data from oracle decoding (DESIGN.md sections 5-6).

Both slots draft from the same state every round and one target pass verifies their union, so
each round yields both acceptance lengths; the sequence advances along the slot with the larger
tau (ties: slot 1). The router's features - the target's final post-norm hidden state and its
next-token entropy at the last committed position - are taken at every decision point and kept
on the device until the sequence ends, so recording adds no host synchronisation to a round.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

import whiflash
from whiflash.decoding.routed import RoutedDrafter
from whiflash.routers import OracleRouter, entropy


class OracleRecorder(RoutedDrafter):
    """The oracle routed drafter, also keeping the router features of every round."""

    def __init__(self, pair: str, **slots: Any) -> None:
        super().__init__(pair, OracleRouter(), **slots)
        self.features: list[tuple[Tensor, Tensor]] = []

    def reset(self, target: Any, max_len: int, temperature: float = 0.0) -> None:
        super().reset(target, max_len, temperature)
        self.features = []

    def decide(self, hidden: Tensor, logits: Tensor, picked: Tensor | None) -> Tensor | None:
        self.features.append((hidden.detach().clone(), entropy(logits)))
        return super().decide(hidden, logits, picked)


def record_prompt(target: Any, recorder: OracleRecorder, ids: list[int], max_new_tokens: int,
                  stop_token_ids: list[int] | None = None) -> dict[str, np.ndarray]:
    """Decode one prompt with the oracle; one row per round (features, both taus, the slot taken)."""
    _, stats = whiflash.generate(target, recorder, ids, max_new_tokens, stop_token_ids=stop_token_ids)
    rounds = stats.rounds
    if rounds == 0:
        return {}
    # decision k is taken before round k (k = 0 after prefill); the last one starts no round
    hidden = torch.stack([h for h, _ in recorder.features[:rounds]]).to(torch.float16).cpu().numpy()
    ent = torch.stack([e for _, e in recorder.features[:rounds]]).float().cpu().numpy()
    taus = np.array(recorder.tau_log, dtype=np.int16)
    position = len(ids) + np.concatenate([[0], np.cumsum(stats.taus[:-1])]).astype(np.int32)
    return {
        "round": np.arange(rounds, dtype=np.int32),
        "position": position,  # absolute position of the pending token when the round starts
        "hidden": hidden,
        "entropy": ent,
        "tau_0": taus[:, 0],
        "tau_1": taus[:, 1],
        "gain": (taus[:, 0] - taus[:, 1]).astype(np.float32),
        "active": np.array(stats.slots, dtype=np.int8),
    }
