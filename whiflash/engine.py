"""The decoding engine a run gets by default: on CUDA the fastest one the GPU tests cover, elsewhere the eager path.

On a CUDA device a flag left unset means bfloat16 weights, CUDA graphs for every fixed-shape pass and
`torch.compile`d layer stages and drafter passes inside them (where torch.compile runs here: dynamo
supported by this Python/torch and Triton installed; otherwise layers stay uncompiled and the reason
is logged). On the CPU it means float32 and eager passes. A flag given on the command line, in a
`--config` file or in Python always wins (`--no-cuda-graphs`, `--no-compile-layers`, `--dtype
float32`). `whiflash-eval bench`, `calibrate`, `profile` and `sweep` resolve their flags here, so
`--print_config` shows what will run; `engine_options` turns the resolved flags into the target's
`EngineOptions`, and `describe` writes them into the run's manifest (`engine` in manifest.json;
`generator.engine` in a datagen dataset's manifest).
"""
from __future__ import annotations

import logging
import sys
from dataclasses import replace
from typing import Any, TypeVar

import torch

from whiflash.runtime.options import EngineOptions

__all__ = ["ENGINE_FIELDS", "EngineOptions", "compile_blocker", "default_device", "describe", "engine_defaults",
           "engine_options", "resolve_engine"]

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


def engine_options(device: str, cuda_graphs: bool, compile_layers: bool) -> EngineOptions:
    """The `EngineOptions` of a run's resolved engine flags (`resolve_engine`), over the environment's defaults
    for the kernels: CUDA graphs only on a CUDA device and compiled layers only inside them (either asked for
    elsewhere is ignored with a warning naming the flag)."""
    cuda = str(device).startswith("cuda")
    graphs = bool(cuda_graphs) and cuda
    if cuda_graphs and not graphs:
        log.warning("--cuda-graphs ignored on %s (CUDA only)", device)
    if compile_layers and not graphs:
        log.warning("--compile-layers ignored: it compiles the CUDA graphs' passes (give --cuda-graphs on CUDA)")
    return EngineOptions.from_environment(cuda_graphs=graphs, compiled_layers=bool(compile_layers) and graphs)


def describe(device: str, dtype: str, options: EngineOptions, **extra: Any) -> dict[str, Any]:
    """The `engine` record of a run manifest: device, dtype, every option, whether the attention kernel can
    run here at all (Triton installed), and `extra` (what was asked for, when it differs)."""
    from whiflash.runtime import decode_attention

    return {"device": str(device), "dtype": dtype, **options.to_dict(),
            "attention_kernel_available": decode_attention.available(), **extra}
