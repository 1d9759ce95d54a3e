"""Drafters behind one interface, and `load_drafter` for upstream checkpoints."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from whiflash.drafters import dflash, eagle3
from whiflash.drafters.base import Commit, Drafter, Proposal, write_checkpoint
from whiflash.drafters.ddtree import DDTreeDrafter
from whiflash.drafters.dflash import DFlashDrafter
from whiflash.drafters.eagle3 import Eagle3Drafter
from whiflash.runtime.weights import load_strict, read_json, read_state_dict, resolve_checkpoint

__all__ = [
    "Commit", "DDTreeDrafter", "DFlashDrafter", "Drafter", "Eagle3Drafter", "Proposal",
    "build_drafter", "load_drafter", "write_checkpoint",
]
log = logging.getLogger(__name__)
KINDS = ("eagle3", "dflash", "ddtree")
#: The keyword options `load_drafter` accepts for each kind (see `build_drafter`).
OPTIONS: dict[str, tuple[str, ...]] = {
    "eagle3": ("num_steps", "own_embedding"),
    "dflash": ("block_size", "mask_token_id"),
    "ddtree": ("tree_budget", "block_size", "mask_token_id"),
}


def _check_target(kind: str, source: str, cfg: dict[str, Any], target: Any) -> None:
    """Refuse a drafter that cannot run against this target, naming both sides."""
    tc = target.config
    layers = tc.num_hidden_layers
    bad = [i for i in cfg["tap_layers"] if not 0 <= i < layers]
    if bad:
        raise ValueError(
            f"{source}: {kind} tap layers {cfg['tap_layers']} include {bad}, beyond target {target.name!r} "
            f"which has {layers} layers (valid: 0..{layers - 1})"
        )
    if cfg.get("vocab_size") != tc.vocab_size:
        raise ValueError(f"{source}: {kind} vocab_size {cfg.get('vocab_size')} != target vocab_size {tc.vocab_size}")
    feat = cfg.get("target_hidden_size", cfg["hidden_size"])
    if feat != tc.hidden_size:
        raise ValueError(f"{source}: {kind} expects target hidden size {feat}, target has {tc.hidden_size}")


def build_drafter(
    kind: str,
    cfg: dict[str, Any],
    target: Any,
    *,
    num_steps: int = 6,
    own_embedding: bool = False,
    block_size: int | None = None,
    tree_budget: int | None = None,
    mask_token_id: int | None = None,
) -> Drafter:
    """A randomly initialised drafter of `kind` for a raw upstream config (used by loaders and training).

    num_steps: EAGLE-3 chain length. block_size: DFlash/DDTree block (default: the config's).
    tree_budget: DDTree nodes per round (default block_size - 1). mask_token_id: DFlash mask id
    when the config has none.
    """
    layers = target.config.num_hidden_layers
    if kind == "eagle3":
        return Eagle3Drafter(eagle3.normalise_config(cfg, layers), num_steps=num_steps, own_embedding=own_embedding)
    cfg = dflash.normalise_config(cfg, layers, mask_token_id)
    if kind == "dflash":
        return DFlashDrafter(cfg, block_size=block_size)
    if kind == "ddtree":
        return DDTreeDrafter(cfg, block_size=block_size, tree_budget=tree_budget)
    raise ValueError(f"drafter kind {kind!r} is not one of {KINDS}")


def check_options(kind: str, options: dict[str, Any]) -> None:
    """Refuse an unknown `kind` and options that do not apply to it, naming the option and the kind."""
    if kind not in KINDS:
        raise ValueError(f"drafter kind {kind!r} is not one of {KINDS}")
    foreign = sorted(set(options) - set(OPTIONS[kind]))
    if foreign:
        raise ValueError(f"load_drafter: option(s) {foreign} do not apply to drafter kind {kind!r} "
                         f"(its options: {list(OPTIONS[kind])})")


def load_drafter(kind: str, name_or_path: str | Path, target: Any, **options: Any) -> Drafter:
    """Load an upstream drafter checkpoint (Hub repo id or local folder) for `target`.

    kind: "eagle3" (options: num_steps), "dflash" (block_size, mask_token_id) or "ddtree"
    (tree_budget, block_size, mask_token_id). Weights load strictly; the only keys allowed to be
    absent are the ones that come from the target (embedding) or have a documented default.
    """
    check_options(kind, options)
    folder = resolve_checkpoint(name_or_path, f"{kind} drafter")
    source = str(folder)
    raw = read_json(folder / "config.json", f"the config.json of a {kind} drafter")
    state = read_state_dict(folder)
    allow: tuple[str, ...] = ()
    if kind == "eagle3":
        state = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in state.items()}
        options.setdefault("own_embedding", "embed_tokens.weight" in state)
        for key in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"):
            if key not in raw and key not in (raw.get("transformer_layer_config") or {}):
                raise ValueError(f"{source}/config.json: required field {key!r} is missing")
        drafter = build_drafter(kind, raw, target, **options)
        reduced = drafter.cfg["draft_vocab_size"] != drafter.cfg["vocab_size"]
        allow = ("t2d",) if reduced else ("d2t", "t2d")
        if reduced and "d2t" not in state:
            raise KeyError(f"{source}: missing key 'd2t' (required when draft_vocab_size < vocab_size)")
    else:
        for key in ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers", "vocab_size"):
            if key not in raw:
                raise ValueError(f"{source}/config.json: required field {key!r} is missing")
        drafter = build_drafter(kind, raw, target, **options)
        if not 0 <= drafter.mask_token_id < target.config.vocab_size:
            raise ValueError(
                f"{source}: mask_token_id {drafter.mask_token_id} is not a row of the target's embedding "
                f"(vocab_size {target.config.vocab_size})"
            )
    _check_target(kind, source, drafter.cfg, target)
    load_strict(drafter, state, source, allow_missing=allow)
    drafter.to(device=target.device, dtype=target.dtype)
    # d2t/t2d are integer/bool buffers; .to(dtype) leaves them alone, which is what we want.
    drafter.eval()
    log.info("loaded %s drafter %s (taps %s)", kind, name_or_path, list(drafter.tap_layers))
    return drafter
