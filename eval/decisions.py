"""A routed method's decisions judged on the bench's own states, from its rows alone (no router data needed).

Greedy decoding visits one token sequence whatever drafts, so a round that a routed decode starts at some
position of a prompt starts from the same state as a round that each of its drafters, decoding the same prompt
alone in the same bench, starts at that position (where one does: each decode's rounds start at positions of its
own). There the standalone rows say what the slot not taken would have accepted. Per routed method, category
and chosen slot: how many of its rounds stand on such shared states, its τ there, each drafter's τ there, and how
often the other slot would have accepted more / fewer tokens. A router that sends ties and losses to a slot shows
it here, where the speedup only shows that it lost.

Only for greedy benches (at temperature > 0 the decodes leave each other's paths at once); a decode's rounds
count only up to where any of the three outputs first departs from AR's (a bf16 near-tie there moves every later
state).
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

__all__ = ["DECISIONS_DEFINITION", "decisions_markdown", "shared_state_decisions"]

DECISIONS_DEFINITION = (
    "a routed decode's rounds that start where both of its drafters' standalone decodes of the same prompt also "
    "start a round (greedy: the same state), before any of the three outputs departs from AR's; per slot it "
    "chose: its mean τ there, each drafter's mean τ there, the share of those rounds where its τ is its drafter's "
    "alone (the same state drafted the same way: catch-up and numerics exact), and where the other slot would "
    "have accepted more (better) or fewer (worse) tokens"
)


def _round_starts(taus: list[int]) -> dict[int, int]:
    """Decode offset (new tokens after the first) at which each round starts -> that round's τ."""
    out, pos = {}, 0
    for t in taus:
        out[pos] = t
        pos += t
    return out


def _departs(row: dict[str, Any]) -> float:
    """The index of the first new token where `row`'s output leaves AR's (inf when it never does)."""
    mismatch = row.get("mismatch")
    return float(mismatch["position"]) if mismatch else math.inf


def shared_state_decisions(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """`{routed method: {category (and "all"): {chosen slot's method: figures}}}` over a greedy bench's rows
    (`DECISIONS_DEFINITION`); routed methods whose two drafters the bench did not run alone are left out."""
    by_key: dict[tuple[Any, Any], dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in rows:
        by_key[(r.get("sample"), r.get("turn"))][r["method"]] = r
    pairs: dict[str, tuple[str, str]] = {}
    # method -> category -> chosen slot -> [(its τ, slot 0's τ alone, slot 1's τ alone)]
    acc: dict[str, dict[str, dict[int, list[tuple[int, int, int]]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    for per in by_key.values():
        for method, row in per.items():
            pair, slots = row.get("slot_methods"), row.get("slots")
            if not method.startswith("whiflash") or not pair or not slots or any(m not in per for m in pair):
                continue
            pairs[method] = tuple(pair)
            alone = [_round_starts(per[m]["taus"]) for m in pair]
            limit = min(_departs(row), *(_departs(per[m]) for m in pair))
            pos = 0
            for slot, tau in zip(slots, row["taus"]):
                there = [a.get(pos) for a in alone]
                # the round covers new tokens pos + 1 .. pos + tau: all of them before any output departs
                if None not in there and pos + max(tau, *there) < limit:
                    for cat in (row.get("category", ""), "all"):
                        acc[method][cat][slot].append((tau, there[0], there[1]))
                pos += tau
    out: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    for method, cats in acc.items():
        for cat in sorted(cats, key=lambda c: (c == "all", c)):  # "all" last
            for slot, triples in sorted(cats[cat].items()):
                n = len(triples)
                mine, other = [t[1 + slot] for t in triples], [t[2 - slot] for t in triples]
                out.setdefault(method, {}).setdefault(cat, {})[pairs[method][slot]] = {
                    "rounds": n, "tau": sum(t[0] for t in triples) / n,
                    "tau_alone": {name: sum(t[1 + i] for t in triples) / n for i, name in enumerate(pairs[method])},
                    "same_as_alone": sum(t[0] == m for t, m in zip(triples, mine)) / n,
                    "other_better": sum(o > m for o, m in zip(other, mine)) / n,
                    "other_worse": sum(o < m for o, m in zip(other, mine)) / n}
    return out


def decisions_markdown(decisions: dict[str, dict[str, dict[str, dict[str, Any]]]]) -> str:
    """The decisions as a markdown table (empty when there are none)."""
    if not decisions:
        return ""
    lines = ["| method | category | chose | rounds | its τ | τ alone there | its τ = its drafter's alone | "
             "the other slot better / worse |", "|---|---|---|---|---|---|---|---|"]
    for method, cats in decisions.items():
        for cat, chosen in cats.items():
            for name, f in chosen.items():
                alone = ", ".join(f"{m} {t:.2f}" for m, t in f["tau_alone"].items())
                lines.append(f"| {method} | {cat} | {name} | {f['rounds']} | {f['tau']:.2f} | {alone} | "
                             f"{100 * f['same_as_alone']:.0f}% | "
                             f"{100 * f['other_better']:.0f}% / {100 * f['other_worse']:.0f}% |")
    return "\n".join(lines)
