"""Synthetic router datasets in the datagen format (docs/design.md, "The router dataset"), with a planted,
learnable signal.

Hidden states are Gaussian with per-dimension offsets and scales (so input standardisation matters) and a
per-prompt component (so rows of one prompt are correlated and a row-level split would leak). Along a hidden
unit direction ``w`` the latent ``s = z . w`` drives both acceptance lengths in opposite directions, plus a
mild non-linear term along a second direction and per-category offsets; integer taus are clipped to 1..16
and carry independent noise, so even a perfect router stays below the oracle.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm.auto import tqdm

from whiflash.data import RouterDatasetManifest, ShardEntry, write_manifest, write_shard
from whiflash.folders import ROUTER_DATASET, check_folder
from whiflash.pairs import Pair
from whiflash.versions import package_versions

log = logging.getLogger(__name__)


def write_synthetic_dataset(
    out_dir: str | Path,
    *,
    num_prompts: int,
    rounds_per_prompt: int,
    hidden_size: int,
    seed: int = 0,
    signal: float = 1.0,
    noise: float = 1.0,
    categories: Sequence[str] = ("code", "math", "prose"),
    pair: str | Pair = "df-e3",
    tree_budget: int | None = None,
    target: str = "synthetic-target",
    rows_per_shard: int = 32768,
    progress: bool = True,
) -> RouterDatasetManifest:
    """Write ``num_prompts * rounds_per_prompt`` rounds as Parquet shards + ``manifest.json`` into ``out_dir``.

    Args:
        pair: the drafter pair the rows claim to come from; each slot's drafter is named by its kind.
        signal: strength of the planted dependence of the gain on the hidden state (0 = none).
        noise: standard deviation of the per-slot noise added to tau before rounding.
        rows_per_shard: approximate rows per shard (shards hold whole prompts).

    Returns:
        The manifest that was written.
    """
    pair = Pair.parse(pair, what="pair")
    if num_prompts < 1 or rounds_per_prompt < 1 or hidden_size < 2:
        raise ValueError("need num_prompts >= 1, rounds_per_prompt >= 1 and hidden_size >= 2")
    out = Path(out_dir)
    check_folder(out, ROUTER_DATASET, "out_dir")  # never over a datagen run, a testbed or foreign files
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(hidden_size)
    w /= np.linalg.norm(w)
    v = rng.standard_normal(hidden_size)
    v -= (v @ w) * w
    v /= np.linalg.norm(v)
    offset = (0.5 * rng.standard_normal(hidden_size)).astype(np.float32)
    scale = np.exp(0.5 * rng.standard_normal(hidden_size)).astype(np.float32)
    cat_shift = {c: 0.5 * (i - (len(categories) - 1) / 2) for i, c in enumerate(categories)}

    prompts_per_shard = max(1, rows_per_shard // rounds_per_prompt)
    shards = []
    starts = range(0, num_prompts, prompts_per_shard)
    for k, p0 in enumerate(tqdm(starts, desc="synthetic shards", disable=not progress)):
        p1 = min(num_prompts, p0 + prompts_per_shard)
        srng = np.random.default_rng([seed, k])  # one stream per shard: reproducible shard by shard
        shards.append(_write_one(out / f"shard-{k:05d}.parquet", srng, p0, p1, rounds_per_prompt, hidden_size,
                                 w, v, offset, scale, categories, cat_shift, signal, noise))
    manifest = RouterDatasetManifest(
        target=target, pair=pair, drafter_ids=pair.slots, tree_budget=tree_budget, tap_layers=[],
        hidden_size=hidden_size, seed=seed, shards=shards, versions=package_versions("numpy", "pyarrow", "whiflash"),
        prompt_sets=[{"name": "synthetic", "categories": list(categories), "num_prompts": num_prompts}],
        generator={"name": "whiflash.train.synthetic", "signal": signal, "noise": noise,
                   "rounds_per_prompt": rounds_per_prompt},
    )
    write_manifest(out, manifest)
    log.info("wrote %d rows in %d shards to %s", manifest.num_rows, len(shards), out)
    return manifest


def _write_one(path: Path, rng: np.random.Generator, p0: int, p1: int, rounds: int, hidden_size: int,
               w: np.ndarray, v: np.ndarray, offset: np.ndarray, scale: np.ndarray, categories: Sequence[str],
               cat_shift: dict[str, float], signal: float, noise: float) -> ShardEntry:
    n_p, n = p1 - p0, (p1 - p0) * rounds
    cats = [categories[i % len(categories)] for i in range(p0, p1)]
    shift = np.repeat(np.array([cat_shift[c] for c in cats], dtype=np.float32), rounds)
    # z: unit-variance latent per round = 0.6 * per-prompt part + 0.8 * per-round part (+ category shift along w).
    z = rng.standard_normal((n, hidden_size), dtype=np.float32)
    z *= 0.8
    z += 0.6 * np.repeat(rng.standard_normal((n_p, hidden_size), dtype=np.float32), rounds, axis=0)
    z += np.outer(shift, w.astype(np.float32))
    s, u = z @ w.astype(np.float32), z @ v.astype(np.float32)
    tau_0 = 4.0 + signal * (2.0 * s + 0.7 * (u * u - 1.0)) + noise * rng.standard_normal(n)
    tau_1 = 4.0 - signal * 1.0 * s + noise * rng.standard_normal(n)
    tau_0 = np.clip(np.rint(tau_0), 1, 16).astype(np.int16)
    tau_1 = np.clip(np.rint(tau_1), 1, 16).astype(np.int16)
    active = np.where(tau_0 > tau_1, 0, 1).astype(np.int8)  # datagen default: advance along the larger tau, ties slot 1
    step = np.maximum(tau_0, tau_1).astype(np.int32).reshape(n_p, rounds)
    start = rng.integers(16, 80, size=(n_p, 1), dtype=np.int32)
    position = (start + np.cumsum(step, axis=1) - step).reshape(-1)
    entropy = np.log1p(np.exp(1.0 - 1.2 * s + 0.5 * rng.standard_normal(n))).astype(np.float32)
    z *= scale
    z += offset
    columns = {
        "prompt_id": np.repeat([f"{c}-{i:07d}" for c, i in zip(cats, range(p0, p1))], rounds),
        "category": np.repeat(cats, rounds),
        "round": np.tile(np.arange(rounds, dtype=np.int32), n_p),
        "position": position,
        "hidden": z.astype(np.float16),
        "entropy": entropy,
        "tau_0": tau_0,
        "tau_1": tau_1,
        "gain": (tau_0.astype(np.float32) - tau_1.astype(np.float32)),
        "active": active,
    }
    return write_shard(path, columns, hidden_size)
