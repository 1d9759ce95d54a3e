"""Per-round router data from oracle decoding (docs/design.md, "The router dataset").

Both slots draft from the same state every round and one target pass verifies their union, so
each round yields both acceptance lengths; the sequence advances along the slot with the larger
tau (ties: slot 1). The router's features - the target's final post-norm hidden state and its
next-token entropy at the last committed position - come with each round's record from
`generate`'s `on_round` callback; they stay on the device until the sequence ends, so recording
adds no host synchronisation to a round.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

import whiflash
from whiflash.decoding.routed import OracleDrafter
from whiflash.decoding.stats import RoundRecord
from whiflash.routers import entropy


def record_prompt(target: whiflash.runtime.model.Target, oracle: OracleDrafter, ids: list[int], max_new_tokens: int,
                  stop_token_ids: list[int] | None = None) -> dict[str, np.ndarray]:
    """Decode one prompt with the oracle; one row per round (features, both taus, the slot taken)."""
    hidden: list[Tensor] = []
    ent: list[Tensor] = []
    records: list[RoundRecord] = []

    def keep(record: RoundRecord) -> None:
        hidden.append(record.hidden)
        ent.append(entropy(record.logits))
        records.append(record)

    whiflash.generate(target, oracle, ids, max_new_tokens, stop_token_ids=stop_token_ids, on_round=keep)
    if not records:
        return {}
    return columns([r.position for r in records], torch.stack(hidden), torch.stack(ent),
                   np.array([r.slot_taus for r in records]), [r.slot for r in records])


def columns(positions: list[int], hidden: Tensor, ent: Tensor, taus: np.ndarray, active: list[int]
            ) -> dict[str, np.ndarray]:
    """A prompt's rows, one per round in order: the pending token's position, the router's features there
    (`hidden [R, H]`, `ent [R]`, on any device), both slots' `taus [R, 2]` and the slot each round took."""
    taus = np.asarray(taus, dtype=np.int16)
    return {
        "round": np.arange(len(positions), dtype=np.int32),
        "position": np.array(positions, dtype=np.int32),  # the pending token's position
        "hidden": hidden.to(torch.float16).cpu().numpy(),
        "entropy": ent.float().cpu().numpy(),
        "tau_0": taus[:, 0],
        "tau_1": taus[:, 1],
        "gain": (taus[:, 0] - taus[:, 1]).astype(np.float32),
        "active": np.array(active, dtype=np.int8),
    }
