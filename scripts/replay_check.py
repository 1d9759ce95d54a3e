"""Check a replay against a bench run on the same prompts: are the rows' τ what the decode got, and which
estimate of a policy's speed from rows comes closest to what the bench measured?

    python scripts/replay_check.py --replay TB/router_data_df-e3_test --run RUN_DIR --latency-profile TB/profile.json \
        --router TB/router

1. **State for state.** Greedy decoding visits one token sequence whatever drafts, so a row (a prompt, a position,
   both slots' τ from there) is a state any decode of that prompt passes through. For every round of the run's
   speculative methods that starts at a row's position of its prompt (up to its first round that does not: from there
   the two may be on different paths), the round's τ is compared with the row's τ of the slot it drafted with: equal
   means the rows price that round exactly (catch-up and numerics included).
2. **Estimates.** Per category, over the prompts in both, each standalone drafter and each routed method of the run
   (at the threshold it ran with) is estimated from the rows two ways, as speed relative to the better drafter
   alone, beside the bench's pooled tokens per decode second on the same prompts:
   *replay* (`whiflash-eval calibrate --replay`'s estimate, `whiflash.speed_oracle.simulate` over every logged
   round) and *walk* (the same costing over the rows the policy would stand on: from a row the chosen slot advances
   its τ and the walk goes on at the first row at or past there; a gap between where the round lands and that row
   is decoded at that round's rate, so every token of the sequence is paid once: the policy's own positions, as far
   as the rows have them).
"""
from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import numpy as np

from whiflash.calibration import picks_slot0, pinned_slot
from whiflash.eval.replay import _neural_scores, read_rounds
from whiflash.latency import LatencyProfile
from whiflash.speed_oracle import simulate

ROUTED = ("whiflash-entropy", "whiflash-neural")


def read_run(run: Path) -> dict[str, dict[str, dict]]:
    """sample id -> method -> its samples.jsonl record (first turn), from a run folder or a samples.jsonl file."""
    path = run / "samples.jsonl" if run.is_dir() else run
    out: dict[str, dict[str, dict]] = collections.defaultdict(dict)
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("turn", 0) == 0:
            out[rec["sample"]][rec["method"]] = rec
    if not out:
        raise SystemExit(f"--run {run}: no samples in {path}")
    return out


def state_check(cols: dict[str, np.ndarray], run: dict[str, dict[str, dict]], slots: tuple[str, str]) -> dict[str, list[int]]:
    """Per method: [rounds on a row's state, equal τ, lower, higher]."""
    rows: dict[str, dict[int, tuple[int, int]]] = collections.defaultdict(dict)
    for pid, pos, t0, t1 in zip(cols["prompt_id"], cols["position"], cols["tau_0"], cols["tau_1"]):
        rows[pid][int(pos)] = (int(t0), int(t1))
    slot_of = {kind: slots.index(kind) for kind in ("eagle3", "dflash") if kind in slots}  # standalone drafters
    out: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0])
    for sample, methods in run.items():
        if sample not in rows:
            continue
        for name, rec in methods.items():
            if name in ROUTED:
                chosen = rec["slots"]
            elif name in slot_of:
                chosen = [slot_of[name]] * len(rec["taus"])
            else:
                continue
            pos = int(rec["prompt_tokens"])
            for slot, tau in zip(chosen, rec["taus"]):
                if pos not in rows[sample]:  # off the rows' path: from here the states may differ
                    break
                want = rows[sample][pos][slot]
                c = out[name]
                c[0] += 1
                c[1 if tau == want else 2 if tau < want else 3] += 1
                pos += tau
    return dict(out)


def walked(c: dict[str, np.ndarray], slot0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(indices, gaps) of the rows (ordered by prompt, round) a policy choosing `slot0` stands on: each prompt's
    first row, then from row i the first row of the prompt at or past position(i) + the chosen slot's τ; the gap is
    how far past that landing point the next row stands (0 at a prompt's last row)."""
    pids, pos = c["prompt_id"], c["position"]
    taus = np.where(slot0, c["tau_0"], c["tau_1"])
    out, gaps, i = [], [], 0
    while i < len(pids):
        j = i + 1
        while j < len(pids) and pids[j] == pids[i] and pos[j] < pos[i] + taus[i]:
            j += 1
        out.append(i)
        gaps.append(int(pos[j] - pos[i] - taus[i]) if j < len(pids) and pids[j] == pids[i] else 0)
        i = j
    return np.array(out, dtype=np.int64), np.array(gaps, dtype=np.int64)


def estimates(c: dict[str, np.ndarray], slot0: np.ndarray, kinds: tuple[str, str], round_ms: tuple[float, float],
              profile: LatencyProfile, router_ms: float) -> tuple[float, float]:
    """(replay, walk) tokens per millisecond of slot choices `slot0` over rows `c`, both costed by `simulate`."""
    tokens, ms, _ = simulate(slot0, c, kinds, round_ms, profile, router_ms)
    idx, gaps = walked(c, slot0)
    w_slot0 = slot0[idx]
    w_tokens, w_ms, _ = simulate(w_slot0, {k: v[idx] for k, v in c.items()}, kinds, round_ms, profile, router_ms)
    taus = np.where(w_slot0, c["tau_0"][idx], c["tau_1"][idx])
    per_token = (router_ms + np.where(w_slot0, round_ms[0], round_ms[1])) / taus  # that round's rate
    return tokens / ms, (w_tokens + gaps.sum()) / (w_ms + float((gaps * per_token).sum()))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replay", type=Path, required=True, help="router dataset (whiflash-datagen) of the run's prompts")
    ap.add_argument("--run", type=Path, required=True, help="whiflash-eval bench run folder (or its samples.jsonl)")
    ap.add_argument("--latency-profile", type=Path, required=True, help="profile.json (whiflash-eval profile)")
    ap.add_argument("--router", default=None, help="the neural router the run used (for its rows' scores)")
    args = ap.parse_args(argv)
    manifest, cols = read_rounds(args.replay, with_hidden=args.router is not None)
    run = read_run(args.run)
    slots = tuple(manifest.pair.slots)
    if not set(cols["prompt_id"].tolist()) & set(run):
        raise SystemExit(f"--replay {args.replay}: none of its prompts is a sample of --run {args.run}")
    profile = LatencyProfile.read(args.latency_profile, flag="--latency-profile")

    print("## State for state: the run's rounds that start at a row's position, τ against the row's\n")
    print("| method | rounds on a row's state | equal | lower | higher |\n|---|---|---|---|---|")
    for name, (n, eq, lo, hi) in sorted(state_check(cols, run, slots).items()):
        print(f"| {name} | {n} | {eq} ({eq / max(n, 1):.0%}) | {lo} | {hi} |")

    scores = {"whiflash-entropy": cols["entropy"].astype(np.float64)}
    decision = {"whiflash-entropy": profile.router_ms("entropy")}
    if args.router:
        scores["whiflash-neural"], in_pass = _neural_scores(args.router, manifest, cols)
        decision["whiflash-neural"] = profile.decision_ms(in_pass)
    alone = tuple(profile.round_ms(k, manifest.tree_budget) for k in slots)
    routed = tuple(profile.round_ms(k, manifest.tree_budget, routed=True) for k in slots)
    print("\n## Speed against the better drafter alone: replay / walk estimates from the rows, bench\n")
    print("| category | prompts | method | threshold | replay | walk | bench |\n|---|---|---|---|---|---|---|")
    for cat in sorted(set(cols["category"].tolist())):
        ids = sorted({p for p in cols["prompt_id"][cols["category"] == cat].tolist() if p in run})
        if not ids:
            continue
        sel = np.isin(cols["prompt_id"], ids)
        c = {k: v[sel] for k, v in cols.items() if k != "hidden"}
        bench = {m: sum(run[s][m]["new_tokens"] - 1 for s in ids) / sum(run[s][m]["decode_seconds"] for s in ids)
                 for m in run[ids[0]] if all(m in run[s] for s in ids)}
        est = {kind: estimates(c, np.full(len(c["tau_0"]), s == 0), slots, alone, profile, 0.0)
               for s, kind in enumerate(slots)}
        rows = [(kind, None, est[kind]) for kind in slots]
        for m in ROUTED:
            if m in bench and m in scores:
                thr = run[ids[0]][m].get("threshold")
                if thr is not None:  # a pinned threshold runs that drafter alone, no decision paid
                    pinned = pinned_slot(m, thr) is not None
                    rows.append((m, thr, estimates(c, picks_slot0(m, scores[m][sel], thr), slots,
                                                   alone if pinned else routed, profile,
                                                   0.0 if pinned else decision[m])))
        best = [max(e[k] for e in est.values()) for k in (0, 1)]
        best_bench = max(bench.get(k, 0.0) for k in slots)
        for m, thr, (rep, walk) in rows:
            b = f"{bench[m] / best_bench - 1:+.1%}" if m in bench and best_bench else "—"
            print(f"| {cat} | {len(ids)} | {m} | {'' if thr is None else thr} | {rep / best[0] - 1:+.1%} | "
                  f"{walk / best[1] - 1:+.1%} | {b} |")


if __name__ == "__main__":
    main()
