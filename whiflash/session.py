"""One session: checkpoint paths (or a testbed) -> target, tokenizer, chat encoding, stop ids, engine options.

`whiflash-datagen` and `whiflash-eval` (bench, calibrate, profile) set their models up through this
module, so both resolve paths, load the tokenizer and pick the stop ids the same way:

* `model_paths`: each checkpoint as given, else the testbed's folder of that name (`target`,
  `eagle3`, `dflash`);
* `load_tokenizer`: the target folder's tokenizer, or None (then only `input_ids` prompts work);
* `stop_ids`: the tokenizer's EOS id and every EOS id of the target's `generation_config.json`;
* `Session.open`: the target loaded on a device and dtype, running under the given `EngineOptions`
  (its drafters take them when they attach), with its tokenizer and stop ids.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from whiflash.prompts import encode_chat
from whiflash.runtime import load_target
from whiflash.runtime.model import Target
from whiflash.runtime.options import EngineOptions

__all__ = ["MODEL_KINDS", "Session", "load_tokenizer", "model_paths", "stop_ids"]

log = logging.getLogger(__name__)

MODEL_KINDS = ("target", "eagle3", "dflash")
"""The checkpoints a session knows, each also the name of its folder in a built testbed."""


def model_paths(testbed: str | Path | None = None, **given: str | None) -> dict[str, str | None]:
    """Every checkpoint of `MODEL_KINDS`: as given (a Hub id or a folder), else the testbed's folder of that
    name, else None. An unknown keyword is refused, naming the known ones."""
    unknown = sorted(set(given) - set(MODEL_KINDS))
    if unknown:
        raise TypeError(f"model_paths: unknown checkpoint {', '.join(unknown)}; expected {', '.join(MODEL_KINDS)}")
    return {k: given.get(k) or (str(Path(testbed) / k) if testbed else None) for k in MODEL_KINDS}


def load_tokenizer(path: str | None) -> Any:
    """The target's tokenizer, or None (then only `input_ids` prompts can be used; the reason is logged)."""
    if path is None:
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    except Exception as err:  # a target folder without tokenizer files
        log.warning("no tokenizer for %s (%s: %s); only input_ids prompts can be used", path, type(err).__name__, err)
        return None


def stop_ids(tokenizer: Any, path: str | None) -> list[int]:
    """End-of-sequence ids: the tokenizer's and those of the target's generation config (chat models list
    their end-of-turn token there)."""
    ids: set[int] = set()
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if path is not None:
        try:
            from transformers import GenerationConfig

            eos = GenerationConfig.from_pretrained(path).eos_token_id
            ids.update([eos] if isinstance(eos, int) else list(eos or []))
        except Exception:  # no generation_config.json: the tokenizer's eos is enough
            pass
    return sorted(ids)


@dataclass
class Session:
    """A loaded target with what every tool needs beside it (build one with `Session.open`)."""

    paths: dict[str, str | None]
    target: Target
    tokenizer: Any
    stops: list[int] = field(default_factory=list)

    @property
    def engine(self) -> EngineOptions:
        """The options the target (and every drafter that attaches to it) runs under."""
        return self.target.engine

    @classmethod
    def open(cls, paths: dict[str, str | None], device: str, dtype: str, engine: EngineOptions | None = None) -> Session:
        """Load `paths["target"]` on `device` in `dtype` (a torch dtype name) under `engine` (default: the
        environment's `EngineOptions`), with its tokenizer and stop ids."""
        if paths.get("target") is None:
            raise ValueError("no target checkpoint: give one (a Hub id or a folder) or a testbed")
        target = load_target(paths["target"], device=device, dtype=getattr(torch, dtype))
        if engine is not None:
            target.set_engine(engine)
        tokenizer = load_tokenizer(paths["target"])
        return cls(dict(paths), target, tokenizer, stop_ids(tokenizer, paths["target"]))

    def encode(self, turns: Sequence[str], replies: Sequence[str] = (), *, enable_thinking: bool = False,
               system: str | None = None) -> list[int]:
        """Token ids of user `turns` answered by `replies` in the target's chat template (`encode_chat`)."""
        if self.tokenizer is None:
            raise ValueError(f"the target {self.paths.get('target')} has no tokenizer files: only input_ids prompts work")
        return encode_chat(self.tokenizer, turns, replies, enable_thinking=enable_thinking, system=system)
