"""Calibrate's fast replay mode: thresholds from datagen rows and a latency profile, without decoding.

`whiflash-eval calibrate --replay DATAGEN_DIR --latency-profile FILE`. A router dataset logs, every
round, the router's inputs (the target's entropy and final hidden state) and the τ of both slots
from the same state. Replaying a threshold picks a slot per round from those inputs; the round
then yields that slot's τ and costs, from the profile: one routing decision + that slot's round
(draft + verify) + its catch-up of the rows committed since it last drafted (Lazy Catch-up; every
drafter took in the prompt during `generate`'s prefill, which the bench does not time). With
`--whiflash-no-lazy-catchup` the other slot's model also catches up every round, as the engine does then.

Per category, estimated tokens/s = 1 / the mean over prompts of each prompt's Σ round time / Σ τ (its time per
output token), and estimated speedup = that over AR's one token per AR step: the bench's headline, mean AR TPOT /
mean method TPOT, where every prompt weighs the same whatever its length. The fastest threshold wins (ties: the
smaller). Like the τ replay of `whiflash-train`, this assumes a round's τ does not depend on which slot drafted
earlier rounds (the data followed the oracle's path), so it ranks thresholds; `bench` measures. On a
dataset with a row at every position (`whiflash-datagen --parallel --path every`) each threshold's replay
walks its own path instead: a round at position `n` advances to the row of `n + τ` of the slot it took,
so the replay counts the positions that threshold's decode visits, not those another path visited.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Collection

import numpy as np
import torch

from whiflash.calibration import METHODS, pick_threshold, picks_slot0, pinned_slot
from whiflash.latency import LatencyProfile, slot_kind
from whiflash.router_context import context_from_rows, history_rows
from whiflash.routers import decides_in_pass
# the cost model, shared with the speed oracle and whiflash-train
from whiflash.speed_oracle import headline_rate, ruled, simulate, simulate_prompts, stick, stuck_walk

log = logging.getLogger(__name__)

__all__ = ["ESTIMATE", "replay_thresholds", "rows_of_prompts", "simulate"]

ESTIMATE = ("replayed from datagen rows: per round the chosen slot's tau, costed as router + that slot's round "
            "(draft + verify) + its catch-up (lazy, or both slots' every round without Lazy Catch-up) from the latency "
            "profile; tokens/s = 1 / mean over prompts of each prompt's sum time / sum tau (the bench's mean TPOT), "
            "speedup = tokens/s x AR step time")
"""How a replay estimate is made, written into thresholds.json."""


def read_rounds(data_dir: str | Path, with_hidden: bool) -> tuple[Any, dict[str, np.ndarray]]:
    """(manifest, columns) of a router dataset, rows ordered by prompt and round."""
    import pyarrow.parquet as pq

    from whiflash.data import check_shards, read_manifest

    manifest = read_manifest(data_dir)
    names = ["prompt_id", "category", "round", "position", "entropy", "tau_0", "tau_1", "active"]
    table = pq.read_table(check_shards(data_dir, manifest), columns=names + (["hidden"] if with_hidden else []))
    if table.num_rows == 0:
        raise ValueError(f"--replay {data_dir}: the dataset has no rows")
    cols = {n: table.column(n).to_numpy() for n in names}
    if with_hidden:
        chunks = table.column("hidden").chunks
        cols["hidden"] = np.concatenate([c.flatten().to_numpy().reshape(-1, manifest.hidden_size) for c in chunks])
    order = np.lexsort((cols["round"], cols["prompt_id"]))
    return manifest, {k: v[order] for k, v in cols.items()}


def rows_of_prompts(cols: dict[str, np.ndarray], prompt_ids: Collection[str]) -> dict[str, np.ndarray] | None:
    """The rows of `cols` whose prompt is among `prompt_ids` (a bench run's sample ids), or None when none is."""
    keep = np.isin(cols["prompt_id"], sorted(prompt_ids))
    return {k: v[keep] for k, v in cols.items()} if keep.any() else None


def replay_thresholds(data_dir: str | Path, profile_path: str | Path, method: str, values: list[float],
                      neural_router: str | None = None, lazy: bool = True,
                      stick_tau: int | None = None, samples: Collection[str] | None = None,
                      tau_rule: tuple[int, int] | None = None, min_gain: float = 0.0,
                      confidence: float = 0.0) -> dict[str, Any]:
    """Per category (and `all`), every threshold's estimated speedup and the fastest one; the body of
    thresholds.json (without the run bookkeeping). `stick_tau`: as `--whiflash-stick-tau` (`stick`; over rows at
    every position `stuck_walk`); `tau_rule`: as `--whiflash-tau-rule` (`ruled`: a routing threshold picks each
    prompt's first slot, the rule every later one).
    `samples`: replay only these prompts' rows (a bench run's sample ids, `--replay-run`). `min_gain`: a finite
    threshold only where it beats a drafter alone by that share; `confidence` (0: off): and only where its
    prompts show a gain with that probability (`pick_threshold`). A neural router's
    replay leaves out the rows of the prompts it was trained on, where its export lists them."""
    if method not in METHODS:
        raise ValueError(f"--calibrate-method: expected whiflash-entropy or whiflash-neural, got {method!r}")
    if stick_tau is not None and tau_rule is not None:
        raise ValueError("--whiflash-tau-rule and --whiflash-stick-tau both decide from earlier rounds' tau; "
                         "give one of them")
    profile = LatencyProfile.read(profile_path, flag="--latency-profile")
    manifest, cols = read_rounds(data_dir, with_hidden=method == "whiflash-neural")
    if samples is not None:
        cols = rows_of_prompts(cols, samples)
        if cols is None:
            raise ValueError(f"--replay-run: none of its {len(samples)} samples are among the prompts of {data_dir} "
                             "(expected rows of the same prompts: whiflash-datagen --prompts testbed:test with "
                             "--per-category the bench's --max-samples)")
    excluded = 0
    if method == "whiflash-neural" and neural_router:
        cols, excluded = _without_training_prompts(cols, neural_router, data_dir)
    kinds, budget = manifest.pair.slots, manifest.tree_budget
    every = manifest.every_position  # a row at every position: each choice walks its own path
    rounds = tuple(profile.round_ms(k, budget) for k in kinds)  # a slot missing from the profile fails here
    routed_rounds = tuple(profile.round_ms(k, budget, routed=True) for k in kinds)  # what a deciding policy pays
    # the router's input per round: the entropy, or the neural router's predicted gain
    if method == "whiflash-entropy":
        score, router_ms = cols["entropy"].astype(np.float64), profile.router_ms("entropy")
    else:
        score, in_pass = _neural_scores(neural_router, manifest, cols)
        router_ms = profile.decision_ms(in_pass)  # a router reading earlier positions decides after the pass
    ar = profile.ar_ms()
    from whiflash.speed_oracle import DEFINITION, speed_oracle

    oracle = speed_oracle({k: v for k, v in cols.items() if k != "hidden"}, kinds, profile, budget, lazy,
                          every)["categories"]
    details: dict[str, Any] = {}
    for cat in [*sorted(set(cols["category"].tolist())), "all"]:
        sel = np.ones(len(score), bool) if cat == "all" else cols["category"] == cat
        part = {k: v[sel] for k, v in cols.items() if k != "hidden"}

        def speedup(slot0: np.ndarray, decide: bool = True) -> tuple[float, float, dict[int, float]]:
            rows, walk = part, every
            if every and stick_tau is not None:  # the rule reads the rounds the walk itself takes
                idx, slot0, routed = stuck_walk(slot0, part, stick_tau)
                rows, walk = {k: v[idx] for k, v in part.items()}, False
            else:
                slot0, routed = stick(slot0, part["tau_0"], part["prompt_id"], stick_tau)
            if decide:  # (a drafter alone follows no rule)
                slot0 = ruled(slot0, rows, tau_rule, walk)
            tokens, ms, n = simulate_prompts(slot0, rows, kinds, routed_rounds if decide else rounds, profile,
                                             router_ms if decide else 0.0, lazy, routed, walk)
            # each prompt's ms per token, by its place in the rows (every prompt takes a round)
            return headline_rate(tokens, ms) * ar, tokens.sum() / n, dict(enumerate((ms / tokens).tolist()))

        # an infinite threshold pins a slot: that drafter alone, no decision to pay
        sweep = {v: speedup(picks_slot0(method, score[sel], v), pinned_slot(method, v) is None) for v in sorted(values)}
        best, bounds = pick_threshold({v: s for v, (s, _, _) in sweep.items()}, min_gain, confidence,
                                      {v: t for v, (_, _, t) in sweep.items()})
        details[cat] = {"threshold": best, "speedup": sweep[best][0], "tokens_per_second": sweep[best][0] / ar * 1e3,
                        "tau": sweep[best][1], "sweep": {str(v): s for v, (s, _, _) in sweep.items()},
                        "tau_sweep": {str(v): t for v, (_, t, _) in sweep.items()},
                        **({"gain_lower_bound": bounds} if bounds else {}),
                        "fixed": {f"slot{s}": speedup(np.full(sel.sum(), s == 0), False)[0] for s in (0, 1)}}
        details[cat].update(_oracle_columns(oracle[cat], details[cat]["tokens_per_second"], ar))
    overall = details.pop("all")
    return {"method": method, "mode": "replay", "thresholds": {c: d["threshold"] for c, d in details.items()},
            "default": overall["threshold"], "details": details, "overall": overall,
            "samples": sorted(set(cols["prompt_id"].tolist())), "excluded_training_prompts": excluded,
            "data": str(data_dir),
            "latency_profile": str(profile_path), "pair": str(manifest.pair), "tree_budget": manifest.tree_budget,
            "slots": [slot_kind(k, budget) for k in kinds], "rounds": int(len(score)),
            "device": profile.meta.get("device"), "lazy_catchup": lazy, "stick_tau": stick_tau,
            "tau_rule": list(tau_rule) if tau_rule else None, "min_gain": min_gain,
            "min_gain_confidence": confidence, "estimate": ESTIMATE,
            "speed_oracle_definition": DEFINITION}


def _without_training_prompts(cols: dict[str, np.ndarray], router: str,
                              data_dir: str | Path) -> tuple[dict[str, np.ndarray], int]:
    """`cols` without the rows of the prompts the router was fitted on (`TRAINING_PROMPTS` beside its export),
    and how many prompts that left out: on its own training rows a router looks better than anywhere else."""
    from whiflash.router import TRAINING_PROMPTS, training_prompts

    trained = training_prompts(router)
    if not trained:
        return cols, 0
    seen = np.isin(cols["prompt_id"], trained)
    if seen.all():
        raise ValueError(f"--replay {data_dir}: every prompt of it is one the router --whiflash-neural-router-path "
                         f"{router} was trained on ({TRAINING_PROMPTS}); replay rows of other prompts (its "
                         "validation split, or whiflash-datagen on the prompts to calibrate for)")
    return {k: v[~seen] for k, v in cols.items()}, len(set(cols["prompt_id"][seen].tolist()))


def _oracle_columns(oracle: dict[str, Any], router_tps: float, ar_ms: float) -> dict[str, Any]:
    """The speed oracle's figures beside a router's estimate, and the router's share of the oracle's gain."""
    from whiflash.speed_oracle import oracle_gain_share

    best = oracle["best_standalone_tokens_per_second"]
    return {"speed_oracle_tokens_per_second": oracle["tokens_per_second"], "speed_oracle_speedup": oracle["speedup"],
            "speed_oracle_tau": oracle["tau"], "best_standalone": oracle["best_standalone"],
            "best_standalone_tokens_per_second": best, "best_standalone_speedup": best * ar_ms / 1e3,
            "speed_oracle_gain": oracle["oracle_gain"],
            "share_of_speed_oracle_gain": oracle_gain_share(router_tps, best, oracle["tokens_per_second"])}


def _neural_scores(path: str | None, manifest: Any, cols: dict[str, np.ndarray]) -> tuple[np.ndarray, bool]:
    """The router's predicted gain for every row (the router must match the data's pair and width), its
    context features, if it reads any, along the logged path (`whiflash.router_context`); and whether it
    decides inside the verify pass (`whiflash.routers.decides_in_pass`), which sets what a decision costs."""
    import whiflash

    if not path:
        raise ValueError("--calibrate-method whiflash-neural --replay needs --whiflash-neural-router-path "
                         "(Hub id, folder or .safetensors file)")
    router = whiflash.load_router(path, hidden_size=manifest.hidden_size, pair=manifest.pair,
                                  tree_budget=manifest.tree_budget).eval()
    hidden = cols["hidden"]
    if router.history:  # the states of the positions before each decision point: the previous rows'
        if not manifest.every_position:
            raise ValueError(f"--whiflash-neural-router-path {path}: the router reads the states of the "
                             f"{router.history} positions before each decision point, which only rows at every "
                             "position hold (whiflash-datagen --parallel --path every); replay it on such rows")
        earlier = history_rows(cols["prompt_id"], cols["position"], router.history)
        hidden = np.concatenate([hidden, *(hidden[earlier[:, j]] for j in range(router.history))], axis=1)
    context = torch.from_numpy(context_from_rows(router.context, cols["prompt_id"], cols["round"], cols["entropy"],
                                                 cols["tau_0"], cols["tau_1"], cols["active"]))
    with torch.no_grad():
        gains = np.concatenate([router(torch.from_numpy(hidden[i : i + 8192]).float(),
                                       context[i : i + 8192] if router.context else None).numpy()
                                for i in range(0, len(hidden), 8192)]).astype(np.float64)
    return gains, decides_in_pass(router)
