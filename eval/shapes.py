"""Real model shapes with random weights (`whiflash-eval profile --random-weights --preset NAME`).

The configs are the offline copies in `checkpoints/<preset>/{target,eagle3,dflash}/config.json`, or
a folder holding `{target,eagle3,dflash}/config.json` (a built testbed), so a testbed's cost ratios
can be set beside a real model's (`scripts/profile_shapes.py --models qwen3-8b,runs/testbed/small`).
Models are built on the meta device and materialised with small random weights, so an 8B target
is measured at its real shape without a download or a weights file. Latency depends on shapes,
not on weight values; acceptance does not exist here (random drafts are rejected).

`toy=True` writes `TOY_WIDTHS` over every config (layer counts and tap layers stay): a CPU check
of the code path at real depth, whose timings mean nothing.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from whiflash.drafters import DFlashDrafter, Eagle3Drafter, build_drafter
from whiflash.runtime import ModelConfig, Target

from .presets import checkpoints_dir, get_preset

__all__ = ["TOY_WIDTHS", "random_drafter", "random_models", "randomise", "shape_config"]

TOY_WIDTHS = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
              "head_dim": 32, "vocab_size": 2048, "draft_vocab_size": 512, "target_hidden_size": 64}
"""Widths that `toy=True` writes over every config (layer counts and tap layers stay)."""


def shape_config(preset: str, part: str, toy: bool = False) -> dict[str, Any]:
    """The `config.json` of `part` (target, eagle3 or dflash) of `preset` (a preset name or a folder such
    as a testbed), shrunk when `toy`."""
    if Path(preset).is_dir():
        path = Path(preset) / part / "config.json"
    else:
        get_preset(preset)  # an unknown name lists the known ones
        path = checkpoints_dir() / preset / part / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{preset} --random-weights: expected the {part} config at {path}")
    cfg = json.loads(path.read_text())
    if toy:
        cfg.update({k: v for k, v in TOY_WIDTHS.items() if k in cfg})
        if "dflash_config" in cfg:  # the mask token must be a row of the shrunk vocabulary
            cfg["dflash_config"]["mask_token_id"] = TOY_WIDTHS["vocab_size"] - 1
    return cfg


def randomise(module: torch.nn.Module, device: torch.device | str, dtype: torch.dtype) -> torch.nn.Module:
    """Materialise a meta-built module on `device` in `dtype` with small random weights (norms at 1)."""
    module = module.to(dtype=dtype).to_empty(device=device)
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(1.0) if p.dim() == 1 else p.normal_(0, 0.02)
        for b in module.buffers():
            if b.dtype == torch.long:
                b.zero_()  # EAGLE-3's d2t offsets: draft id = target id
            elif b.dtype == torch.bool:
                b.fill_(True)
    return module.eval()


def random_drafter(kind: str, cfg: dict[str, Any], target: Target, **options: Any) -> Any:
    """A drafter of `kind` for the raw config `cfg` with random weights, on the target's device and dtype."""
    with torch.device("meta"):
        drafter = build_drafter(kind, cfg, target, **options)
    return randomise(drafter, target.device, target.dtype)


def random_models(preset: str, device: torch.device | str, dtype: torch.dtype, *, toy: bool = False,
                  eagle_num_steps: int = 6) -> tuple[Target, Eagle3Drafter, DFlashDrafter]:
    """Target, EAGLE-3 (`eagle_num_steps` chain) and DFlash drafter of `preset` at its real shapes,
    random weights (DDTree rounds use the DFlash drafter with a tree budget)."""
    tcfg = shape_config(preset, "target", toy)
    cfg = ModelConfig.from_dict(tcfg, source=f"{preset}/target/config.json")
    with torch.device("meta"):
        target = Target(cfg, name=f"{preset} (random weights{', toy widths' if toy else ''})")
    target = randomise(target, device, dtype)
    if cfg.tie_word_embeddings:
        target.lm_head.weight = target.model.embed_tokens.weight
    eagle = random_drafter("eagle3", shape_config(preset, "eagle3", toy), target, num_steps=eagle_num_steps)
    dflash = random_drafter("dflash", shape_config(preset, "dflash", toy), target)
    return target, eagle, dflash
