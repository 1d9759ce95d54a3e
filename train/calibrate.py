"""Calibrate WhiFlash-Entropy's threshold on logged rounds (no training).

The entropy router drafts with slot 0 (the parallel drafter) when the target's next-token entropy
is below theta (`whiflash.calibration.picks_slot0`). The chosen theta maximises the replayed tau
(pooled over rounds) on the data (`whiflash.calibration.best_threshold`: ties, the smaller theta).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from whiflash.calibration import best_threshold, picks_slot0
from whiflash.data import check_shards, read_manifest

DEFAULT_ENTROPIES = tuple(round(0.05 * i, 2) for i in range(1, 101))  # 0.05 .. 5 nats


def calibrate_entropy(data_dir: str | Path, thresholds: tuple[float, ...] = DEFAULT_ENTROPIES) -> dict[str, float]:
    """Best entropy threshold (nats) for a router dataset, with the replayed taus it gives.

    Returns threshold, tau at that threshold, each fixed slot's tau, the oracle's tau and the share
    of the oracle's gain over the best fixed slot that the threshold recovers.
    """
    manifest = read_manifest(data_dir)
    table = pq.read_table(check_shards(data_dir, manifest), columns=["entropy", "tau_0", "tau_1"])
    ent = table["entropy"].to_numpy().astype(np.float64)
    t0, t1 = (table[c].to_numpy().astype(np.float64) for c in ("tau_0", "tau_1"))
    n = max(len(ent), 1)
    sweep = {t: float(np.where(picks_slot0("whiflash-entropy", ent, t), t0, t1).sum() / n) for t in thresholds}
    best = best_threshold(sweep)
    slot0, slot1, oracle = t0.sum() / n, t1.sum() / n, np.maximum(t0, t1).sum() / n
    fixed = max(slot0, slot1)
    tau = sweep[best] if best is not None else float("nan")
    share = (tau - fixed) / (oracle - fixed) if oracle - fixed > 1e-12 else 0.0
    return {
        "threshold": float(best) if best is not None else float("nan"),
        "tau": float(tau),
        "tau_slot0": float(slot0),
        "tau_slot1": float(slot1),
        "tau_oracle": float(oracle),
        "share": float(share),
        "rounds": int(len(ent)),
    }
