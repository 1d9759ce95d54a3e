"""Drafter loading (contracts, flags, strictness, clear errors) and the DDTree tree builder."""
from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

import whiflash
from whiflash.drafters.trees import ancestor_mask, build_tree
from whiflash.drafters.base import Commit
from whiflash.drafters.dflash import fallback_layer_ids
from whiflash.testing import make_dflash, make_eagle3


@pytest.fixture(scope="module")
def qwen(worlds):
    world = worlds["qwen3-random"]
    return world, whiflash.load_target(world.target_dir)


@pytest.mark.parametrize(
    "flags",
    [{}, {"fc_norm": True}, {"norm_before_fc": True}, {"norm_before_residual": True}, {"norm_output": False}],
    ids=["plain", "fc_norm", "norm_before_fc", "norm_before_residual", "no_norm_output"],
)
def test_eagle3_flags_load_and_stay_lossless(qwen, tmp_path, flags):
    world, target = qwen
    folder = make_eagle3(tmp_path / "e", world.target_cfg, [0, 1, 2], draft_vocab=24, **flags)
    drafter = whiflash.load_drafter("eagle3", folder, target, num_steps=3)
    ref, _ = whiflash.generate(target, None, [1, 2, 3, 4], 12)
    out, stats = whiflash.generate(target, drafter, [1, 2, 3, 4], 12)
    assert out == ref and stats.rounds > 0


def test_eagle3_layers0_alias_gives_same_drafts(qwen, tmp_path):
    world, target = qwen
    a = whiflash.load_drafter("eagle3", make_eagle3(tmp_path / "a", world.target_cfg, [0, 1, 2], 24), target)
    b = whiflash.load_drafter("eagle3", make_eagle3(tmp_path / "b", world.target_cfg, [0, 1, 2], 24, layout="layers0"), target)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)


def test_eagle3_d2t_is_an_offset(qwen, tmp_path):
    world, target = qwen
    folder = make_eagle3(tmp_path / "e", world.target_cfg, [0, 1, 2], draft_vocab=24)
    drafter = whiflash.load_drafter("eagle3", folder, target)
    t2d = load_file(str(folder / "model.safetensors"))["t2d"]
    used = t2d.nonzero().squeeze(-1)
    assert torch.equal(drafter._to_target(torch.arange(24)), used)


def test_eagle3_default_taps_follow_specforge(qwen, tmp_path):
    world, target = qwen
    folder = make_eagle3(tmp_path / "e", world.target_cfg, [0, 1, 2], draft_vocab=24)
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["eagle_config"]
    (folder / "config.json").write_text(json.dumps(cfg))
    n = world.target_cfg["num_hidden_layers"]
    assert whiflash.load_drafter("eagle3", folder, target).tap_layers == (1, n // 2 - 1, n - 4)


def test_dflash_fallback_layer_rule():
    assert fallback_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert fallback_layer_ids(36, 1) == [18]


def _edit(folder, drop=None, reshape=None):
    state = load_file(str(folder / "model.safetensors"))
    if drop:
        del state[drop]
    if reshape:
        state[reshape] = torch.zeros(3, 3)
    save_file(state, str(folder / "model.safetensors"))


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_loader_errors_name_the_key_or_field(qwen, tmp_path, kind):
    world, target = qwen
    make = (lambda d, taps: make_eagle3(d, world.target_cfg, taps, 24)) if kind == "eagle3" else (
        lambda d, taps: make_dflash(d, world.target_cfg, taps))
    key = "midlayer.self_attn.k_proj.weight" if kind == "eagle3" else "layers.1.mlp.up_proj.weight"

    missing = make(tmp_path / "missing", [0, 1, 2])
    _edit(missing, drop=key)
    with pytest.raises(KeyError, match=key.replace(".", r"\.")):
        whiflash.load_drafter(kind, missing, target)

    shaped = make(tmp_path / "shaped", [0, 1, 2])
    _edit(shaped, reshape="fc.weight")
    with pytest.raises(ValueError, match=r"'fc.weight' has shape \(3, 3\)"):
        whiflash.load_drafter(kind, shaped, target)

    deep = make(tmp_path / "deep", [0, 1, 9])
    with pytest.raises(ValueError, match=r"include \[9\], beyond target .* 4 layers"):
        whiflash.load_drafter(kind, deep, target)

    extra = make(tmp_path / "extra", [0, 1, 2])
    state = load_file(str(extra / "model.safetensors"))
    state["surprise.weight"] = torch.zeros(1)
    save_file(state, str(extra / "model.safetensors"))
    with pytest.raises(KeyError, match="unexpected key.*surprise.weight"):
        whiflash.load_drafter(kind, extra, target)


def test_more_loader_errors(qwen, tmp_path):
    world, target = qwen
    folder = make_eagle3(tmp_path / "e", world.target_cfg, [0, 1, 2], draft_vocab=24)
    _edit(folder, drop="d2t")
    with pytest.raises(KeyError, match="'d2t'"):
        whiflash.load_drafter("eagle3", folder, target)
    with pytest.raises(ValueError, match="not one of"):
        whiflash.load_drafter("medusa", folder, target)
    df = make_dflash(tmp_path / "d", world.target_cfg, [0, 1, 2])
    cfg = json.loads((df / "config.json").read_text())
    cfg["vocab_size"] = 1000
    (df / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="vocab_size 1000 != target vocab_size 48"):
        whiflash.load_drafter("dflash", df, target)
    del cfg["block_size"]
    cfg["vocab_size"] = 48
    (df / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="'block_size' is missing"):
        whiflash.load_drafter("dflash", df, target)
    (df / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        whiflash.load_drafter("dflash", df, target)


def test_dflash_and_ddtree_share_the_checkpoint(qwen, tmp_path):
    world, target = qwen
    folder = make_dflash(tmp_path / "d", world.target_cfg, [0, 1, 2], block_size=6)
    ddt = whiflash.load_drafter("ddtree", folder, target)
    assert ddt.tree_budget == 5 and ddt.block_size == 6
    assert whiflash.load_drafter("ddtree", folder, target, tree_budget=40).max_nodes == 40


def _random_tops(depth, k, seed):
    g = torch.Generator().manual_seed(seed)
    logp = torch.log_softmax(torch.randn(depth, 10, generator=g) * 2, -1)
    top_logp, top_ids = logp.topk(k, -1)
    return top_logp.tolist(), top_ids.tolist(), logp


@pytest.mark.parametrize("budget", [1, 5, 17, 40])
def test_tree_builder_is_prefix_closed_best_first_and_exact(budget):
    depth = 4
    top_logp, top_ids, logp = _random_tops(depth, min(budget, 10), seed=budget)
    tokens, parents, depths = build_tree(top_logp, top_ids, budget)
    assert len(tokens) == budget
    assert all(p < i + 1 for i, p in enumerate(parents)), "a parent precedes its child"
    assert all(depths[i] == (depths[p - 1] + 1 if p else 1) for i, p in enumerate(parents))
    # prefix score of every node; pop order must be non-increasing (best-first)
    score = [0.0]
    prefixes = [()]
    for tok, par, d in zip(tokens, parents, depths):
        score.append(score[par] + float(logp[d - 1, tok]))
        prefixes.append(prefixes[par] + (tok,))
    assert all(a >= b - 1e-6 for a, b in zip(score[1:], score[2:]))
    assert len(set(prefixes)) == len(prefixes), "siblings carry distinct tokens"
    # exact: the chosen set is the `budget` most probable prefixes of length 1..depth
    every = []
    for d in range(1, depth + 1):
        for seq in itertools.product(range(10), repeat=d):
            every.append(sum(float(logp[i, t]) for i, t in enumerate(seq)))
    every.sort(reverse=True)
    assert math.isclose(sum(score[1:]), sum(every[:budget]), rel_tol=1e-5, abs_tol=1e-5)
    mask = ancestor_mask(torch.tensor(parents))
    assert mask.shape == (budget + 1, budget + 1) and mask[:, 0].all()


def test_a_drafter_does_not_adopt_its_target(qwen, tmp_path):
    world, target = qwen
    drafter = whiflash.load_drafter("dflash", make_dflash(tmp_path / "d", world.target_cfg, [0, 1, 2]), target)
    keys = set(drafter.state_dict())
    whiflash.generate(target, drafter, [1, 2, 3], 5)
    assert set(drafter.state_dict()) == keys and drafter.target is target


def test_eagle3_speculators_layout_loads_like_specforge(qwen, tmp_path):
    """vLLM speculators checkpoints nest the layer config and count taps in HF hidden_states indices."""
    world, target = qwen
    spec = make_eagle3(tmp_path / "spec", world.target_cfg, [0, 1, 2], 24, layout="layers0", norm_before_residual=True)
    cfg = json.loads((spec / "config.json").read_text())
    layer = {k: cfg.pop(k) for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                                     "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size")}
    del cfg["eagle_config"]
    cfg.update(speculators_model_type="eagle3", transformer_layer_config={"model_type": "llama", **layer},
               eagle_aux_hidden_state_layer_ids=[1, 2, 3])  # HF indices = output of layers 0, 1, 2
    (spec / "config.json").write_text(json.dumps(cfg))
    flat = make_eagle3(tmp_path / "flat", world.target_cfg, [0, 1, 2], 24, norm_before_residual=True)
    a = whiflash.load_drafter("eagle3", spec, target, num_steps=3)
    b = whiflash.load_drafter("eagle3", flat, target, num_steps=3)
    assert a.tap_layers == b.tap_layers == (0, 1, 2) and a.cfg["norm_before_residual"]
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    proposals = []
    for d in (a, b):
        d.reset(target, 32)
        target.setup_cache(32)
        out = target(torch.tensor([1, 2, 3, 4]), 0, taps=(0, 1, 2), logits="last")
        d.observe(Commit(out.feats, torch.tensor([2, 3, 4, 7]), 0, (0, 1, 2)))
        proposals.append(d.propose(torch.tensor([7]), 4).tokens.tolist())
    assert proposals[0] == proposals[1]


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_fixed_shape_catch_up_writes_what_the_eager_one_does(worlds, kind):
    """Padded fixed-shape catch-up passes (one round's size, then 4x wider ones, several of them)
    leave the same context K/V (and EAGLE-3's next-draft state) as one exact eager pass."""
    target, drafters = worlds["qwen3-mixed"].load()
    drafter = drafters[kind]
    c = drafter.catch_up_rows
    ids = torch.arange(3, 3 + 9 * c + 3) % target.config.vocab_size
    target.setup_cache(ids.numel() + 1)
    taps = tuple(sorted(drafter.tap_layers))
    feats = target.forward(ids, 0, taps=taps, logits="none").feats
    passes: list[str] = []
    run_fixed = drafter.run_fixed
    drafter.run_fixed = lambda key, fn, *a, **kw: passes.append(key) or run_fixed(key, fn, *a, **kw)
    long = ["context"] * 2 + ["catch_up"] if kind == "eagle3" else ["context"] * 3  # the head runs once, at the end
    for n, expected, kinds in ((1, [c], None), (c, [c], None), (c + 1, [4 * c], None), (4 * c, [4 * c], None),
                               (9 * c + 2, [4 * c] * 3, long)):
        results = []
        for static in (False, True):
            drafter.static = static
            drafter.reset(target, ids.numel() + 1)
            drafter.observe(Commit(feats[:n], ids[1 : n + 1], 0, taps))
            passes.clear()
            last = drafter.catch_up()
            results.append((drafter.cache.k.clone(), drafter.cache.v.clone(), last))
        assert [int(k.removeprefix("catch_up").removeprefix("context")) for k in passes] == expected
        assert kinds is None or [k.rstrip("0123456789") for k in passes] == kinds
        (k0, v0, last0), (k1, v1, last1) = results
        assert drafter.kv_len == n
        torch.testing.assert_close(k1[..., :n, :], k0[..., :n, :], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v1[..., :n, :], v0[..., :n, :], atol=1e-5, rtol=1e-5)
        if kind == "eagle3":
            torch.testing.assert_close(last1[0], last0[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(last1[1], last0[1], atol=1e-4, rtol=1e-4)
    drafter.static = False
