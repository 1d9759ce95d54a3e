"""The latency profile, for whiflash-eval's modules: it lives in the core (`whiflash.latency`), where
whiflash-train reads it too (apps import the core, never each other)."""
from __future__ import annotations

from whiflash.latency import PROFILE_KIND, VERSION, LatencyProfile, catchup_model, slot_kind

__all__ = ["PROFILE_KIND", "VERSION", "LatencyProfile", "catchup_model", "slot_kind"]
