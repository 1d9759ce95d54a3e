"""Tokens/s terms for the router: the speed training label and the speed replay of a validation split.

Both take a latency profile (`whiflash-eval profile`, given as ``--data.latency_profile FILE``) and cost a
round as `whiflash-eval calibrate --replay` does: the slot's round as a routed slot (draft + verify + the
host's share + what routing adds, as the profile's loop rows measured) plus its catch-up of the rows
committed since it last drafted (Lazy Catch-up).

The speed label (``--data.label speed``) of a round is the difference of the two slots' tokens per
millisecond had that slot drafted it, in τ units::

    gain = (tau_0 / time_0 - tau_1 / time_1) * (round_0 + round_1) / 2
    time_s = round_s + catchup_s(rows committed since slot s last drafted on the logged path)

The logged path is the one datagen followed (``active``): the slot that advanced the sequence last
round pays the catch-up of its own τ; the other one the longer backlog a switch costs. Scaling by the
mean round time keeps the label in τ units, so the threshold grid of the τ label still fits.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from whiflash.calibration import best_threshold, picks_slot0, pinned_slot
from whiflash.latency import LatencyProfile, catchup_model
from whiflash.speed_oracle import DEFINITION, headline_rate, oracle_gain_share, simulate_prompts, speed_oracle

__all__ = ["LABELS", "speed_gain", "speed_report"]

NEURAL = "whiflash-neural"  # the threshold rule speed_report replays (whiflash.calibration)
LABELS = ("tau", "speed")
"""Training labels: ``tau`` = tau_0 - tau_1 (upstream's), ``speed`` = the tokens/s difference above."""


def _order(prompt: np.ndarray, rnd: np.ndarray) -> np.ndarray:
    """Row order by prompt, then round."""
    return np.lexsort((rnd, prompt))


def speed_gain(prompt: np.ndarray, rnd: np.ndarray, position: np.ndarray, tau_0: np.ndarray, tau_1: np.ndarray,
               active: np.ndarray, kinds: tuple[str, str], profile: LatencyProfile,
               tree_budget: int | None = None) -> np.ndarray:
    """The speed label of every row (float32, in the rows' own order); see the module docstring."""
    rounds = tuple(profile.round_ms(k, tree_budget, routed=True) for k in kinds)
    members = tuple(catchup_model(k) for k in kinds)
    scale = (rounds[0] + rounds[1]) / 2
    order = _order(prompt, rnd)
    out = np.empty(len(order), dtype=np.float32)
    taus = (tau_0.astype(np.int64), tau_1.astype(np.int64))
    kv: dict[str, int] = {}
    for j, i in enumerate(order.tolist()):
        pos = int(position[i])
        if j == 0 or prompt[i] != prompt[order[j - 1]]:  # a new prompt: every drafter took it in at the prefill
            kv = {m: pos for m in members}
        u = [taus[s][i] / (rounds[s] + profile.catchup_ms(kinds[s], pos - kv[members[s]])) for s in (0, 1)]
        out[i] = (u[0] - u[1]) * scale
        kv[members[int(active[i])]] = pos
    return out


def speed_report(scores: dict[str, np.ndarray], threshold: float | None, thresholds: Sequence[float],
                 categories: list[str], kinds: tuple[str, str], profile: LatencyProfile,
                 tree_budget: int | None = None, every_position: bool = False, in_pass: bool = True) -> dict[str, Any]:
    """The router's replayed tokens/s beside the speed oracle and the better standalone drafter, per category
    and overall, at ``threshold`` (None: the fastest of ``thresholds``, overall); overall also the fastest
    threshold of ``thresholds`` and its figures. ``calibrated_*``: each category at its own fastest threshold of
    ``thresholds`` and +-inf (each drafter alone), as ``whiflash-eval calibrate`` picks them; overall, those
    their prompts together (the headline rate). ``every_position``: the rows are one per position
    (``whiflash-datagen --path every``), and each replay walks its own path over them. ``in_pass``: the router
    decides inside the verify pass (``whiflash.routers.decides_in_pass``); one that does not pays the profile's
    after-pass decision every routed round (``LatencyProfile.decision_ms``).

    ``scores`` holds ``pred``, ``prompt``, ``round``, ``position``, ``tau_0``, ``tau_1`` and ``category`` codes."""
    order = _order(scores["prompt"], scores["round"])
    cols = {k: np.asarray(scores[k])[order] for k in ("prompt", "position", "tau_0", "tau_1", "category", "pred")}
    cols["prompt_id"] = cols["prompt"]
    cols["category"] = np.asarray(categories, dtype=object)[cols["category"]] if len(categories) else cols["category"]
    routed = tuple(profile.round_ms(k, tree_budget, routed=True) for k in kinds)  # a deciding router's rounds;
    plain = tuple(profile.round_ms(k, tree_budget) for k in kinds)  # a pinned slot's, like the standalone drafters'
    router_ms = profile.decision_ms(in_pass)  # and the oracle's, which decide nothing
    oracle = speed_oracle(cols, kinds, profile, tree_budget, every=every_position)["categories"]

    def replay(part: dict[str, np.ndarray], theta: float) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, ms) per prompt of `part`'s rows at threshold `theta`; an infinite one pins a slot
        (`pinned_slot`): that drafter alone, no decision to pay."""
        pinned = pinned_slot(NEURAL, theta) is not None
        tok, ms, _ = simulate_prompts(picks_slot0(NEURAL, part["pred"], theta), part, kinds,
                                      plain if pinned else routed, profile, 0.0 if pinned else router_ms,
                                      every=every_position)
        return tok, ms

    def rate(tok_ms: tuple[np.ndarray, np.ndarray]) -> float:
        return headline_rate(*tok_ms) * 1e3

    sweep = {float(t): rate(replay(cols, float(t))) for t in thresholds}
    fastest = best_threshold(sweep)
    threshold = fastest if threshold is None else threshold
    grid = sorted({-np.inf, *map(float, thresholds), np.inf})  # per category, as whiflash-eval calibrate picks
    out: dict[str, Any] = {}
    calibrated: list[tuple[np.ndarray, np.ndarray]] = []  # each category's prompts at its own threshold
    for cat, o in oracle.items():
        part = cols if cat == "all" else {k: v[cols["category"] == cat] for k, v in cols.items()}
        router = rate(replay(part, threshold))
        best = o["best_standalone_tokens_per_second"]
        out[cat] = {"rows": len(part["pred"]), "router_tokens_per_second": router,
                    "speed_oracle_tokens_per_second": o["tokens_per_second"], "best_standalone": o["best_standalone"],
                    "best_standalone_tokens_per_second": best, "speed_oracle_gain": o["oracle_gain"],
                    "share_of_speed_oracle_gain": oracle_gain_share(router, best, o["tokens_per_second"])}
        if cat != "all":
            replays = {t: replay(part, t) for t in grid}
            own = best_threshold({t: rate(r) for t, r in replays.items()})
            calibrated.append(replays[own])
            cal = rate(replays[own])
            out[cat].update(calibrated_threshold=own, calibrated_tokens_per_second=cal,
                            calibrated_share_of_speed_oracle_gain=oracle_gain_share(cal, best, o["tokens_per_second"]))
    overall = out.pop("all")
    calibrated_tps = rate((np.concatenate([t for t, _ in calibrated]), np.concatenate([m for _, m in calibrated])))
    overall.update(threshold=threshold, speed_best_threshold=fastest, speed_best_tokens_per_second=sweep[fastest],
                   speed_best_share_of_speed_oracle_gain=oracle_gain_share(
                       sweep[fastest], overall["best_standalone_tokens_per_second"],
                       overall["speed_oracle_tokens_per_second"]),
                   calibrated_tokens_per_second=calibrated_tps, calibrated_share_of_speed_oracle_gain=oracle_gain_share(
                       calibrated_tps, overall["best_standalone_tokens_per_second"],
                       overall["speed_oracle_tokens_per_second"]))
    return {"overall": overall, "per_category": out, "slots": list(kinds), "definition": DEFINITION,
            "latency_profile": profile.source}
