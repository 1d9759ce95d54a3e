"""The testbed: a small self-consistent world built from text every Python install has.

A corpus (standard-library code, generated arithmetic word problems, standard-library prose),
a byte-level BPE tokenizer with a reserved DFlash mask token, a Qwen3-architecture target and
an EAGLE-3 and a DFlash drafter trained for it, all saved in the real checkpoints' formats.

    python -m whiflash.testbed build --preset tiny --out DIR     # CPU, a few minutes
    python -m whiflash.testbed build --preset small --out DIR    # one GPU

From Python: ``ensure_testbed("tiny")`` builds (or reuses) the default folder and returns it;
``eval_prompts(dir, "math", 20)`` gives held-out prompts per category.
"""

from __future__ import annotations

from pathlib import Path

from .build import STAGES, build, default_dir
from .presets import CATEGORIES, PRESETS, TestbedConfig, get_preset
from .prompts import Prompt, eval_prompts, held_out_prompts

__all__ = [
    "CATEGORIES", "PRESETS", "STAGES", "Prompt", "TestbedConfig", "build", "default_dir", "ensure_testbed",
    "eval_prompts", "get_preset", "held_out_prompts",
]


def ensure_testbed(preset: str = "tiny", out: str | Path | None = None) -> Path:
    """Build the preset into ``out`` (default ``default_dir(preset)``) unless already built; return the folder.

    The folder then holds ``target/``, ``eagle3/`` and ``dflash/`` for ``whiflash.load_target`` /
    ``whiflash.load_drafter``.
    """
    root = Path(out) if out is not None else default_dir(preset)
    build(root, get_preset(preset))
    return root
