"""Our forward against transformers, tree verify against chains, and KV compaction."""
from __future__ import annotations

import contextlib
import fnmatch
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import whiflash
from whiflash.drafters.trees import ancestor_mask
from whiflash.runtime import layers
from whiflash.runtime.layers import rope_inv_freq


@pytest.mark.parametrize("name", ["qwen3-random", "llama-random"])
def test_logits_and_taps_match_transformers(worlds, name):
    world = worlds[name]
    ref = AutoModelForCausalLM.from_pretrained(world.target_dir, dtype=torch.float32).eval()
    ours = whiflash.load_target(world.target_dir)
    ids = torch.randint(0, world.target_cfg["vocab_size"], (23,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = ref(ids[None], output_hidden_states=True)
    ours.setup_cache(64)
    taps = (3, 2, 0, 1)  # every layer, the last (whose HF entry is post-norm) first
    assert len(ours.model.layers) == len(taps)
    out = ours(ids, 0, taps=taps)
    torch.testing.assert_close(out.logits, expected.logits[0], atol=2e-5, rtol=1e-5)
    for j, layer in enumerate(taps):  # "output of layer i" is HF hidden_states[i + 1]
        torch.testing.assert_close(out.feats[:, j], expected.hidden_states[layer + 1][0], atol=2e-5, rtol=1e-5)
    # the fixed-shape pass (what CUDA graphs capture) taps the same tensors, run as two passes (the first
    # layers, then the rest: two graphs on a GPU) with taps on both sides of the split
    ours.static = True
    ours(ids[:15], 0)
    passes, run_fixed = [], ours.run_fixed
    ours.run_fixed = lambda key, fn, *a, **kw: passes.append((key[-1], kw.get("alias_inputs", False))) or \
        run_fixed(key, fn, *a, **kw)
    chain = ours(ids[15:], 15, taps=taps)
    del ours.run_fixed
    assert passes == [("head", False), ("tail", True)]
    for j, layer in enumerate(taps):
        torch.testing.assert_close(chain.feats[:, j], expected.hidden_states[layer + 1][0, 15:], atol=2e-5, rtol=1e-5)
    ours.static = False
    # incremental: prefill 15, then a 1-token step and a 7-token chain give the same rows
    ours.setup_cache(64)
    ours(ids[:15], 0)
    step = ours(ids[15:16], 15)
    chain = ours(ids[16:], 16)
    torch.testing.assert_close(torch.cat([step.logits, chain.logits]), expected.logits[0, 15:], atol=2e-5, rtol=1e-5)


def test_llama3_rope_scaling_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=2, max_position_embeddings=131072, rope_parameters=params)
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    ours = rope_inv_freq(128, 500000.0, params)
    torch.testing.assert_close(ours, expected.float())
    assert not torch.allclose(ours, rope_inv_freq(128, 500000.0)), "scaling must change long wavelengths"


def test_sharded_checkpoint_loads(worlds, tmp_path):
    world = worlds["qwen3-random"]
    sharded = tmp_path / "sharded"
    shutil.copytree(world.target_dir, sharded)
    state = load_file(str(sharded / "model.safetensors"))
    (sharded / "model.safetensors").unlink()
    keys = sorted(state)
    halves = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    weight_map = {}
    for file, part in halves.items():
        save_file({k: state[k] for k in part}, str(sharded / file))
        weight_map.update({k: file for k in part})
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    a, b = whiflash.load_target(world.target_dir), whiflash.load_target(sharded)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)


def test_target_loader_errors(worlds, tmp_path):
    world = worlds["qwen3-random"]
    broken = tmp_path / "broken"
    shutil.copytree(world.target_dir, broken)
    state = load_file(str(broken / "model.safetensors"))
    del state["model.layers.1.self_attn.k_norm.weight"]
    save_file(state, str(broken / "model.safetensors"))
    with pytest.raises(KeyError, match="model.layers.1.self_attn.k_norm.weight"):
        whiflash.load_target(broken)
    (broken / "model.safetensors").unlink()
    (broken / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(FileNotFoundError, match="pickle formats are refused"):
        whiflash.load_target(broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        whiflash.load_target(broken)
    with pytest.raises(FileNotFoundError, match="not a Hub repo id"):
        whiflash.load_target(tmp_path / "nowhere" / "deeper")


def _tree():
    # root -> a(1), b(2); a -> c(3), d(4); c -> e(5)
    parents = torch.tensor([0, 0, 1, 1, 3])
    depths = torch.tensor([1, 1, 2, 2, 3])
    return parents, depths


def test_tree_verify_equals_each_root_to_node_chain(worlds):
    target = whiflash.load_target(worlds["llama-random"].target_dir)
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    nodes = torch.tensor([7, 11, 13, 17, 19])
    parents, depths = _tree()
    mask = ancestor_mask(parents)
    target.setup_cache(64)
    target(prompt, 0)
    n = prompt.shape[0]
    ids = torch.cat([torch.tensor([8]), nodes])
    tree = target(ids, n, n + torch.cat([torch.zeros(1, dtype=torch.long), depths]), mask)
    for node in range(6):
        path = mask[node].nonzero().squeeze(-1)
        target.setup_cache(64)
        chain = target(torch.cat([prompt, ids[path]]), 0)
        torch.testing.assert_close(tree.logits[node], chain.logits[-1], atol=2e-5, rtol=1e-5)


def test_compaction_keeps_the_accepted_path(worlds):
    target = whiflash.load_target(worlds["qwen3-random"].target_dir)
    prompt = torch.tensor([2, 7, 1, 8, 2, 8])
    nodes = torch.tensor([10, 20, 30, 40, 41])
    parents, depths = _tree()
    target.setup_cache(64)
    target(prompt, 0)
    n = prompt.shape[0]
    ids = torch.cat([torch.tensor([9]), nodes])
    target(ids, n, n + torch.cat([torch.zeros(1, dtype=torch.long), depths]), ancestor_mask(parents))
    path = torch.tensor([0, 1, 3, 5])  # root -> a -> c -> e: not a prefix of the slot order
    target.compact(n, path)
    after = target(torch.tensor([33]), n + 4)
    target.setup_cache(64)
    fresh = target(torch.cat([prompt, ids[path], torch.tensor([33])]), 0)
    torch.testing.assert_close(after.logits[-1], fresh.logits[-1], atol=2e-5, rtol=1e-5)


def test_bf16_forward_runs_and_is_close(worlds):
    world = worlds["qwen3-random"]
    f32 = whiflash.load_target(world.target_dir)
    bf16 = whiflash.load_target(world.target_dir, dtype=torch.bfloat16)
    ids = torch.arange(1, 12)
    f32.setup_cache(32)
    bf16.setup_cache(32)
    a, b = f32(ids, 0).logits, bf16(ids, 0).logits
    assert b.dtype == torch.float32 and bf16.cache.k.dtype == torch.bfloat16
    assert (a - b).abs().max() < 0.1 * a.abs().max()


def test_cudnn_attention_is_kept_for_fixed_shape_passes(worlds, monkeypatch):
    """cuDNN attention builds a plan per new shape, so passes whose key length changes (eager decoding,
    prefill) run without it, and the fixed-shape passes that CUDA graphs capture (whole cache under a
    mask) keep PyTorch's choice."""
    restricted: list[bool] = []
    calls: list[tuple[bool, int]] = []  # (cuDNN left out, key length) per attention call

    @contextlib.contextmanager
    def spy_kernel(backends):
        assert torch.nn.attention.SDPBackend.CUDNN_ATTENTION not in backends
        restricted.append(True)
        try:
            yield
        finally:
            restricted.pop()

    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy_sdpa(q, k, v, **kwargs):
        calls.append((bool(restricted), k.shape[-2]))
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(layers, "sdpa_kernel", spy_kernel)
    monkeypatch.setattr(layers.F, "scaled_dot_product_attention", spy_sdpa)
    target, drafters = worlds["qwen3-mixed"].load()
    for static in (False, True):
        calls.clear()
        for m in [target, *drafters.values()]:
            m.static = static
        for drafter in [None, *drafters.values()]:
            whiflash.generate(target, drafter, [7, 8, 9, 10, 11, 12], 12)
        cache_lengths = {m.cache.slots for m in [target, *drafters.values()]}
        unrestricted = {length for left_out, length in calls if not left_out}
        if static:
            assert unrestricted and unrestricted <= cache_lengths  # only whole-cache passes keep cuDNN
            assert any(left_out for left_out, _ in calls)  # prefill: a new length per prompt
        else:
            assert not unrestricted


def test_hub_repo_ids_download_only_json_and_safetensors(worlds, monkeypatch):
    import huggingface_hub

    world = worlds["qwen3-random"]
    asked = {}

    def fake_snapshot_download(repo_id, allow_patterns=None, **kw):
        asked["repo"], asked["patterns"] = repo_id, allow_patterns
        return str(world.target_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    target = whiflash.load_target("Qwen/Qwen3-8B")
    assert asked["repo"] == "Qwen/Qwen3-8B" and target.name == "Qwen/Qwen3-8B"
    allowed = lambda name: any(fnmatch.fnmatch(name, p) for p in asked["patterns"])  # noqa: E731
    assert allowed("config.json") and allowed("model-00001-of-00004.safetensors")
    assert not any(allowed(n) for n in ("pytorch_model.bin", "model.pt", "weights.pth", "modeling_qwen3.py"))

    def offline(repo_id, **kw):
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(FileNotFoundError, match="'org/missing'.*Hub download failed: no network"):
        whiflash.load_target("org/missing")


def test_stacked_projections_keep_hf_names_and_maths() -> None:
    """Q/K/V and gate/up run as one stacked GEMM each, yet load and save under transformers' names."""
    import torch.nn.functional as F

    from whiflash.runtime.layers import Attention, SwiGLU

    torch.manual_seed(0)
    attn = Attention(16, 16, n_heads=4, n_kv=2, head_dim=4, bias=True)
    names = {f"{p}.{leaf}" for p in ("q_proj", "k_proj", "v_proj", "o_proj") for leaf in ("weight", "bias")}
    assert set(attn.state_dict()) == names
    hf = {k: torch.randn(v.shape) for k, v in attn.state_dict().items()}
    attn.load_state_dict(hf)  # HF keys in, stacked inside
    assert torch.equal(attn.qkv.weight, torch.cat([hf["q_proj.weight"], hf["k_proj.weight"], hf["v_proj.weight"]]))
    x = torch.randn(5, 16)
    assert torch.allclose(attn.q(x), F.linear(x, hf["q_proj.weight"], hf["q_proj.bias"]), atol=1e-6)
    assert torch.allclose(attn.v(x), F.linear(x, hf["v_proj.weight"], hf["v_proj.bias"]), atol=1e-6)
    out = attn.state_dict()
    assert all(torch.equal(out[k], hf[k]) for k in names)
    with torch.no_grad():  # the saved parts are views: copying into them (load_strict) fills the stacked weight
        out["k_proj.weight"].zero_()
    assert attn.qkv.weight[16:24].abs().sum() == 0

    mlp = SwiGLU(8, 12)
    assert set(mlp.state_dict()) == {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}
    hf = {k: torch.randn(v.shape) for k, v in mlp.state_dict().items()}
    mlp.load_state_dict(hf)
    y = torch.randn(3, 8)
    ref = F.linear(F.silu(F.linear(y, hf["gate_proj.weight"])) * F.linear(y, hf["up_proj.weight"]), hf["down_proj.weight"])
    assert torch.allclose(mlp(y), ref, atol=1e-5)


def _held_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Tensors a module keeps outside its parameters and buffers (and in dicts and its rotary tables)."""
    out: dict[str, torch.Tensor] = {}
    for owner, obj in (("", module), ("rope.", getattr(module, "rope", None))):
        for name, value in (vars(obj) if obj is not None else {}).items():
            if isinstance(value, torch.Tensor):
                out[owner + name] = value
            elif isinstance(value, dict):
                out.update({f"{owner}{name}[{key}]": v for key, v in value.items() if isinstance(v, torch.Tensor)})
    return out


def test_a_new_sequence_keeps_the_tensors_graphs_read(worlds):
    """A captured CUDA graph reads the tensors its pass takes from the module (column indices, DFlash's mask
    tokens, rotary tables) in place and does not keep them alive, so a sequence that fits the caches must
    not make any of them anew (DFlash's mask tokens were, and its block graph read freed memory: an
    out-of-range embedding index on the GPU)."""
    target, drafters = worlds["qwen3-mixed"].load()
    for m in (target, *drafters.values()):
        m.static = True  # the fixed-shape passes, as graphs would capture them
    target.setup_cache(128)  # drafters size their caches by the target's: every sequence below fits
    for drafter in drafters.values():
        whiflash.generate(target, drafter, [7, 8, 9, 10, 11, 12], 24)
    before = {name: _held_tensors(m) for name, m in (("target", target), *drafters.items())}
    for drafter in drafters.values():
        whiflash.generate(target, drafter, [1, 2, 3], 12)
    for name, m in (("target", target), *drafters.items()):
        after = _held_tensors(m)
        made_anew = [key for key, t in before[name].items() if after.get(key) is not t]
        assert not made_anew, f"{name}: {made_anew} made anew for a sequence that fits"


def test_a_drafter_given_another_target_drops_its_graphs(worlds):
    """Captured drafter passes read their target's LM head and embeddings in place: a drafter reset with a
    different target must capture afresh; with the same target its graphs stay."""
    target, drafters = worlds["qwen3-mixed"].load()
    other, _ = worlds["qwen3-mixed"].load()
    for drafter in drafters.values():
        drafter.reset(target, 64)
        drafter.graphs = {"captured": object()}  # stands in for a CUDA graph (none on the CPU)
        drafter.reset(target, 64)
        assert drafter.graphs, drafter.kind
        drafter.reset(other, 64)
        assert drafter.graphs == {}, drafter.kind


def test_a_prefix_input_fills_the_first_rows_and_leaves_the_padding_alone():
    """A catch-up shorter than its fixed width passes a `Prefix`: run directly (and at capture) it gets zero rows
    appended; a replay copies it over the static input's first rows and neither allocates nor fills the rest,
    which keeps the last call's rows (the pass must not read them; `tests/test_lossless.py` decodes through it)."""
    from whiflash.runtime.graphs import Prefix, copy_inputs

    x = torch.arange(6.0).view(3, 2)
    assert torch.equal(Prefix(x, 5).padded(), torch.cat([x, torch.zeros(2, 2)]))
    assert Prefix(x, 3).padded() is x
    with pytest.raises(ValueError, match="a fixed-shape pass of 2 rows got 3"):
        Prefix(x, 2).padded()
    static, whole = torch.full((5, 2), 9.0), torch.zeros(4)
    copy_inputs([static, whole], (Prefix(x, 5), torch.ones(4)))
    assert torch.equal(static, torch.cat([x, torch.full((2, 2), 9.0)])) and torch.equal(whole, torch.ones(4))
