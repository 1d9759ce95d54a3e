"""Does DFlash's own confidence in its block say where EAGLE-3 should draft instead?

    python scripts/probe_draft_confidence.py --testbed TB --latency-profile TB/profile.json [--prompts 40]
        [--tokens 256] [--source testbed:dev] [--device cuda --dtype bfloat16] [--out probe.json]

A router decides before either drafter drafts, from the target's state alone. A block drafter's block comes from
one cheap pass (DFlash's draft is ~15% of its round), and its per-depth top-1 probabilities p_1 .. p_(b-1) give
its own estimate of the tokens it will get accepted, E = 1 + sum_k prod_(j<=k) p_j. A draft-first policy drafts
with DFlash every round, verifies the block when E >= theta, and otherwise drafts with EAGLE-3 and verifies that,
having paid for a DFlash draft it threw away.

For each prompt of `--source` (a datagen source, `--prompts` a category), at every position a round can start at
(rows as `whiflash-datagen --parallel --path every` makes them): both drafters' tau, DFlash's E and the target's
next-token entropy. Printed per category, over the same rows:

- how well each signal ranks DFlash's tau (Spearman) and finds the rounds where EAGLE-3 yields more tokens per ms
  of its round (AUC);
- speeds under the latency profile (`whiflash.speed_oracle`: round + catch-up, headline rate over prompts):
  each drafter alone, the speed oracle, the entropy threshold (`whiflash-entropy`, deciding before drafting) and
  the draft-first confidence threshold (every EAGLE-3 round + a DFlash draft and catch-up) and, as the bound of any
  draft-first policy that reads DFlash's block alone, the same threshold on DFlash's true tau; beside it a router
  that knew EAGLE-3's true tau before the round (slot 0 below a threshold, a neural decision's cost); each threshold
  fitted on half the prompts and scored on the other half (both ways round); and the share of the speed oracle's
  gain each gets.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import spearmanr
from sklearn.metrics import roc_auc_score
from tqdm import tqdm

import whiflash
from whiflash.datagen.prompts import read_source
from whiflash.decoding.greedy import greedy_batch
from whiflash.drafters.base import Commit
from whiflash.drafters.dflash import chain_tau
from whiflash.latency import LatencyProfile
from whiflash.routers import entropy
from whiflash.session import Session, model_paths
from whiflash.speed_oracle import headline_rate, oracle_gain_share, simulate_prompts, speed_oracle

KINDS = ("dflash", "eagle3")


def rows_of_prompt(target: Any, dflash: Any, eagle3: Any, ids: list[int], new: list[int], stops: set[int],
                   chunk: int = 64) -> dict[str, np.ndarray] | None:
    """Every position a round can start at in the greedy continuation `new` of `ids` (before its first stop token;
    `new` reaches the longer draft and its bonus past the last): both drafters' tau, DFlash's expected tau E from its
    block's top-1 probabilities, the target's entropy there. None when the first new token is a stop token."""
    room = len(new) - max(dflash.draft_length, eagle3.draft_length) - 1
    end = min(next((i for i, t in enumerate(new) if t in stops), room), room)
    if end <= 0:
        return None
    sequence, first = list(ids) + new, len(ids)
    target.setup_cache(len(sequence))
    seq = torch.tensor(sequence, dtype=torch.long, device=target.device)
    taps = tuple(sorted(set(dflash.tap_layers) | set(eagle3.tap_layers)))
    out = target.full_pass(seq, taps)
    commit = Commit(out.feats, seq[1:], 0, taps)
    for member in (dflash, eagle3):
        member.reset(target, target.max_len)
    starts = torch.arange(first, first + end, device=target.device)
    t0, t1, conf = [], [], []
    for i in range(0, len(starts), chunk):
        s = starts[i : i + chunk]
        logits = dflash.blocks_at(dflash.select_taps(commit), seq, s)
        truth = seq[s[:, None] + torch.arange(1, dflash.block_size, device=seq.device)]
        t0.append(chain_tau(logits, truth))
        top = logits.float().softmax(-1).amax(-1)
        conf.append(1 + top.cumprod(1).sum(1))
        t1.append(eagle3.taus(eagle3.select_taps(commit), seq, s))
    ent = entropy(out.logits[starts - 1])
    return {"position": starts.cpu().numpy(), "tau_0": torch.cat(t0).cpu().numpy(),
            "tau_1": torch.cat(t1).cpu().numpy(), "confidence": torch.cat(conf).cpu().numpy(),
            "entropy": ent.float().cpu().numpy()}


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation, ties at their mean rank (taus are small integers: most rows tie)."""
    return float(spearmanr(x, y).statistic) if len(x) > 2 else float("nan")


def auc(score: np.ndarray, positive: np.ndarray) -> float:
    """P(score of a positive row > score of a negative one), ties counted half; NaN without both kinds."""
    return float(roc_auc_score(positive, score)) if 0 < positive.sum() < len(positive) else float("nan")


def rate(slot0: np.ndarray, cols: dict[str, np.ndarray], rounds: tuple[float, float], profile: LatencyProfile,
         router_ms: float) -> float:
    """Tokens per second of choices `slot0` walked over `cols` (rows at every position), as the bench rates."""
    tokens, ms, _ = simulate_prompts(slot0, cols, KINDS, rounds, profile, router_ms, every=True)
    return headline_rate(tokens, ms) * 1e3


def fitted(values: np.ndarray, cols: dict[str, np.ndarray], below: bool, rounds: tuple[float, float],
           profile: LatencyProfile, router_ms: float) -> float:
    """Out-of-sample tokens/s of a threshold on `values` (slot 0 where values < theta if `below`, else >= theta):
    fitted on the even prompts and scored on the odd ones, and the other way round, prompts' rates pooled."""
    pid = cols["prompt_id"]
    halves = [np.isin(pid, np.unique(pid)[k::2]) for k in (0, 1)]
    grid = np.unique(np.quantile(values, np.linspace(0, 1, 41)))
    grid = np.concatenate([[-np.inf], grid, [np.inf]])
    tokens, ms = [], []
    for fit, score in ((halves[0], halves[1]), (halves[1], halves[0])):
        sub = {k: v[fit] for k, v in cols.items()}
        choose = lambda theta, sel: values[sel] < theta if below else values[sel] >= theta  # noqa: E731
        best = max(grid, key=lambda th: rate(choose(th, fit), sub, rounds, profile, router_ms))
        test = {k: v[score] for k, v in cols.items()}
        t, m, _ = simulate_prompts(choose(best, score), test, KINDS, rounds, profile, router_ms, every=True)
        tokens.append(t)
        ms.append(m)
    return headline_rate(np.concatenate(tokens), np.concatenate(ms)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--testbed", required=True, help="a built testbed folder")
    ap.add_argument("--latency-profile", required=True, help="profile.json of whiflash-eval profile")
    ap.add_argument("--prompts", type=int, default=40, help="prompts a category")
    ap.add_argument("--tokens", type=int, default=256, help="new tokens a prompt")
    ap.add_argument("--source", default="testbed:dev", help="where the prompts come from (a whiflash-datagen source)")
    ap.add_argument("--max-prompt-tokens", type=int, default=1024, help="a prompt's last tokens kept")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16" if torch.cuda.is_available() else "float32")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()

    paths = model_paths(args.testbed)
    profile = LatencyProfile.read(args.latency_profile)
    run = Session.open(paths, args.device, args.dtype)
    target = run.target
    dflash = whiflash.load_drafter("dflash", paths["dflash"], target)
    eagle3 = whiflash.load_drafter("eagle3", paths["eagle3"], target)
    items = read_source(args.source, Path(args.testbed), args.prompts)
    prompts = [(list(i.input_ids) if i.input_ids is not None else run.encode([i.text]))[-args.max_prompt_tokens:]
               for i in items]
    news = greedy_batch(target, prompts, args.tokens + max(dflash.draft_length, eagle3.draft_length) + 1)
    parts = []
    for k, (item, ids, new) in enumerate(tqdm(list(zip(items, prompts, news)), desc="prompts")):
        cols = rows_of_prompt(target, dflash, eagle3, ids, new, set(run.stops))
        if cols is None:
            continue
        n = len(cols["position"])
        parts.append({**cols, "prompt_id": np.full(n, k), "category": np.array([item.category] * n)})
    cols = {key: np.concatenate([c[key] for c in parts]) for key in parts[0]}

    rounds = (profile.round_ms("dflash"), profile.round_ms("eagle3"))
    # under draft-first an EAGLE-3 round also paid DFlash's draft and its catch-up over the round before (the
    # lazy catch-up at the next DFlash round is charged too: a bound on the policy's cost, not its estimate)
    wasted = profile.draft["dflash"] + profile.catchup_ms("dflash", int(round(float(np.mean(cols["tau_1"])))))
    draft_first = (rounds[0], rounds[1] + wasted)
    oracle = speed_oracle(cols, KINDS, profile, every=True)["categories"]
    figures: dict[str, Any] = {"profile": str(args.latency_profile), "rounds_ms": rounds, "wasted_ms": wasted,
                               "categories": {}}
    print(f"rows {len(cols['tau_0'])} from {len(parts)} prompts; rounds DFlash {rounds[0]:.3f} / EAGLE-3 "
          f"{rounds[1]:.3f} ms; a draft-first EAGLE-3 round also pays {wasted:.3f} ms of DFlash")
    print("category  rho(E,tau0) rho(-H,tau0)  AUC E  AUC -H | DFlash  EAGLE-3  oracle (gain) | entropy (share) "
          "| draft-first E (share) | draft-first tau0 (share) | knowing tau1 (share)")
    for cat in [*sorted(set(cols["category"].tolist())), "all"]:
        sel = np.ones(len(cols["tau_0"]), bool) if cat == "all" else cols["category"] == cat
        c = {k: v[sel] for k, v in cols.items()}
        eagle_wins = c["tau_1"] * rounds[0] > c["tau_0"] * rounds[1]
        o = oracle[cat]
        alone = (o["standalone"]["slot0"], o["standalone"]["slot1"])
        best, top = max(alone), o["tokens_per_second"]
        ent = fitted(c["entropy"], c, True, rounds, profile, profile.router_ms("entropy"))
        conf = fitted(c["confidence"], c, False, draft_first, profile, 0.0)
        known = fitted(c["tau_0"].astype(np.float64), c, False, draft_first, profile, 0.0)
        known1 = fitted(c["tau_1"].astype(np.float64), c, True, rounds, profile, profile.router_ms("neural"))
        row = {"rows": int(sel.sum()), "spearman_confidence_tau0": spearman(c["confidence"], c["tau_0"]),
               "spearman_neg_entropy_tau0": spearman(-c["entropy"], c["tau_0"]),
               "auc_confidence": auc(-c["confidence"], eagle_wins), "auc_neg_entropy": auc(c["entropy"], eagle_wins),
               "dflash": alone[0], "eagle3": alone[1], "oracle": top, "oracle_gain": top / best - 1,
               "entropy_policy": ent, "entropy_share": oracle_gain_share(ent, best, top),
               "confidence_policy": conf, "confidence_share": oracle_gain_share(conf, best, top),
               "known_tau0_policy": known, "known_tau0_share": oracle_gain_share(known, best, top),
               "known_tau1_policy": known1, "known_tau1_share": oracle_gain_share(known1, best, top)}
        figures["categories"][cat] = row
        share = lambda v: "—" if v is None else f"{v:+.2f}"  # noqa: E731
        print(f"{cat:9s} {row['spearman_confidence_tau0']:10.3f} {row['spearman_neg_entropy_tau0']:11.3f} "
              f"{row['auc_confidence']:7.3f} {row['auc_neg_entropy']:7.3f} | {alone[0]:7.1f} {alone[1]:8.1f} "
              f"{top:7.1f} ({100 * row['oracle_gain']:+.1f}%) | {ent:7.1f} ({share(row['entropy_share'])}) | "
              f"{conf:7.1f} ({share(row['confidence_share'])}) | {known:7.1f} ({share(row['known_tau0_share'])}) | "
              f"{known1:7.1f} ({share(row['known_tau1_share'])})")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
