"""Greedy speculative decoding equals the target's own greedy decoding, token for token."""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch import Tensor

import whiflash
from whiflash.routers import ScriptedRouter
from whiflash.testing import emulated_graphs

PROMPTS = [[1, 2, 3], [7, 8, 9, 10, 11, 12], [40, 3, 3, 17, 29, 30, 31, 2, 5, 5, 6]]
LENGTHS = [1, 9, 40]


@pytest.mark.parametrize("world", ["qwen3-random", "llama-random", "qwen3-crafted", "llama-crafted", "qwen3-mixed", "llama-mixed"])
def test_every_method_matches_greedy_target(worlds, world):
    target, drafters = worlds[world].load()
    taus = {}
    for prompt in PROMPTS:
        for length in LENGTHS:
            ref, ar_stats = whiflash.generate(target, None, prompt, length)
            assert len(ref) == length and set(ar_stats.taus) <= {1}
            for kind, drafter in drafters.items():
                out, stats = whiflash.generate(target, drafter, prompt, length)
                assert out == ref, f"{world} {kind} prompt={prompt} length={length}"
                assert stats.new_tokens == length and sum(stats.taus) + 1 >= length
                taus.setdefault(kind, []).extend(stats.taus)
    if "crafted" in world:  # every draft is right: multi-token acceptance up to the maximum
        assert max(taus["eagle3"]) == 5 and max(taus["dflash"]) == 8
        assert max(taus["ddtree"]) == 8
        assert min(taus["dflash"]) == 8
    if "mixed" in world:  # partial acceptance: a spread of tau values, not only 1 or the maximum
        assert len(set(taus["dflash"])) >= 3 and len(set(taus["ddtree"])) >= 3


def test_a_ddtree_drafter_over_dflash_weights_decodes_as_the_loaded_one(worlds):
    """`DDTreeDrafter.over` (the profile's DDTree loop rows) shares the DFlash drafter's weights, keeps a cache of its
    own, and decodes as the DDTree drafter loaded from the same checkpoint, interleaved with the DFlash drafter."""
    from whiflash.drafters import DDTreeDrafter

    target, drafters = worlds["qwen3-mixed"].load()
    loaded, dflash = drafters["ddtree"], drafters["dflash"]
    tree = DDTreeDrafter.over(dflash, loaded.tree_budget)
    assert tree.fc.weight.data_ptr() == dflash.fc.weight.data_ptr() and not tree.training
    assert tree.cache is not dflash.cache
    for prompt in PROMPTS:
        ref, ref_stats = whiflash.generate(target, loaded, prompt, 24)
        out, stats = whiflash.generate(target, tree, prompt, 24)
        whiflash.generate(target, dflash, prompt, 24)  # the shared weights' other drafter, in between
        again, _ = whiflash.generate(target, tree, prompt, 24)
        assert out == again == ref and stats.taus == ref_stats.taus


def test_stop_tokens_cut_the_output(worlds):
    target, drafters = worlds["qwen3-mixed"].load()
    ref, _ = whiflash.generate(target, None, PROMPTS[1], 40)
    stop = next(t for t in ref[3:] if t != ref[0])
    cut = ref[: ref.index(stop) + 1]
    for drafter in [None, *drafters.values()]:
        out, _ = whiflash.generate(target, drafter, PROMPTS[1], 40, stop_token_ids=[stop])
        assert out == cut


def test_decoding_records_no_autograd_graph(worlds):
    target, drafters = worlds["qwen3-mixed"].load()
    seen = []
    whiflash.generate(target, drafters["eagle3"], PROMPTS[1], 8,
                      on_round=lambda r: seen.append(torch.is_grad_enabled()))
    assert seen and not any(seen)  # the whole loop (routers, accept, bookkeeping) runs without autograd


def test_ddtree_accepts_paths_that_are_not_slot_prefixes(worlds, monkeypatch, tmp_path):
    """With an unconfident drafter, siblings interleave with the main path, so compaction really moves K/V."""
    import whiflash.decoding.loop as gen
    from whiflash.testing import make_dflash

    world = worlds["qwen3-crafted"]
    target, _ = world.load()
    folder = make_dflash(tmp_path / "d", world.target_cfg, [0, 1, 3], crafted=True, draft_conf=0.18)
    ddtree = whiflash.load_drafter("ddtree", folder, target, tree_budget=60)
    seen = []
    real = gen.accept

    def spy(proposal, picked, **options):
        count, best, keep = real(proposal, picked, **options)
        seen.append(keep[: int(count)].tolist())
        return count, best, keep

    monkeypatch.setattr(gen, "accept", spy)
    ref, _ = whiflash.generate(target, None, PROMPTS[0], 30)
    out, stats = whiflash.generate(target, ddtree, PROMPTS[0], 30)
    assert out == ref
    assert any(p != list(range(len(p))) for p in seen), seen
    assert max(stats.taus) >= 5


def test_bad_arguments(worlds):
    target, _ = worlds["qwen3-random"].load()
    with pytest.raises(ValueError, match="max_new_tokens"):
        whiflash.generate(target, None, [1, 2], 0)
    with pytest.raises(ValueError, match="non-empty"):
        whiflash.generate(target, None, [], 3)
    with pytest.raises(ValueError, match="batch size 1"):
        whiflash.generate(target, None, [[1, 2], [3, 4]], 3)
    vocab = target.config.vocab_size
    bad = {  # argument -> what the message must name
        "temperature=-0.5": (dict(temperature=-0.5), "temperature"),
        "temperature=nan": (dict(temperature=float("nan")), "temperature"),
        "max_new_tokens=2.5": (dict(max_new_tokens=2.5), "max_new_tokens"),
        "stop id past the vocabulary": (dict(stop_token_ids=[vocab]), "stop_token_ids"),
        "negative stop id": (dict(stop_token_ids=[-1]), "stop_token_ids"),
        "prompt id past the vocabulary": (dict(input_ids=[1, vocab]), "input_ids"),
        "negative prompt id": (dict(input_ids=torch.tensor([-3, 1])), "input_ids"),
    }
    for case, (kwargs, name) in bad.items():
        call = dict(input_ids=[1, 2], max_new_tokens=3) | kwargs
        with pytest.raises(ValueError, match=name):
            whiflash.generate(target, None, **call)


def _decode(target, drafter, prompt: list[int]) -> tuple[list[int], list[int], list[Tensor], list[int]]:
    """Tokens, taus, the router features of every round (copied when recorded: a later replay must not
    have changed them) and the catch-up backlogs."""
    features: list[Tensor] = []
    out, stats = whiflash.generate(target, drafter, prompt, 40,
                                   on_round=lambda r: features.extend((r.hidden.clone(), r.logits.clone())))
    return out, stats.taus, features, stats.backlogs


@pytest.mark.parametrize("world", ["qwen3-mixed", "llama-crafted"])
def test_static_shape_path_gives_the_same_tokens_and_taus(worlds, world):
    """The fixed-shape passes that CUDA graphs capture (full-cache attention under a mask,
    index_copy_ K/V writes) decode exactly like the eager path; and through emulated graphs (static
    inputs, outputs overwritten by the next replay) exactly like the fixed-shape passes called directly,
    router features included: no caller keeps a graph output past the next replay."""
    target, drafters = worlds[world].load()
    routed = whiflash.RoutedDrafter("df-e3", whiflash.AlternatingRouter(), eagle3=drafters["eagle3"],
                                    dflash=drafters["ddtree"])
    # long stretches on one drafter: lazy backlogs longer than one fixed-shape catch-up pass
    stretches = whiflash.RoutedDrafter("df-e3", ScriptedRouter([0] * 6 + [1] * 5), eagle3=drafters["eagle3"],
                                       dflash=drafters["dflash"])
    oracle = whiflash.OracleDrafter("df-e3", eagle3=drafters["eagle3"], dflash=drafters["dflash"])
    members = [target, *drafters.values()]
    methods = [None, *drafters.values(), routed, oracle, stretches]
    for prompt in PROMPTS:
        runs = []
        for mode in ("eager", "static", "graphs"):
            for m in members:
                m.static = mode == "static"
            with emulated_graphs(*members) if mode == "graphs" else contextlib.nullcontext():
                runs.append([_decode(target, d, prompt) for d in methods])
        assert max(runs[0][-1][3]) > drafters["eagle3"].num_steps + 1  # several catch-up passes
        for d, eager, static, graphs in zip(methods, *runs):
            name = d.name if d is not None else "ar"
            assert eager[:2] == static[:2] == graphs[:2], (name, prompt)
            assert len(static[2]) == len(graphs[2]) and all(map(torch.equal, static[2], graphs[2])), (name, prompt)


def test_static_shape_drafting_proposes_what_the_eager_path_proposes(worlds, monkeypatch):
    """The drafts themselves, not only the accepted tokens, in a random world: its drafters attend to
    their caches (the crafted ones do not) and its drafts are rarely accepted, so equal outputs alone
    would not show a wrong fixed-shape mask in a drafting step, nor (through emulated graphs) a backlog
    that kept a view of a graph output past the next replay."""
    target, drafters = worlds["qwen3-random"].load()
    routed = whiflash.RoutedDrafter("df-e3", ScriptedRouter([0] * 3 + [1] * 4), eagle3=drafters["eagle3"],
                                    dflash=drafters["dflash"])
    seen: list[list[int]] = []
    # every draft passes through one of these (DDTree inherits DFlash's draft; routed slots call draft)
    for cls, method in ((type(drafters["eagle3"]), "propose"), (type(drafters["dflash"]), "draft")):
        real = getattr(cls, method)

        def spy(self, pending, pos, arg=None, _real=real):
            proposal = _real(self, pending, pos) if arg is None else _real(self, pending, pos, arg)
            seen.append(proposal.tokens.tolist())
            return proposal

        monkeypatch.setattr(cls, method, spy)
    members = [target, *drafters.values()]
    for drafter in [*drafters.values(), routed]:
        runs = []
        for mode in ("eager", "static", "graphs"):  # graphs: emulated, outputs overwritten by the next replay
            for m in members:
                m.static = mode == "static"
            seen.clear()
            with emulated_graphs(*members) if mode == "graphs" else contextlib.nullcontext():
                for prompt in PROMPTS:
                    whiflash.generate(target, drafter, prompt, 30)
            runs.append(list(seen))
        assert runs[0] == runs[1] == runs[2] and len(runs[0]) > 20, drafter.kind
