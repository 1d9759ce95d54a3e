"""Context features: cheap per-round inputs a neural router may read beside the target's hidden state.

A router trained with ``context`` (``--model.context [entropy, prev_tau]``) sees, after the hidden state,
one value per named feature, in the order named:

- ``entropy``: the target's next-token entropy at the decision point (nats; a router dataset's ``entropy``);
- ``prev_slot``: the slot that drafted the round just verified (0 or 1; 0.5 before the first round);
- ``prev_tau``: that round's tau, bonus token included (0 before the first round).

Datagen's rows hold everything these need (``entropy``, ``active`` and both taus per round in order), so
:func:`context_from_rows` derives them for training and replay; :func:`context_now` computes the same
values in the decoding loop on the device, with no host read. In the data the previous round is the one
the logged path took (the tau oracle's); in decoding it is the router's own, which is what it saw.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["CONTEXT_FEATURES", "NO_SLOT", "check_context", "context_columns", "context_from_rows", "context_now",
           "entropy", "history_rows"]

CONTEXT_FEATURES = ("entropy", "prev_slot", "prev_tau")
"""The context features a router may be trained on, by name."""

NO_SLOT = 0.5
"""``prev_slot`` before the first round of a sequence: neither slot."""


def entropy(logits: Tensor) -> Tensor:
    """Next-token entropy in nats, computed in float32 (the entropy router's input and a context feature)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def check_context(names: Sequence[str] | None, what: str = "context") -> tuple[str, ...]:
    """``names`` as a tuple, each a known feature named once; ``ValueError`` naming ``what`` otherwise."""
    names = tuple(names or ())
    unknown = [n for n in names if n not in CONTEXT_FEATURES]
    if unknown or len(set(names)) != len(names):
        raise ValueError(f"{what}: expected distinct names among {', '.join(CONTEXT_FEATURES)}, got {list(names)}")
    return names


def context_columns(names: Sequence[str]) -> list[int]:
    """The columns of ``names`` in a ``context_from_rows(CONTEXT_FEATURES, ...)`` array (what a data module holds)."""
    return [CONTEXT_FEATURES.index(n) for n in names]


def context_from_rows(names: Sequence[str], prompt: np.ndarray, rnd: np.ndarray, ent: np.ndarray,
                      tau_0: np.ndarray, tau_1: np.ndarray, active: np.ndarray) -> np.ndarray:
    """``[rows, len(names)]`` float32 context of every row of a router dataset, in the rows' own order.

    A row's previous round is the row of the same prompt with round index one less; where there is none
    (round 0, or a gap) the features take their before-the-first-round values."""
    n = len(rnd)
    out = np.empty((n, len(names)), dtype=np.float32)
    order = np.lexsort((rnd, prompt))
    prev = np.full(n, -1, dtype=np.int64)  # row index of each row's previous round, -1 for none
    o_prompt, o_round = prompt[order], rnd[order]
    follows = (o_prompt[1:] == o_prompt[:-1]) & (o_round[1:] == o_round[:-1] + 1)
    prev[order[1:][follows]] = order[:-1][follows]
    has = prev >= 0
    p = np.where(has, prev, 0)
    slot = active[p].astype(np.int64)
    for j, name in enumerate(names):
        if name == "entropy":
            out[:, j] = ent
        elif name == "prev_slot":
            out[:, j] = np.where(has, slot, NO_SLOT)
        else:  # prev_tau
            out[:, j] = np.where(has, np.where(slot == 0, tau_0[p], tau_1[p]), 0)
    return out


def context_now(names: Sequence[str], logits: Tensor, prev_slot: float, prev_tau: Tensor | float) -> Tensor:
    """``[len(names)]`` float32 context at a decision point of the decoding loop, on ``logits``' device.

    ``prev_tau`` is the verified round's tau as the loop holds it (a 0-dim device tensor), or a number;
    the host values become fill kernels, never a copy from pageable memory that would wait for the GPU."""
    parts = []
    for name in names:
        if name == "entropy":
            parts.append(entropy(logits).reshape(()))
        elif name == "prev_slot":
            parts.append(logits.new_full((), float(prev_slot), dtype=torch.float32))
        elif isinstance(prev_tau, Tensor):
            parts.append(prev_tau.float().reshape(()))
        else:
            parts.append(logits.new_full((), float(prev_tau), dtype=torch.float32))
    return torch.stack(parts) if parts else logits.new_zeros(0, dtype=torch.float32)


def history_rows(prompt: np.ndarray, position: np.ndarray, history: int) -> np.ndarray:
    """``[rows, history]`` for every row of a dataset with a row at every position (``whiflash-datagen --path
    every``), in the rows' own order: the rows 1..history positions earlier in the same prompt, whose ``hidden``
    are the states a router with ``history`` reads beside the row's own. Before a prompt's first row it repeats
    that row: the decoding loop, too, starts its history at the first decision point (``NeuralPolicy``).
    ``ValueError`` when a prompt's rows are not one per position."""
    n = len(position)
    order = np.lexsort((position, prompt))
    p, pos = prompt[order], position[order]
    new = np.r_[True, p[1:] != p[:-1]] if n else np.zeros(0, bool)
    if n and np.any(np.diff(pos)[~new[1:]] != 1):
        raise ValueError("router history: the rows are not one per position of each prompt (a path's rows; the "
                         "previous positions' hidden states are in rows of whiflash-datagen --path every)")
    first = np.maximum.accumulate(np.where(new, np.arange(n), 0))  # each sorted row's prompt start
    out = np.empty((n, history), dtype=np.int64)
    for j in range(1, history + 1):
        out[order, j - 1] = order[np.maximum(np.arange(n) - j, first)]
    return out
