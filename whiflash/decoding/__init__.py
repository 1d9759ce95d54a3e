"""Verification, the generate loop and decoding statistics."""
from whiflash.decoding.loop import generate
from whiflash.decoding.stats import DecodeStats, RoundRecord, summarize
from whiflash.decoding.verify import accept, target_tokens

__all__ = ["DecodeStats", "RoundRecord", "accept", "generate", "summarize", "target_tokens"]
