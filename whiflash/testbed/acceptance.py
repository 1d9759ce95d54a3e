"""Per-category acceptance of the trained drafters, measured with the real engine.

Greedy ``whiflash.generate`` on held-out (test split) prompts for EAGLE-3, DFlash and DDTree, and
for the per-round oracle (both drafters draft from the same state each round, the longer
acceptance advances: the bound a router between EAGLE-3 and DFlash can reach). Also checks that
every output equals plain autoregressive decoding (the engine is lossless). The headroom is the
oracle's tau over the best single drafter's tau, per category; the switching figures say whether
the drafter that wins a round changes within sequences (``switching``). Drafter snapshots saved
during training (``snapshots/step_N``) are measured on the same prompts: ``training_curve`` is tau
per category against the response tokens each had learned from.
tau of a round = accepted draft tokens + 1 (bonus included); reported tau = mean over rounds
per sequence, then mean over sequences (``whiflash.summarize``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from tqdm import tqdm

from whiflash.decoding.stats import TAU_DEFINITION

from .presets import CATEGORIES
from .prompts import eval_prompts

__all__ = ["measure_acceptance", "switching", "SWITCH_SHARE"]

SWITCH_SHARE = 0.2
"""A sequence "switches" when each drafter wins (accepts strictly longer) at least this share of its rounds."""

log = logging.getLogger(__name__)


def switching(slot_taus: list[list[tuple[int, int]]]) -> dict[str, float]:
    """Who wins the oracle's rounds (slot 0 = DFlash, slot 1 = EAGLE-3), from per-sequence (tau0, tau1) lists.

    ``dflash_wins``/``eagle3_wins``/``ties``: shares of all rounds; ``switching_sequences``: share of
    sequences in which both drafters win at least ``SWITCH_SHARE`` of the rounds.
    """
    rounds = [r for seq in slot_taus for r in seq]
    n = max(1, len(rounds))
    both = [seq for seq in slot_taus if seq
            and sum(a > b for a, b in seq) >= SWITCH_SHARE * len(seq)
            and sum(b > a for a, b in seq) >= SWITCH_SHARE * len(seq)]
    return {"dflash_wins": round(sum(a > b for a, b in rounds) / n, 3),
            "eagle3_wins": round(sum(b > a for a, b in rounds) / n, 3),
            "ties": round(sum(a == b for a, b in rounds) / n, 3),
            "switching_sequences": round(len(both) / max(1, len(slot_taus)), 3)}


@torch.no_grad()
def measure_acceptance(root: Path, out_dir: Path, prompts_per_category: int = 8, max_new_tokens: int = 64,
                       max_prompt_tokens: int = 256, device: str = "cpu", cuda_graphs: bool = True,
                       eagle3_steps: int = 6) -> dict:
    """tau per category and drafter on held-out prompts; rows per prompt go to ``acceptance.jsonl``.

    ``cuda_graphs`` (CUDA only) replays captured graphs for every fixed-shape pass; outputs stay
    checked against plain autoregressive decoding either way. ``eagle3_steps``: EAGLE-3 chain length
    (the build passes the drafter's training unroll length).
    """
    import whiflash
    from whiflash.testbed.tokenizer import load_tokenizer

    tok = load_tokenizer(root / "target")
    target = whiflash.load_target(root / "target", device=device)
    if cuda_graphs and target.device.type == "cuda":  # the drafters and snapshots take it when they attach
        target.set_engine(target.engine.with_(cuda_graphs=True))
    drafters = {"eagle3": whiflash.load_drafter("eagle3", root / "eagle3", target, num_steps=eagle3_steps),
                "dflash": whiflash.load_drafter("dflash", root / "dflash", target)}
    drafters["ddtree"] = whiflash.load_drafter("ddtree", root / "dflash", target)
    drafters["oracle"] = whiflash.OracleDrafter("df-e3", eagle3=drafters["eagle3"],
                                                dflash=drafters["dflash"])
    stats: dict[str, dict[str, list]] = {k: {c: [] for c in CATEGORIES} for k in drafters}
    mismatches = 0
    rows = []
    cases = []  # (category, prompt ids, AR output) of every prompt, for the snapshots' curve below
    for cat in CATEGORIES:
        for i, prompt in enumerate(tqdm(eval_prompts(root, cat, prompts_per_category), desc=f"acceptance {cat}",
                                        leave=False)):
            ids = tok(prompt, add_special_tokens=False)["input_ids"][-max_prompt_tokens:]
            ref, _ = whiflash.generate(target, None, ids, max_new_tokens, stop_token_ids=[tok.eos_token_id])
            cases.append((cat, ids, ref))
            row = {"category": cat, "prompt": i}
            for kind, drafter in drafters.items():
                out, st = whiflash.generate(target, drafter, ids, max_new_tokens, stop_token_ids=[tok.eos_token_id])
                mismatches += int(out != ref)
                stats[kind][cat].append(st)
                row[kind] = st.taus
                if kind == "oracle":
                    row["oracle_slot_taus"] = st.slot_taus  # (DFlash, EAGLE-3) tau of every round
            rows.append(row)
    curve: dict[str, list[dict]] = {}
    for kind in ("eagle3", "dflash"):
        points = []
        for folder in sorted((root / kind / "snapshots").glob("step_*"), key=lambda f: int(f.name.split("_")[1])):
            snap = whiflash.load_drafter(kind, folder, target, **({"num_steps": eagle3_steps} if kind == "eagle3" else {}))
            per: dict[str, list] = {c: [] for c in CATEGORIES}
            for cat, ids, ref in cases:
                out, st = whiflash.generate(target, snap, ids, max_new_tokens, stop_token_ids=[tok.eos_token_id])
                mismatches += int(out != ref)
                per[cat].append(st)
            points.append({**json.loads((folder / "snapshot.json").read_text()),
                           "tau": {c: round(whiflash.summarize(v)["tau"], 3) for c, v in per.items() if v}})
        final = root / kind / "snapshot.json"
        if points and final.is_file():
            points.append({**json.loads(final.read_text()),
                           "tau": {c: round(whiflash.summarize(v)["tau"], 3) for c, v in stats[kind].items() if v}})
        if points:
            curve[kind] = points
    with open(out_dir / "acceptance.jsonl", "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    tau = {kind: {cat: round(whiflash.summarize(v)["tau"], 3) for cat, v in per.items()} for kind, per in stats.items()}
    headroom = {cat: round(tau["oracle"][cat] / max(tau["eagle3"][cat], tau["dflash"][cat]), 3) for cat in CATEGORIES
                if max(tau["eagle3"][cat], tau["dflash"][cat]) > 0}
    switch = {cat: switching([st.slot_taus for st in stats["oracle"][cat]]) for cat in CATEGORIES}
    log.info("acceptance (tau, bonus included): %s; oracle headroom over the best single drafter: %s; "
             "round winners: %s", tau, headroom, switch)
    if curve:
        log.info("tau against drafter training tokens: %s", curve)
    return {"tau": tau, "oracle_headroom": headroom, "switching": switch, "lossless_mismatches": mismatches,
            "training_curve": curve,
            "prompts_per_category": prompts_per_category, "max_new_tokens": max_new_tokens,
            "eagle3_steps": eagle3_steps, "tau_definition": TAU_DEFINITION}
