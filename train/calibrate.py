"""Calibrate WhiFlash-Entropy's threshold on logged rounds (no training).

The entropy router drafts with slot 0 (the parallel drafter) when the target's next-token entropy
is below theta, i.e. when `-entropy > -theta`: the same replay as a neural router whose predicted
gain is `-entropy`. The chosen theta maximises the replayed tau (pooled over rounds) on the data.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import torch

from whiflash.data import check_shards, read_manifest
from whiflash.train.metrics import routing_summary

DEFAULT_ENTROPIES = tuple(round(0.05 * i, 2) for i in range(1, 101))  # 0.05 .. 5 nats


def calibrate_entropy(data_dir: str | Path, thresholds: tuple[float, ...] = DEFAULT_ENTROPIES) -> dict[str, float]:
    """Best entropy threshold (nats) for a router dataset, with the replayed taus it gives.

    Returns threshold, tau at that threshold, each fixed slot's tau, the oracle's tau and the share
    of the oracle's gain over the best fixed slot that the threshold recovers.
    """
    manifest = read_manifest(data_dir)
    table = pq.read_table(check_shards(data_dir, manifest), columns=["entropy", "tau_0", "tau_1"])
    ent = torch.from_numpy(table["entropy"].to_numpy()).float()
    t0 = torch.from_numpy(table["tau_0"].to_numpy()).long()
    t1 = torch.from_numpy(table["tau_1"].to_numpy()).long()
    s = routing_summary(-ent, t0, t1, thresholds=tuple(-t for t in thresholds))
    return {
        "threshold": -float(s["best_threshold"]),
        "tau": float(s["tau_best"]),
        "tau_slot0": float(s["tau_slot0"]),
        "tau_slot1": float(s["tau_slot1"]),
        "tau_oracle": float(s["tau_oracle"]),
        "share": float(s["share"]),
        "rounds": int(len(ent)),
    }
