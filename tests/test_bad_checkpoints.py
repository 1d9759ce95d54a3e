"""Broken checkpoints and options that do not apply: every loader error names the file (or option) and what
was expected (whiflash.load_target, whiflash.load_drafter, whiflash.load_router)."""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

import whiflash
from whiflash.router import NeuralRouter
from whiflash.testing import make_dflash, make_eagle3, make_target


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, object]:
    """A tiny target folder, its config and the loaded target."""
    folder = make_target(tmp_path_factory.mktemp("target") / "target")
    return folder, json.loads((folder / "config.json").read_text()), whiflash.load_target(folder)


def _router(folder: Path) -> Path:
    NeuralRouter(hidden_size=32, mlp_dim=8, drafters="df-e3", target="Qwen/Qwen3-8B").save_pretrained(folder)
    return folder


def _truncate(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


def _garble(file: Path) -> None:
    file.write_bytes(b"\xff" * 8 + b"this is not a safetensors header" + file.read_bytes()[40:])


def _not_json(file: Path) -> None:
    file.write_text("{'hidden_size': 32,")


def _drop_hidden_size(file: Path) -> None:
    cfg = json.loads(file.read_text())
    del cfg["hidden_size"]
    file.write_text(json.dumps(cfg))


def _loaders(tmp_path: Path, world: tuple) -> dict[str, tuple[Path, Callable[[Path], object]]]:
    """name -> (a fresh valid checkpoint folder, the call that loads it)."""
    folder, cfg, target = world
    fresh_target = tmp_path / "target"
    fresh_target.mkdir()
    for f in folder.iterdir():
        (fresh_target / f.name).write_bytes(f.read_bytes())
    return {
        "target": (fresh_target, lambda d: whiflash.load_target(d)),
        "dflash": (make_dflash(tmp_path / "dflash", cfg, [0, 1, 2]),
                   lambda d: whiflash.load_drafter("dflash", d, target)),
        "eagle3": (make_eagle3(tmp_path / "eagle3", cfg, [0, 1, 2], 24),
                   lambda d: whiflash.load_drafter("eagle3", d, target)),
        "router": (_router(tmp_path / "router"), lambda d: whiflash.load_router(d)),
    }


@pytest.mark.parametrize("kind", ["target", "dflash", "eagle3", "router"])
@pytest.mark.parametrize("file, corrupt, says", [
    ("model.safetensors", _truncate, "not a readable safetensors file"),
    ("model.safetensors", _garble, "not a readable safetensors file"),
    ("config.json", _not_json, "not valid JSON .*; expected"),
    ("config.json", _drop_hidden_size, "hidden_size"),
])
def test_broken_checkpoint_names_the_file(world, tmp_path: Path, kind: str, file: str,
                                          corrupt: Callable[[Path], None], says: str) -> None:
    folder, load = _loaders(tmp_path, world)[kind]
    load(folder)  # the intact checkpoint loads
    corrupt(folder / file)
    with pytest.raises((ValueError, TypeError)) as info:
        load(folder)
    assert isinstance(info.value, ValueError), repr(info.value)  # never a raw TypeError/SafetensorError
    assert str(folder / file) in str(info.value), str(info.value)
    assert re.search(says, str(info.value)), str(info.value)


@pytest.mark.parametrize("kind, option, value", [
    ("dflash", "tree_budget", 5), ("eagle3", "block_size", 8), ("eagle3", "tree_budget", 5),
    ("dflash", "num_steps", 3), ("ddtree", "num_steps", 3), ("ddtree", "bogus", 1),
])
def test_options_that_do_not_apply_are_refused(world, tmp_path: Path, kind: str, option: str, value: int) -> None:
    _, cfg, target = world
    folder = (make_eagle3(tmp_path / "e", cfg, [0, 1, 2], 24) if kind == "eagle3"
              else make_dflash(tmp_path / "d", cfg, [0, 1, 2]))
    with pytest.raises(ValueError, match=rf"option\(s\) \['{option}'\] do not apply to drafter kind '{kind}'"):
        whiflash.load_drafter(kind, folder, target, **{option: value})
