"""How much of the speed oracle's gain a round-by-round router could take on a router dataset, and how much a linear
probe of the router's inputs does take.

    python scripts/router_headroom.py --data TB/router_data_df-e3 --latency-profile TB/profile.json \
        [--seed 0] [--json headroom.json]

The dataset must have a row at every position (`whiflash-datagen --parallel --path every`), so each policy walks its
own path. Its prompts are split at random (`--seed`) into five folds. Per category, over all prompts, under the
profile's costs (`whiflash.speed_oracle`: round + Lazy Catch-up, the bench's
headline rate over prompts):

- **alone**: each slot's drafter on every round; **oracle**: the speed oracle, each prompt's fastest slot sequence;
- **round winner**: every round takes the slot with more tokens per ms of its round *in that round* (the true τ of
  both): the best a router that decides one round at a time from what it predicts about that round can do, since it
  plans nothing; it pays the neural router's decision (inside the verify pass) each round;
- **linear probe**: a logistic regression of "slot 1 wins this round" (the round winner's label) on the router's
  inputs (final hidden state and entropy), cross-fitted: for each fold, fitted on the rows of three other folds, its
  threshold chosen on the walk of the fourth, and applied to the fold's own rows; with its AUC and the entropy's.

Each gets its share of the speed oracle's gain over the better slot alone (`oracle_gain_share`). A router whose
share is far below the round winner's is limited by how well its inputs rank the rounds; a round winner far below
half the gain says that no round-by-round decision reaches half of it, however good its inputs.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from whiflash.latency import LatencyProfile
from whiflash.speed_oracle import headline_rate, oracle_gain_share, simulate_prompts, speed_oracle
from whiflash.eval.replay import read_rounds

FOLDS = 5
THRESHOLDS = np.round(np.arange(0.05, 1.0, 0.05), 2)


def prompt_folds(prompt_ids: np.ndarray, seed: int) -> np.ndarray:
    """Per row, its prompt's fold (0 .. FOLDS - 1) in a seeded random split of the prompts."""
    names, inverse = np.unique(prompt_ids, return_inverse=True)
    fold_of = np.random.default_rng(seed).permutation(len(names)) % FOLDS
    return fold_of[inverse]


def _rows(cols: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[mask] for k, v in cols.items() if k != "hidden"}


def rate(slot0: np.ndarray, cols: dict[str, np.ndarray], kinds: tuple[str, str], profile: LatencyProfile,
         budget: int | None, decision_ms: float) -> float:
    """Tokens/s of walking `cols` (a row at every position) with slot 0 where `slot0`, the bench's headline rate."""
    rounds = (profile.round_ms(kinds[0], budget), profile.round_ms(kinds[1], budget))
    tokens, ms, _ = simulate_prompts(slot0, cols, kinds, rounds, profile, decision_ms, every=True)
    return headline_rate(tokens, ms) * 1e3


def round_winner(cols: dict[str, np.ndarray], kinds: tuple[str, str], profile: LatencyProfile,
                 budget: int | None) -> np.ndarray:
    """Per row, whether slot 0 yields at least as many tokens per ms of its round as slot 1 there."""
    return cols["tau_0"] / profile.round_ms(kinds[0], budget) >= cols["tau_1"] / profile.round_ms(kinds[1], budget)


def probe_decisions(features: np.ndarray, wins0: np.ndarray, folds: np.ndarray, cols: dict[str, np.ndarray],
                    rate_of: Any) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """(slot-0 decision, probability that slot 1 wins, per-fold thresholds) for every row of `cols`, cross-fitted
    over the folds; `rate_of(slot0, rows)` is the walk's tokens/s a threshold is chosen by."""
    slot0, prob, chosen = np.ones(len(wins0), bool), np.zeros(len(wins0)), []
    for k in range(FOLDS):
        test, val = folds == k, folds == (k + 1) % FOLDS
        train = ~(test | val)
        if not test.any():
            continue
        if len(set(wins0[train].tolist())) < 2:  # one slot wins every training round: the probe is that slot
            prob[test] = float(not wins0[train][0]) if train.any() else 0.0
            slot0[test] = prob[test] < 0.5
            chosen.append(0.5)
            continue
        probe = LogisticRegression(max_iter=500, C=0.1).fit(features[train], ~wins0[train])
        p_val = probe.predict_proba(features[val])[:, 1] if val.any() else np.zeros(0)
        t = max(THRESHOLDS, key=lambda t: rate_of(p_val < t, _rows(cols, val))) if val.any() else 0.5
        prob[test] = probe.predict_proba(features[test])[:, 1]
        slot0[test] = prob[test] < t
        chosen.append(float(t))
    return slot0, prob, chosen


def headroom(cols: dict[str, np.ndarray], kinds: tuple[str, str], profile: LatencyProfile,
             budget: int | None = None, seed: int = 0) -> dict[str, dict[str, Any]]:
    """Per category: rates (tokens/s) and shares of the speed oracle's gain for each policy of the module's
    docstring, the probe's per-fold thresholds and the AUCs."""
    decide = profile.router_ms("neural")
    wins0 = round_winner(cols, kinds, profile, budget)
    out: dict[str, dict[str, Any]] = {}
    for cat in sorted(set(cols["category"].tolist())):
        m = cols["category"] == cat
        rows, n = _rows(cols, m), int(m.sum())
        alone = [rate(np.full(n, s == 0), rows, kinds, profile, budget, 0.0) for s in (0, 1)]
        best = max(alone)
        oracle = speed_oracle(rows, kinds, profile, budget, every=True)["categories"][cat]["tokens_per_second"]
        winner = rate(wins0[m], rows, kinds, profile, budget, decide)
        features = np.c_[cols["hidden"][m].astype(np.float32), cols["entropy"][m].astype(np.float32)]
        slot0, prob, chosen = probe_decisions(features, wins0[m], prompt_folds(rows["prompt_id"], seed), rows,
                                              lambda s0, r: rate(s0, r, kinds, profile, budget, decide))
        probe = rate(slot0, rows, kinds, profile, budget, decide)
        two = len(set(wins0[m].tolist())) == 2
        out[cat] = {
            "prompts": len(np.unique(rows["prompt_id"])), "rows": n, "slot1_wins_share": float(1 - wins0[m].mean()),
            "alone": alone, "oracle": oracle, "oracle_gain": oracle / best - 1,
            "round_winner": winner, "round_winner_share": oracle_gain_share(winner, best, oracle),
            "probe": probe, "probe_share": oracle_gain_share(probe, best, oracle), "probe_thresholds": chosen,
            "probe_auc": float(roc_auc_score(~wins0[m], prob)) if two else None,
            "entropy_auc": float(roc_auc_score(~wins0[m], rows["entropy"])) if two else None}
    return out


def table(result: dict[str, dict[str, Any]], kinds: tuple[str, str]) -> str:
    """The result as a markdown table (tokens/s, shares of the oracle's gain)."""
    share = lambda v: "—" if v is None else f"{v:.2f}"  # noqa: E731
    lines = [f"| category | prompts | {kinds[1]} wins | {kinds[0]} alone | {kinds[1]} alone | oracle (gain) | "
             "round winner (share) | linear probe (share) | probe AUC | entropy AUC |", "|" + "---|" * 10]
    auc = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
    for cat, r in result.items():
        probe = f"{r['probe']:.0f} ({share(r['probe_share'])})"
        aucs = f"{auc(r['probe_auc'])} | {auc(r['entropy_auc'])}"
        lines.append(f"| {cat} | {r['prompts']} | {r['slot1_wins_share']:.1%} | {r['alone'][0]:.0f} | "
                     f"{r['alone'][1]:.0f} | {r['oracle']:.0f} ({r['oracle_gain']:+.1%}) | {r['round_winner']:.0f} "
                     f"({share(r['round_winner_share'])}) | {probe} | {aucs} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, type=Path, help="router dataset folder (rows at every position)")
    ap.add_argument("--latency-profile", required=True, type=Path, help="profile.json of `whiflash-eval profile`")
    ap.add_argument("--seed", type=int, default=0, help="seed of the prompts' split into folds")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args()
    profile = LatencyProfile.read(args.latency_profile, "--latency-profile")
    manifest, cols = read_rounds(args.data, with_hidden=True)
    if not manifest.every_position:
        raise SystemExit(f"--data {args.data}: its rows follow one decode's path; this needs a row at every position "
                         "(whiflash-datagen --parallel --path every)")
    kinds = manifest.pair.slots
    result = headroom(cols, kinds, profile, manifest.tree_budget, args.seed)
    print(table(result, kinds))
    if args.json:
        args.json.write_text(json.dumps({"data": str(args.data), "kinds": kinds, "seed": args.seed,
                                         "categories": result}, indent=1, default=float))


if __name__ == "__main__":
    main()
