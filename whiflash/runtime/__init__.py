"""The model runtime: config parsing, weights, and our own static-KV forward."""
from whiflash.runtime.config import ModelConfig
from whiflash.runtime.model import Target, TargetOutput, load_target

__all__ = ["ModelConfig", "Target", "TargetOutput", "load_target"]
