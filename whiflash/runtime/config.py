"""Architecture config of a target model, read from a Hugging Face `config.json`.

Only the fields our forward needs are kept; both the transformers-4 (`rope_theta`,
`rope_scaling`) and transformers-5 (`rope_parameters`) spellings are accepted.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whiflash.runtime.weights import read_json

SUPPORTED_MODEL_TYPES = ("qwen3", "llama")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Qwen3- or Llama-family decoder."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, cfg: dict[str, Any], source: str = "config.json") -> "ModelConfig":
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"{source}: model_type {model_type!r} is not supported; expected one of {SUPPORTED_MODEL_TYPES}"
            )
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if key not in cfg:
                raise ValueError(f"{source}: required field {key!r} is missing (expected an integer, as in the "
                                 "config.json of a Hugging Face Qwen3/Llama model)")
        rope_theta, rope_scaling = rope_from_config(cfg)
        heads = cfg["num_attention_heads"]
        return cls(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            extra=cfg,
        )

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        """Read and check ``path``; errors name it and what was expected."""
        return cls.from_dict(read_json(path, "the config.json of a Hugging Face Qwen3/Llama model"), source=str(path))


def rope_from_config(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """Return (theta, scaling) from either `rope_parameters` (transformers 5) or `rope_theta`/`rope_scaling`."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and params:
        theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        scaling = dict(params)
    else:
        theta = float(cfg.get("rope_theta", 10000.0))
        scaling = dict(cfg["rope_scaling"]) if cfg.get("rope_scaling") else None
    if scaling is not None:
        scaling.pop("rope_theta", None)
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind == "default":
            scaling = None
        elif kind not in ("llama3", "linear"):
            raise ValueError(f"rope scaling type {kind!r} is not supported; expected 'default', 'linear' or 'llama3'")
    return theta, scaling
