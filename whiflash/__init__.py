"""WhiFlash: token-level routing between speculative-decoding drafters (EAGLE-3, DFlash, DDTree).

Public API:
    load_target(name_or_path, device="cpu", dtype=torch.float32) -> Target
    load_drafter(kind, name_or_path, target, **options) -> Drafter   # "eagle3" | "dflash" | "ddtree"
    generate(target, drafter, input_ids, max_new_tokens, temperature=0.0, stop_token_ids=None, seed=None)
        -> (new_token_ids, DecodeStats)
    RoutedDrafter(pair, router, eagle3=..., dflash=..., tree_budget=None, lazy_catchup=True)
        # a Drafter: pass it to generate() for WhiFlash routed decoding
    OracleDrafter(pair, eagle3=..., dflash=...)   # the per-round oracle (analysis upper bound)
    load_router(name_or_path) -> NeuralRouter   # Hub repo id, local folder or .safetensors file
    EngineOptions(...)   # kernels, compiled layers, CUDA graphs, tree checks: target.set_engine(options)
"""
from pathlib import Path

from whiflash.decoding import DecodeStats, RoundRecord, generate, summarize
from whiflash.decoding.routed import OracleDrafter, RoutedDrafter
from whiflash.drafters import load_drafter
from whiflash.router import NeuralRouter, load_router
from whiflash.pairs import PAIRS, Pair
from whiflash.routers import AlternatingRouter, EntropyRouter, FixedRouter, NeuralPolicy
from whiflash.runtime import load_target
from whiflash.runtime.options import EngineOptions

__all__ = [
    "PAIRS", "AlternatingRouter", "DecodeStats", "EngineOptions", "EntropyRouter", "FixedRouter", "NeuralPolicy", "NeuralRouter",
    "OracleDrafter", "Pair", "RoundRecord", "RoutedDrafter", "generate", "load_drafter", "load_router", "load_target",
    "summarize",
]
__version__ = "0.1.0"

# The CLIs live beside this package (datagen/ train/ eval/) and an install maps them into it (pyproject's
# package-dir). From a checkout that is not installed (PYTHONPATH=checkout, as on a GPU machine without setuptools
# or an index), the package path reaches them the same way, so `python -m whiflash.eval` runs there too.
_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "eval" / "__init__.py").is_file():
    __path__.append(str(_checkout))
