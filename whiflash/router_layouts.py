"""Reading a neural router from any exported 2-layer MLP in safetensors, whatever its tensors are called.

`whiflash.router.load_router` reads this toolkit's own export strictly. A router exported by other
code (the released `WhiFlash/*-NeuralRouter-*` repositories among them, whose layout this toolkit
has not seen) comes here instead: the two linear layers are found by their shapes, `[M, H]` then
`[1, M]` (or the transposed `[H, M]`, `[M, 1]` of kernels stored input-first), their biases by name
(`fc1.weight` -> `fc1.bias`, `w1` -> `b1`, `kernel` -> `bias`) or else by size, and the optional input
normalisation by name (`mean`/`mu`/`loc`, and `std`/`sigma`/`scale` or `var`; sklearn's `mean_`,
`scale_`, `var_` too). H and M come from the shapes; without statistics the input is used as is.
Every tensor must find its place (strict loading): anything left over, or a set of tensors that is
not one 2-layer MLP, is refused with the list of tensors found.

What the weights cannot say comes from a config, when one travels with them (`config.json`, the
safetensors metadata) under common names (`drafters`/`pair`, `tree_budget`, `threshold`, `target`,
`activation`), else from an upstream-style repo name (`...-NeuralRouter-ddt-e3-b128`), else from the
run that loads it (its pair), with a warning. The activation is GELU unless the config names another.
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

log = logging.getLogger(__name__)

__all__ = ["ACTIVATIONS", "MlpLayout", "find_layout", "hints_from", "router_from_state"]

ACTIVATIONS = ("gelu", "relu", "silu", "tanh")
"""Activations a router config may name (`activation`, `act`, `hidden_act`)."""

_MEAN = re.compile(r"(^|[._])(mean|mu|avg|center|loc|shift|input_mean|feature_mean)_?$", re.IGNORECASE)
_STD = re.compile(r"(^|[._])(std|sigma|scale|stdev|input_std|feature_std)_?$", re.IGNORECASE)
_VAR = re.compile(r"(^|[._])(var|variance)_?$", re.IGNORECASE)
_NAME_HINT = re.compile(r"NeuralRouter-(df-e3|ddt-e3|df-ddt)(?:-b(\d+))?", re.IGNORECASE)


@dataclass(frozen=True)
class MlpLayout:
    """Where the parts of a 2-layer MLP router sit in a state dict (tensor names; None when absent)."""

    w1: str
    b1: str | None
    w2: str
    b2: str | None
    mean: str | None
    spread: str | None
    """The std (or variance, `spread_is_var`) of the input normalisation."""
    spread_is_var: bool
    transposed: bool
    """Weights stored input-first (`[H, M]`, `[M, 1]`), as Keras/Flax kernels are."""
    hidden_size: int
    mlp_dim: int

    def describe(self) -> str:
        parts = [f"{self.w1} [{self.mlp_dim}x{self.hidden_size}]" + (" (transposed)" if self.transposed else ""),
                 f"{self.w2} [{self.mlp_dim} to 1]", f"biases {self.b1 or 'none'} / {self.b2 or 'none'}",
                 f"normalisation {self.mean or 'none'} / {self.spread or 'none'}" + (" (variance)" if self.spread_is_var
                                                                                    else "")]
        return ", ".join(parts)


def _listing(state: dict[str, Tensor]) -> str:
    return ", ".join(f"{k} {list(v.shape)}" for k, v in sorted(state.items()))


def _stem(name: str) -> str:
    """The name with its parameter part dropped: `net.0.weight` -> `net.0`, `w1` -> `1`, `kernel` -> ``."""
    for tail in ("weight", "kernel", "bias"):
        if name.endswith(tail):
            return name[: -len(tail)].rstrip("._/")
    return re.sub(r"^(.*?)[wWbB](_?\d+)$", r"\1\2", name)


def find_layout(state: dict[str, Tensor], source: str) -> MlpLayout:
    """The `MlpLayout` of `state`, or a ValueError naming `source`, every tensor found and what was expected."""
    expected = ("expected one 2-layer MLP: weights [M, H] and [1, M] (or input-first [H, M] and [M, 1]), optional "
                "biases [M] and [1], optional input normalisation mean and std (or var) of size H")

    def refuse(why: str) -> ValueError:
        return ValueError(f"router {source}: cannot read its tensors as a router ({why}); found {_listing(state)}; "
                          f"{expected}")

    mats = {k: v for k, v in state.items() if v.dim() == 2 and v.is_floating_point()}
    if len(mats) != 2:
        raise refuse(f"{len(mats)} two-dimensional float tensors, expected 2")
    # the output layer is the weight with a side of 1 ([1, M], or [M, 1] stored input-first)
    (kb, b), (ka, a) = sorted(mats.items(), key=lambda kv: (min(kv[1].shape), kv[0]))
    if min(b.shape) != 1:
        raise refuse(f"no weight with a side of 1 for the output layer ({ka} {list(a.shape)}, {kb} {list(b.shape)})")
    m = b.shape[1] if b.shape[0] == 1 else b.shape[0]
    if a.shape[0] == m and (a.shape[1] != m or not ka.endswith("kernel")):
        transposed, h = False, a.shape[1]
    elif a.shape[1] == m:  # [H, M]: input-first, as Keras/Flax kernels
        transposed, h = True, a.shape[0]
    else:
        raise refuse(f"{ka} {list(a.shape)} does not feed {kb} {list(b.shape)} (no side of {m})")
    vecs = {k: v for k, v in state.items() if k not in mats}
    for k, v in vecs.items():
        if not v.is_floating_point() or v.dim() > 1:
            raise refuse(f"{k} {list(v.shape)} is neither a bias nor a normalisation vector")
    used: set[str] = set()

    def pick(size: int, stem: str, names: re.Pattern[str] | None = None) -> str | None:
        """The vector of `size` whose name matches the weight's `stem` (a bias) or `names`; else the only unused
        vector of that size that no name claims for something else."""
        sized = [k for k, v in vecs.items() if k not in used and v.numel() == size]
        named = [k for k in sized if (names.search(k) if names else _stem(k) == stem)]
        if not named and names is None:
            named = [k for k in sized if not (_MEAN.search(k) or _STD.search(k) or _VAR.search(k))]
            if len(named) > 1:
                raise refuse(f"several vectors of size {size} could be the bias of the layer {stem or '?'}: {named}")
        if len(named) > 1:
            raise refuse(f"several vectors match {names.pattern if names else stem!r}: {named}")
        if named:
            used.add(named[0])
            return named[0]
        return None

    b2 = pick(1, _stem(kb))
    b1 = pick(m, _stem(ka))
    mean = pick(h, "", _MEAN)
    spread = pick(h, "", _STD)
    is_var = False
    if spread is None:
        spread, is_var = pick(h, "", _VAR), True
    left = sorted(set(vecs) - used)
    if left:
        raise refuse(f"tensors {left} have no place in a 2-layer MLP")
    if (mean is None) != (spread is None):
        raise refuse("an input mean without a std (or the other way round)")
    return MlpLayout(ka, b1, kb, b2, mean, spread, is_var and spread is not None, transposed, h, m)


def _first(config: dict[str, Any], *names: str) -> Any:
    return next((config[n] for n in names if config.get(n) is not None), None)


def hints_from(config: dict[str, Any] | None, source: str) -> dict[str, Any]:
    """What a foreign config (or, failing it, the upstream-style name `source`) says about a router: any of
    `drafters`, `tree_budget`, `threshold`, `target`, `activation`, `hidden_size`, `mlp_dim`, `tap_layers`."""
    config = config or {}
    out = {"drafters": _first(config, "drafters", "pair", "whiflash_drafters"),
           "tree_budget": _first(config, "tree_budget", "ddtree_tree_budget", "budget"),
           "threshold": _first(config, "threshold", "whiflash_neural_router_threshold"),
           "target": _first(config, "target", "target_model", "base_model", "model_name_or_path"),
           "activation": _first(config, "activation", "act", "hidden_act", "activation_fn"),
           "hidden_size": _first(config, "hidden_size", "input_dim", "in_features", "d_model", "input_size"),
           "mlp_dim": _first(config, "mlp_dim", "hidden_dim", "intermediate_size", "mlp_hidden", "hidden_units"),
           "tap_layers": _first(config, "tap_layers")}
    named = _NAME_HINT.search(source)
    if named and out["drafters"] is None:
        out["drafters"] = named.group(1).lower()
        if named.group(2) and out["tree_budget"] is None:
            out["tree_budget"] = int(named.group(2))
    return {k: v for k, v in out.items() if v is not None}


def metadata_config(metadata: dict[str, str]) -> dict[str, Any]:
    """A safetensors header's metadata as config hints: JSON objects merged in, other values kept as text."""
    out: dict[str, Any] = {}
    for key, value in metadata.items():
        try:
            parsed = json.loads(value)
        except (TypeError, ValueError):
            parsed = value
        if isinstance(parsed, dict):
            out.update(parsed)
        else:
            out[key] = parsed
    return out


def router_from_state(state: dict[str, Tensor], hints: dict[str, Any], source: str, make: Callable[..., Any],
                      pair: Any = None) -> Any:
    """The router `make(...)` builds (`whiflash.router.NeuralRouter`, passed in so that this reader needs no
    import of the router module) holding the exported MLP in `state` (see the module doc); `pair` is the
    run's, used when neither the config nor the name says which pair the router was trained for."""
    layout = find_layout(state, source)
    for key, inferred in (("hidden_size", layout.hidden_size), ("mlp_dim", layout.mlp_dim)):
        if key in hints and int(hints[key]) != inferred:
            raise ValueError(f"router {source}: its config says {key} {hints[key]}, but the weights are "
                             f"{layout.describe()}")
    drafters = hints.get("drafters")
    if drafters is None:
        drafters = str(pair) if pair is not None else "df-e3"
        log.warning("router %s records no drafter pair (config or name); assuming %s", source, drafters)
    activation = str(hints.get("activation", "gelu")).lower()
    if activation not in ACTIVATIONS:
        raise ValueError(f"router {source}: activation {activation!r}; expected one of {', '.join(ACTIVATIONS)}")
    router = make(hidden_size=layout.hidden_size, mlp_dim=layout.mlp_dim, drafters=str(drafters),
                          tree_budget=hints.get("tree_budget"), target=str(hints.get("target", "")),
                          tap_layers=hints.get("tap_layers"), threshold=float(hints.get("threshold", 0.0)),
                          activation=activation)

    def weight(name: str) -> Tensor:
        w = state[name].float()
        return w.t() if layout.transposed else w

    with torch.no_grad():
        first, last = router.mlp[0], router.mlp[-1]
        first.weight.copy_(weight(layout.w1))
        last.weight.copy_(weight(layout.w2).reshape(1, layout.mlp_dim))
        first.bias.copy_(state[layout.b1].float() if layout.b1 else torch.zeros(layout.mlp_dim))
        last.bias.copy_(state[layout.b2].float().reshape(1) if layout.b2 else torch.zeros(1))
        if layout.mean is not None and layout.spread is not None:
            spread = state[layout.spread].float()
            router.set_normalization(state[layout.mean].float(), spread.sqrt() if layout.spread_is_var else spread)
    log.info("router %s read as an exported MLP: %s; activation %s, pair %s", source, layout.describe(), activation,
             router.drafters)
    return router.eval()
