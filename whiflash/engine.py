"""The decoding engine a run gets by default: on CUDA the fastest one the GPU tests cover, elsewhere the eager path.

On a CUDA device a flag left unset means bfloat16 weights, CUDA graphs for every fixed-shape pass and
`torch.compile`d layer stages and drafter passes inside them (where torch.compile runs here: dynamo
supported by this Python/torch and Triton installed; otherwise layers stay uncompiled and the reason
is logged). On the CPU it means float32 and eager passes. A flag given on the command line, in a
`--config` file or in Python always wins (`--no-cuda-graphs`, `--no-compile-layers`, `--dtype
float32`). `whiflash-eval bench`, `calibrate`, `profile` and `sweep` resolve their flags here, so
`--print_config` shows what will run, and the run's manifest records what did (`engine` in
manifest.json); `whiflash-datagen` resolves its `dtype` and `compile_layers` the same way and records
them in the dataset manifest's `generator.engine`.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import replace
from typing import Any, TypeVar

import torch

__all__ = ["ENGINE_FIELDS", "compile_blocker", "default_device", "engine_defaults", "resolve_engine"]

log = logging.getLogger(__name__)

ENGINE_FIELDS = ("device", "dtype", "cuda_graphs", "compile_layers")
"""The config fields whose unset value (None) is resolved by `engine_defaults`."""

C = TypeVar("C")


def default_device() -> str:
    """`cuda` when a CUDA device is available, else `cpu`."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def compile_blocker() -> str | None:
    """Why `torch.compile`d layers cannot run on this machine's CUDA device, or None when they can."""
    import torch._dynamo

    from whiflash.runtime import decode_attention

    if not torch._dynamo.is_dynamo_supported():
        return f"torch.compile does not run on Python {sys.version.split()[0]} with torch {torch.__version__}"
    if decode_attention.triton is None:
        return "torch.compile's GPU code needs Triton, which is not installed (pip install -e \".[gpu]\")"
    return None


def engine_defaults(device: str | None = None, dtype: str | None = None, cuda_graphs: bool | None = None,
                    compile_layers: bool | None = None) -> dict[str, Any]:
    """Every engine field with its unset (None) values resolved for `device` (itself resolved first)."""
    device = device or default_device()
    cuda = str(device).startswith("cuda")
    graphs = cuda if cuda_graphs is None else cuda_graphs
    if compile_layers is None:
        blocker = compile_blocker() if cuda and graphs else None
        if blocker:
            log.info("layers not compiled by default: %s", blocker)
        compile_layers = bool(cuda and graphs and blocker is None)
    return {"device": device, "dtype": dtype or ("bfloat16" if cuda else "float32"), "cuda_graphs": graphs,
            "compile_layers": compile_layers}


def resolve_engine(cfg: C) -> C:
    """`cfg` (a dataclass with the `ENGINE_FIELDS`) with its unset engine fields resolved."""
    values = engine_defaults(*(getattr(cfg, f) for f in ENGINE_FIELDS))
    return replace(cfg, **values)  # type: ignore[type-var]
