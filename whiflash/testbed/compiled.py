"""The target's decoder layers under ``torch.compile`` while the testbed pre-trains it (``compile_layers``).

At the testbed's widths a training step of the target is bound by its many small element-wise kernels
(RMSNorms, q/k norms, RoPE, SwiGLU, residuals, each with autocast's casts), not by its matrix products;
Inductor fuses them. Each decoder layer is compiled in place (``nn.Module.compile``): the layers run the
same code, and with ``use_cache=False`` nothing layer-specific is guarded, so one graph serves all of
them and compile time does not grow with depth. A layer whose compilation fails falls back to eager with
a warning: the stage then runs slower, never differently in what it trains.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

__all__ = ["compile_layers", "eager_layers", "compiled_or_eager"]

log = logging.getLogger(__name__)


def _layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    inner = getattr(model, "model", model)  # ForCausalLM -> its base model
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__}: expected a transformers causal LM with .model.layers")
    return list(layers)


def compile_layers(model: torch.nn.Module, backend: str = "inductor") -> None:
    """Compile every decoder layer of ``model`` in place (its state dict and checkpoints are unchanged)."""
    for layer in _layers(model):
        layer.compile(backend=backend)


def eager_layers(model: torch.nn.Module) -> None:
    """Undo ``compile_layers``: every layer runs eagerly again."""
    for layer in _layers(model):
        layer._compiled_call_impl = None


def compiled_or_eager(model: torch.nn.Module, trial: Callable[[], object], what: str,
                      backend: str = "inductor") -> bool:
    """Compile ``model``'s layers and run ``trial`` (a step shaped like the real ones, so the compilation
    happens here); if that raises, go back to eager layers with a warning. Returns whether the layers
    stay compiled."""
    compile_layers(model, backend)
    try:
        trial()
    except Exception as err:  # any compiler failure: the stage still runs, eagerly
        eager_layers(model)
        log.warning("%s: compiled decoder layers failed (%s: %s); running them eagerly", what,
                    type(err).__name__, str(err).splitlines()[0] if str(err) else "")
        return False
    return True
