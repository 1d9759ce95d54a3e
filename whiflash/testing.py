"""Tiny checkpoints written the way upstream tools write them, for tests and benchmarks.

Targets are saved by `transformers` (`save_pretrained`); drafter folders are written key by key
from the upstream contracts (docs/design.md, "Drafters and checkpoints": `config.json` +
`model.safetensors`), independently of our own modules, so loading them checks our loaders
against the formats rather than against themselves.

"Crafted" worlds make acceptance long on purpose: every target layer's output projections are
scaled by `mix` (0 makes each layer the identity, so the residual stream is the token embedding),
embeddings share a large positive coordinate 0, and the LM-head row of token `C` points along it.
The target then continues with `C` (always when mix = 0, mostly when mix > 0), and drafters built
to read coordinate 0 propose `C` too.

Not imported by `import whiflash`; `transformers` is imported only inside `make_target`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

C = 5
"""The token crafted targets continue with (and crafted drafters propose)."""


def make_target(folder: Path, family: str = "qwen3", vocab: int = 48, hidden: int = 32, layers: int = 4,
                crafted: bool = False, mix: float = 0.0, seed: int = 0, head_conf: float = 3.0) -> Path:
    """A random (or crafted) Qwen3 / Llama-3.1 (llama3 RoPE scaling) causal LM saved with save_pretrained."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16384,
                  tie_word_embeddings=False)
    if family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=hidden // 4, **common))
    elif family == "llama":
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}
        model = LlamaForCausalLM(LlamaConfig(rope_scaling=scaling, rope_theta=500000.0, **common))
    else:
        raise ValueError(family)
    with torch.no_grad():
        for p in model.parameters():  # larger random weights than HF's init: sharper, less tied logits
            if p.dim() == 2:
                p.normal_(0, 0.3)
        if crafted:
            emb = model.model.embed_tokens.weight
            emb[:, 0] = 1.0
            emb[-1] = 0.0  # the last row is the DFlash mask token: pure coordinate 0, so drafts read C
            emb[-1, 0] = 1.0
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.mul_(mix)
                layer.mlp.down_proj.weight.mul_(mix)
            model.lm_head.weight[:, 0] = 0.0
            model.lm_head.weight[C, 0] = head_conf
            model.model.norm.weight.fill_(2.0)
    model.save_pretrained(folder)
    return Path(folder)


def _lin(out: int, inp: int, scale: float = 0.3) -> torch.Tensor:
    return torch.randn(out, inp) * scale


def make_eagle3(folder: Path, target_cfg: dict, taps: list[int], draft_vocab: int | None = None,
                crafted: bool = False, layout: str = "specforge", seed: int = 1, **flags) -> Path:
    """An EAGLE-3 drafter folder (SpecForge keys `midlayer.*`, or `layers.0.*` with layout="layers0")."""
    torch.manual_seed(seed)
    h, v = target_cfg["hidden_size"], target_cfg["vocab_size"]
    dv = draft_vocab or v
    heads, kv, hd, inter = 4, 2, h // 4, 2 * h
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h,
           "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
           "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 4096,
           "vocab_size": v, "draft_vocab_size": dv, "tie_word_embeddings": False,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": taps}, **flags}
    pre = "layers.0." if layout == "layers0" else "midlayer."
    st = {
        "fc.weight": _lin(h, len(taps) * h, 0.1),
        pre + "hidden_norm.weight": torch.ones(h), pre + "input_layernorm.weight": torch.ones(h),
        pre + "post_attention_layernorm.weight": torch.ones(h),
        pre + "self_attn.q_proj.weight": _lin(heads * hd, 2 * h), pre + "self_attn.k_proj.weight": _lin(kv * hd, 2 * h),
        pre + "self_attn.v_proj.weight": _lin(kv * hd, 2 * h), pre + "self_attn.o_proj.weight": _lin(h, heads * hd),
        pre + "mlp.gate_proj.weight": _lin(inter, h), pre + "mlp.up_proj.weight": _lin(inter, h),
        pre + "mlp.down_proj.weight": _lin(h, inter), "norm.weight": torch.ones(h), "lm_head.weight": _lin(dv, h),
    }
    if flags.get("fc_norm"):
        for i in range(len(taps)):
            st[f"fc_norm.{i}.weight"] = torch.ones(h)
    if flags.get("norm_before_fc"):
        st["input_norm.weight"] = torch.ones(len(taps) * h)
    used = list(range(v))
    if dv < v:  # reduced vocabulary: keep C and a spread of others, sorted (as SpecForge does)
        used = sorted({C, *range(0, v, max(1, v // dv))})[:dv]
        used = sorted(set(used) | {C}) if C not in used else used
        used = (used + [u for u in range(v) if u not in used])[:dv]
        used.sort()
        st["d2t"] = torch.tensor([u - i for i, u in enumerate(used)], dtype=torch.long)
        st["t2d"] = torch.tensor([i in used for i in range(v)], dtype=torch.bool)
    if crafted:  # output = fc(tap_0) = the token's embedding, whose coordinate 0 selects C
        st["fc.weight"] = torch.cat([torch.eye(h), torch.zeros(h, (len(taps) - 1) * h)], 1)
        st[pre + "self_attn.o_proj.weight"].zero_()
        st[pre + "mlp.down_proj.weight"].zero_()
        st["lm_head.weight"][:, 0] = 0.0
        st["lm_head.weight"][used.index(C), 0] = 3.0
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(st, str(folder / "model.safetensors"))
    return folder


def make_dflash(folder: Path, target_cfg: dict, taps: list[int], block_size: int = 8, mask_token_id: int | None = None,
                layers: int = 2, crafted: bool = False, seed: int = 2, draft_conf: float = 0.5) -> Path:
    """A DFlash drafter folder in the z-lab layout (unprefixed keys, no embedding, no LM head)."""
    torch.manual_seed(seed)
    h, v = target_cfg["hidden_size"], target_cfg["vocab_size"]
    heads, kv, hd, inter = 4, 2, h // 4, 2 * h
    mask = v - 1 if mask_token_id is None else mask_token_id
    cfg = {"architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
           "model_type": "qwen3", "block_size": block_size,
           "dflash_config": {"mask_token_id": mask, "target_layer_ids": taps},
           "num_target_layers": target_cfg["num_hidden_layers"], "num_hidden_layers": layers, "hidden_size": h,
           "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 4096, "vocab_size": v,
           "attention_bias": False, "tie_word_embeddings": False}
    st = {"fc.weight": _lin(h, len(taps) * h, 0.1), "hidden_norm.weight": torch.ones(h), "norm.weight": torch.ones(h)}
    for i in range(layers):
        p = f"layers.{i}."
        st.update({p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h),
                   p + "self_attn.q_proj.weight": _lin(heads * hd, h), p + "self_attn.k_proj.weight": _lin(kv * hd, h),
                   p + "self_attn.v_proj.weight": _lin(kv * hd, h), p + "self_attn.o_proj.weight": _lin(h, heads * hd),
                   p + "self_attn.q_norm.weight": torch.ones(hd), p + "self_attn.k_norm.weight": torch.ones(hd),
                   p + "mlp.gate_proj.weight": _lin(inter, h), p + "mlp.up_proj.weight": _lin(inter, h),
                   p + "mlp.down_proj.weight": _lin(h, inter)})
        if crafted:  # layers add nothing: every masked slot reads norm(embed(MASK)), whose coordinate 0 picks C
            st[p + "self_attn.o_proj.weight"].zero_()
            st[p + "mlp.down_proj.weight"].zero_()
    if crafted:
        st["norm.weight"].fill_(draft_conf)  # less confident than the target: trees get real siblings
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(st, str(folder / "model.safetensors"))
    return folder


def _tensors_like(out: Any, make: Callable[[Tensor], Tensor]) -> Any:
    """`out` (tensors in tuples, lists, dicts and dataclasses) with every tensor replaced by `make(tensor)`."""
    if isinstance(out, Tensor):
        return make(out)
    if isinstance(out, (tuple, list)):
        return type(out)(_tensors_like(x, make) for x in out)
    if isinstance(out, dict):
        return {k: _tensors_like(v, make) for k, v in out.items()}
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        return dataclasses.replace(out, **{f.name: _tensors_like(getattr(out, f.name), make)
                                           for f in dataclasses.fields(out) if f.init})
    return out


class EmulatedGraph:
    """`whiflash.runtime.graphs.Graphed`'s contract on the CPU: inputs copied into static buffers (or read in
    place with `alias`), outputs the same tensors on every call, overwritten by the next call. Decoding
    through it shows where a caller keeps a graph output across replays (a real graph would overwrite it);
    it does not show a pass that reads a module tensor made anew after capture (it re-runs the Python,
    `tests/test_runtime.py` checks that instead)."""

    def __init__(self, fn: Callable[..., Any], *example_inputs: Tensor, warmup: int = 2, alias: bool = False) -> None:
        self.fn = fn
        self.inputs = list(example_inputs) if alias else [x.clone() for x in example_inputs]
        for _ in range(warmup):
            fn(*self.inputs)
        given = {id(x) for x in self.inputs}
        self.outputs = _tensors_like(fn(*self.inputs), lambda t: t if id(t) in given else t.clone())
        self._kept: list[Tensor] = []
        _tensors_like(self.outputs, self._kept.append)

    def __call__(self, *inputs: Any) -> Any:
        from whiflash.runtime.graphs import copy_inputs

        copy_inputs(self.inputs, inputs)  # a `Prefix` leaves the last call's rows in the padding, as a graph does
        fresh: list[Tensor] = []
        _tensors_like(self.fn(*self.inputs), fresh.append)
        for static, x in zip(self._kept, fresh):
            if static is not x:
                static.copy_(x)
        return self.outputs


@contextlib.contextmanager
def emulated_graphs(*models: Any) -> Iterator[None]:
    """Run `models`' fixed-shape passes through `EmulatedGraph`s (CPU tests of the CUDA-graph path)."""
    from whiflash.runtime import graphs

    real, before = graphs.Graphed, [m.graphs for m in models]
    graphs.Graphed = EmulatedGraph
    for m in models:
        m.graphs = {}
    try:
        yield
    finally:
        graphs.Graphed = real
        for m, had in zip(models, before):  # as they were (graphs off, or the real graphs captured before)
            m.graphs = had
