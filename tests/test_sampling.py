"""At T > 0 speculative sampling draws from the target's own distribution (a chi-square test).

The world has a tiny vocabulary and a target whose continuation is peaked but not certain, so
drafts are often but not always accepted. The exact law of the 2nd and 3rd new tokens is computed
by enumerating the target; counts from speculative runs must fit it. A deliberately wrong walk
(accepting the whole draft) must fail the same test, so the test has teeth.
"""
from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

import whiflash
from whiflash.testing import make_dflash, make_eagle3, make_target

V = 8
PROMPT = [1, 2, 3]
RUNS = 700
TEMPERATURE = 1.0


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("sampling")
    tdir = make_target(root / "t", "qwen3", vocab=V, layers=2, crafted=True, mix=0.1, seed=7, head_conf=1.0)
    cfg = json.loads((tdir / "config.json").read_text())
    target = whiflash.load_target(tdir)
    drafters = {
        "eagle3": whiflash.load_drafter("eagle3", make_eagle3(root / "e", cfg, [0, 1, 1], crafted=True), target, num_steps=3),
        "dflash": whiflash.load_drafter("dflash", make_dflash(root / "d", cfg, [0, 1], block_size=4, mask_token_id=V - 1, layers=1, crafted=True), target),
    }
    drafters["ddtree"] = whiflash.load_drafter("ddtree", root / "d", target, tree_budget=6)
    drafters["routed"] = whiflash.RoutedDrafter("ddt-e3", whiflash.AlternatingRouter(), eagle3=drafters["eagle3"],
                                                dflash=drafters["ddtree"])
    return target, drafters, exact_law(target)


def exact_law(target) -> dict[tuple[int, int], float]:
    """P(x2, x3) after PROMPT, marginalising x1, by enumeration at TEMPERATURE."""
    def probs(seq):
        target.setup_cache(16)
        return torch.softmax(target(torch.tensor(seq), 0, logits="last").logits[-1] / TEMPERATURE, -1)

    law: Counter = Counter()
    p1 = probs(PROMPT)
    for a in range(V):
        p2 = probs(PROMPT + [a])
        for b in range(V):
            p3 = probs(PROMPT + [a, b])
            for c in range(V):
                law[(b, c)] += float(p1[a] * p2[b] * p3[c])
    return law


def fits(samples: list[tuple[int, int]], law: dict) -> float:
    """p-value of a chi-square test, pooling cells with expected count < 5 into one."""
    counts = Counter(samples)
    n = len(samples)
    obs, exp, rest_o, rest_e = [], [], 0, 0.0
    for cell, p in law.items():
        if p * n >= 5:
            obs.append(counts[cell])
            exp.append(p * n)
        else:
            rest_o += counts[cell]
            rest_e += p * n
    obs.append(rest_o)
    exp.append(rest_e)
    scale = sum(obs) / sum(exp)
    return float(chisquare(obs, [e * scale for e in exp]).pvalue)


def draw(target, drafter, seed0: int) -> tuple[list[tuple[int, int]], float]:
    out, taus = [], []
    for i in range(RUNS):
        toks, stats = whiflash.generate(target, drafter, PROMPT, 3, temperature=TEMPERATURE, seed=seed0 + i)
        out.append((toks[1], toks[2]))
        taus.extend(stats.taus)
    return out, sum(taus) / len(taus)


@pytest.mark.parametrize("kind", ["eagle3", "dflash", "ddtree", "routed"])
def test_speculative_sampling_matches_target_law(world, kind):
    target, drafters, law = world
    samples, tau = draw(target, drafters[kind], seed0=1000)
    assert tau > 1.3, f"drafts must often be accepted for the test to mean anything (tau {tau:.2f})"
    assert fits(samples, law) > 1e-3


def test_a_wrong_walk_fails_the_same_test(world, monkeypatch):
    import whiflash.decoding.loop as loop
    from whiflash.decoding.verify import accept

    def accept_everything(proposal, picked, **options):  # the bug: trust the draft, ignore the target's draws
        m = proposal.size
        return torch.tensor(m + 1), torch.tensor(m), torch.arange(m + 1)

    target, drafters, law = world
    monkeypatch.setattr(loop, "accept", accept_everything)
    samples, _ = draw(target, drafters["dflash"], seed0=1000)
    assert fits(samples, law) < 1e-3
    monkeypatch.setattr(loop, "accept", accept)


def test_seed_makes_sampling_repeatable(world):
    target, drafters, _ = world
    a = whiflash.generate(target, drafters["dflash"], PROMPT, 20, temperature=0.8, seed=3)[0]
    b = whiflash.generate(target, drafters["dflash"], PROMPT, 20, temperature=0.8, seed=3)[0]
    assert a == b
    others = {tuple(whiflash.generate(target, drafters["dflash"], PROMPT, 20, temperature=0.8, seed=s)[0])
              for s in range(4, 8)}
    assert len(others | {tuple(a)}) > 1  # the seed is used, not ignored
