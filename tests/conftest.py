"""Shared fixtures: tiny upstream-format checkpoints written once per test session."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import whiflash
import whiflash.decoding.verify
from whiflash.testing import make_dflash, make_eagle3, make_target

# every tree the suite verifies is checked for prefix-closure (one extra host read per round)
whiflash.decoding.verify.CHECK_TREES = True

EAGLE_TAPS = [0, 1, 2]
DFLASH_TAPS = [0, 1, 3]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class World:
    """A target folder plus its drafter folders, loaded on demand."""

    def __init__(self, root: Path, family: str, crafted: bool, mix: float, seed: int) -> None:
        self.target_dir = make_target(root / "target", family, crafted=crafted, mix=mix, seed=seed)
        self.target_cfg = json.loads((self.target_dir / "config.json").read_text())
        self.eagle_dir = make_eagle3(root / "eagle3", self.target_cfg, EAGLE_TAPS, draft_vocab=24, crafted=crafted)
        self.dflash_dir = make_dflash(root / "dflash", self.target_cfg, DFLASH_TAPS, block_size=8, crafted=crafted)

    def load(self, device: str = "cpu", dtype: torch.dtype = torch.float32):
        target = whiflash.load_target(self.target_dir, device=device, dtype=dtype)
        drafters = {
            "eagle3": whiflash.load_drafter("eagle3", self.eagle_dir, target, num_steps=4),
            "dflash": whiflash.load_drafter("dflash", self.dflash_dir, target),
            "ddtree": whiflash.load_drafter("ddtree", self.dflash_dir, target, tree_budget=12),
        }
        return target, drafters


WORLDS = {
    "qwen3-random": ("qwen3", False, 0.0, 0),
    "llama-random": ("llama", False, 0.0, 1),
    "qwen3-crafted": ("qwen3", True, 0.0, 2),
    "llama-crafted": ("llama", True, 0.0, 3),
    "qwen3-mixed": ("qwen3", True, 0.1, 4),
    "llama-mixed": ("llama", True, 0.1, 5),
}


@pytest.fixture(scope="session")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, World]:
    root = tmp_path_factory.mktemp("worlds")
    return {name: World(root / name, *spec) for name, spec in WORLDS.items()}


@pytest.fixture(scope="session")
def micro(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``micro`` testbed, built once per session (shared by the testbed and eval tests)."""
    from whiflash.testbed.build import build
    from whiflash.testbed.presets import get_preset

    out = tmp_path_factory.mktemp("testbed") / "micro"
    build(out, get_preset("micro"))
    return out
