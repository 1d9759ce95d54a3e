"""Compiled decoder layers in the testbed's training stages: same numbers as eager, eager when compiling fails."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from whiflash.testbed.compiled import compile_layers, compiled_or_eager, eager_layers


def _model(layers: int = 3) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                        max_position_embeddings=64))


def test_compiled_layers_share_one_graph_and_match_eager() -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model, x = _model(4), torch.randint(0, 128, (2, 16))
    ref = model(input_ids=x, use_cache=False).logits
    compile_layers(model, backend="aot_eager")  # dynamo + autograd tracing without code generation: fast on a CPU
    out = model(input_ids=x, use_cache=False).logits
    out.sum().backward()
    torch.testing.assert_close(out, ref)
    assert counters["stats"]["unique_graphs"] == 1  # one graph for all four layers: compile time does not grow with depth
    assert set(model.state_dict()) == set(_model(4).state_dict())  # checkpoints keep their key names
    eager_layers(model)
    assert all(layer._compiled_call_impl is None for layer in model.model.layers)


def test_a_failing_compilation_falls_back_to_eager_layers(caplog: pytest.LogCaptureFixture) -> None:
    model = _model()

    def trial() -> None:
        raise RuntimeError("inductor: no C++ compiler\nmore detail")

    with caplog.at_level(logging.WARNING, logger="whiflash.testbed.compiled"):
        assert compiled_or_eager(model, trial, "target", backend="aot_eager") is False
    assert all(layer._compiled_call_impl is None for layer in model.model.layers)
    assert "target: compiled decoder layers failed (RuntimeError: inductor: no C++ compiler); running them eagerly" \
        in caplog.text


def test_compile_layers_names_what_it_expected() -> None:
    with pytest.raises(TypeError, match="expected a transformers causal LM with .model.layers"):
        compile_layers(torch.nn.Linear(2, 2))


@pytest.mark.slow  # Inductor's C++ compile of forward and backward takes ~35 s on a 2-core CPU
def test_target_stage_trains_with_compiled_layers(micro: Path, tmp_path: Path) -> None:
    """The target stage with compiled layers (Inductor, here on the CPU) compiles, trains and saves a loadable target."""
    import json

    from transformers import AutoModelForCausalLM

    from whiflash.testbed.presets import get_preset
    from whiflash.testbed.target import train_target
    from whiflash.testbed.tokenizer import load_tokenizer

    cfg = get_preset("micro").target
    cfg.max_steps, cfg.val_every = 3, 0
    tok_info = json.loads((micro / "manifest.json").read_text())["stages"]["tokenizer"]
    figures = train_target(cfg, tok_info, micro / "tokens", load_tokenizer(micro / "tokenizer"), tmp_path / "t",
                           compile_layers=True)
    assert figures["compiled_layers"] is True and figures["steps"] == 3
    assert AutoModelForCausalLM.from_pretrained(str(tmp_path / "t")).config.num_hidden_layers == cfg.num_hidden_layers
