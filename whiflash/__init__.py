"""WhiFlash: token-level routing between speculative-decoding drafters (EAGLE-3, DFlash, DDTree).

Public API:
    load_target(name_or_path, device="cpu", dtype=torch.float32) -> Target
    load_drafter(kind, name_or_path, target, **options) -> Drafter   # "eagle3" | "dflash" | "ddtree"
    generate(target, drafter, input_ids, max_new_tokens, temperature=0.0, stop_token_ids=None, seed=None)
        -> (new_token_ids, DecodeStats)
"""
from whiflash.decoding import DecodeStats, generate, summarize
from whiflash.drafters import load_drafter
from whiflash.runtime import load_target

__all__ = ["DecodeStats", "generate", "load_drafter", "load_target", "summarize"]
__version__ = "0.1.0"
