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
  threshold chosen on the walk of the fourth, and applied to the fold's own rows; with its AUC and the entropy's;
- **state probe**, **+ previous round**: the same probe fitted on the decision states a decode can reach (each
  prompt's first row, and every row a round of either slot from an earlier row ends on: `decision_states`) rather
  than on every row, without and with that previous round's slot and τ (`prev_slot`, `prev_tau` of
  `whiflash.router_context`) beside the hidden state and entropy; each walks its prompts seeing the round it just
  made (`walk_states`). The pair says whether the previous round tells the rounds apart better than the hidden
  state alone, which a router trained on rows at every position cannot see.

Each gets its share of the speed oracle's gain over the better slot alone (`oracle_gain_share`). A router whose
share is far below the round winner's is limited by how well its inputs rank the rounds; a round winner far below
half the gain says that no round-by-round decision reaches half of it, however good its inputs.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from whiflash.latency import LatencyProfile
from whiflash.router_context import NO_SLOT
from whiflash.speed_oracle import headline_rate, oracle_gain_share, prompt_spans, simulate_prompts, speed_oracle
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
         budget: int | None, decision_ms: float, every: bool = True) -> float:
    """Tokens/s of walking `cols` (a row at every position) with slot 0 where `slot0`, the bench's headline rate;
    `every=False`: `cols` are the rounds of a walk already made, in order."""
    rounds = (profile.round_ms(kinds[0], budget), profile.round_ms(kinds[1], budget))
    tokens, ms, _ = simulate_prompts(slot0, cols, kinds, rounds, profile, decision_ms, every=every)
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


def decision_states(cols: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Every state a decode can decide in over rows at every position (rows ordered by prompt and position), each once:
    (its row, `[prev_slot, prev_tau]` of the round that led there). A prompt's first row has no previous round
    (`NO_SLOT`, τ 0); any other row is reached by a round of slot s at an earlier row that accepts up to it."""
    taus = np.stack([cols["tau_0"], cols["tau_1"]], 1).astype(np.int64)
    states: list[tuple[int, float, int]] = []
    for lo, hi in prompt_spans(np.asarray(cols["prompt_id"])):
        states.append((lo, NO_SLOT, 0))
        for s in (0, 1):
            ends = np.arange(lo, hi) + taus[lo:hi, s]
            states += [(int(j), float(s), int(t)) for j, t in zip(ends[ends < hi], taus[lo:hi, s][ends < hi])]
    unique = np.unique(np.array(states, dtype=np.float64), axis=0)
    return unique[:, 0].astype(np.int64), unique[:, 1:]


def walk_states(slot1: Callable[[int, float, int], bool], cols: dict[str, np.ndarray],
                spans: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(rows visited, slot-0 choice at each) of decoding the prompts of `spans` (row ranges of rows at every position)
    with a policy that sees the round it just made: `slot1(row, prev_slot, prev_tau)` is True for slot 1."""
    taus = np.stack([cols["tau_0"], cols["tau_1"]], 1).astype(np.int64)
    rows: list[int] = []
    took: list[bool] = []
    for lo, hi in spans:
        i, prev = lo, (NO_SLOT, 0)
        while i < hi:
            s = int(bool(slot1(i, *prev)))
            rows.append(i)
            took.append(s == 0)
            prev = (float(s), int(taus[i, s]))
            i += prev[1]
    return np.array(rows, dtype=np.int64), np.array(took, dtype=bool)


def state_probe(features: np.ndarray, wins0: np.ndarray, cols: dict[str, np.ndarray], folds: np.ndarray,
                with_prev: bool, rate_of: Callable[[np.ndarray, np.ndarray], float]) -> float:
    """Tokens/s of a linear probe fitted on `decision_states` (`with_prev`: their previous round beside `features`),
    cross-fitted as `probe_decisions` and walked with `walk_states`; `rate_of(rows, slot0)` rates a walk."""
    rows, prev = decision_states(cols)
    prev = prev / np.array([1.0, 8.0])  # tau on the hidden state's scale
    spans = prompt_spans(np.asarray(cols["prompt_id"]))
    fold_of_span = [int(folds[lo]) for lo, _ in spans]
    visited: list[np.ndarray] = []
    took: list[np.ndarray] = []
    for k in range(FOLDS):
        test = [sp for sp, f in zip(spans, fold_of_span) if f == k]
        val = [sp for sp, f in zip(spans, fold_of_span) if f == (k + 1) % FOLDS]
        train = (folds[rows] != k) & (folds[rows] != (k + 1) % FOLDS)
        if not test:
            continue
        x = np.c_[features[rows[train]], prev[train]] if with_prev else features[rows[train]]
        y = ~wins0[rows[train]]
        if len(set(y.tolist())) < 2:  # one slot wins every training state: the probe is that slot
            slot1 = bool(y[0]) if len(y) else False
            policy = lambda t: (lambda i, ps, pt: slot1)  # noqa: E731
        else:
            fit = LogisticRegression(max_iter=500, C=0.1).fit(x, y)
            w, base = fit.coef_[0], features @ fit.coef_[0][: features.shape[1]] + fit.intercept_[0]
            wp = w[features.shape[1]:] if with_prev else np.zeros(2)
            policy = lambda t, base=base, wp=wp: (  # noqa: E731
                lambda i, ps, pt: base[i] + wp[0] * ps + wp[1] * pt / 8.0 >= np.log(t / (1 - t)))
        t = max(THRESHOLDS, key=lambda t: rate_of(*walk_states(policy(t), cols, val))) if val else 0.5
        r, s0 = walk_states(policy(t), cols, test)
        visited.append(r)
        took.append(s0)
    return rate_of(np.concatenate(visited), np.concatenate(took))


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
        folds = prompt_folds(rows["prompt_id"], seed)
        slot0, prob, chosen = probe_decisions(features, wins0[m], folds, rows,
                                              lambda s0, r: rate(s0, r, kinds, profile, budget, decide))
        probe = rate(slot0, rows, kinds, profile, budget, decide)
        walk_rate = lambda visited, s0: rate(  # noqa: E731
            s0, {k: v[visited] for k, v in rows.items()}, kinds, profile, budget, decide, every=False)
        states = [state_probe(features, wins0[m], rows, folds, with_prev, walk_rate) for with_prev in (False, True)]
        two = len(set(wins0[m].tolist())) == 2
        out[cat] = {
            "prompts": len(np.unique(rows["prompt_id"])), "rows": n, "slot1_wins_share": float(1 - wins0[m].mean()),
            "alone": alone, "oracle": oracle, "oracle_gain": oracle / best - 1,
            "round_winner": winner, "round_winner_share": oracle_gain_share(winner, best, oracle),
            "probe": probe, "probe_share": oracle_gain_share(probe, best, oracle), "probe_thresholds": chosen,
            "state_probe": states[0], "state_probe_share": oracle_gain_share(states[0], best, oracle),
            "state_probe_prev": states[1], "state_probe_prev_share": oracle_gain_share(states[1], best, oracle),
            "probe_auc": float(roc_auc_score(~wins0[m], prob)) if two else None,
            "entropy_auc": float(roc_auc_score(~wins0[m], rows["entropy"])) if two else None}
    return out


def table(result: dict[str, dict[str, Any]], kinds: tuple[str, str]) -> str:
    """The result as a markdown table (tokens/s, shares of the oracle's gain)."""
    share = lambda v: "—" if v is None else f"{v:.2f}"  # noqa: E731
    lines = [f"| category | prompts | {kinds[1]} wins | {kinds[0]} alone | {kinds[1]} alone | oracle (gain) | "
             "round winner (share) | linear probe (share) | state probe (share) | + previous round (share) | "
             "probe AUC | entropy AUC |", "|" + "---|" * 12]
    auc = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
    for cat, r in result.items():
        probe = " | ".join(f"{r[k]:.0f} ({share(r[k + '_share'])})" for k in ("probe", "state_probe", "state_probe_prev"))
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
