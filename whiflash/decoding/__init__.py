"""Verification, the generate loop and decoding statistics."""
from whiflash.decoding.loop import generate, prompt_room
from whiflash.decoding.stats import DecodeStats, RoundRecord, summarize
from whiflash.decoding.verify import accept, target_tokens

__all__ = ["DecodeStats", "RoundRecord", "accept", "generate", "prompt_room", "summarize", "target_tokens"]
