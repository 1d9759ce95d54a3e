"""Engine switches live in `EngineOptions` (owned by the target), environment variables in one module."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import whiflash
from whiflash import settings
from whiflash.runtime.options import EngineOptions

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [p for folder in ("whiflash", "datagen", "train", "eval") for p in (ROOT / folder).rglob("*.py")]
ENGINE_PACKAGES = ("whiflash/runtime", "whiflash/drafters", "whiflash/decoding")


def test_whiflash_variables_are_read_only_in_the_settings_module() -> None:
    reads = re.compile(r"(os\.environ|getenv)[^\n]*WHIFLASH_|WHIFLASH_[A-Z_]*\"?\s*[,)]?[^\n]*os\.environ")
    offenders = []
    for path in SOURCES:
        rel = path.relative_to(ROOT).as_posix()
        if rel == "whiflash/settings.py":
            continue
        text = path.read_text()
        if reads.search(text) or re.search(r"os\.environ(\.get)?\(\s*[\"']WHIFLASH_|getenv\(\s*[\"']WHIFLASH_", text):
            offenders.append(rel)
    assert not offenders, f"WHIFLASH_* read outside whiflash/settings.py: {offenders}"
    assert len(SOURCES) > 50  # the walk found the package


def test_no_engine_switch_is_a_module_global() -> None:
    """No module of the engine rebinds a module global (`global x` in a function) or keeps a bool switch."""
    offenders = []
    for path in SOURCES:
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith(ENGINE_PACKAGES):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                offenders.append(f"{rel}:{node.lineno}: global {', '.join(node.names)}")
        for node in tree.body:
            target = node.target if isinstance(node, ast.AnnAssign) else None
            targets = node.targets if isinstance(node, ast.Assign) else [target] if target is not None else []
            value = getattr(node, "value", None)
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            is_switch = isinstance(value, ast.Constant) and isinstance(value.value, bool)
            # a WHIFLASH_ variable read at import (Triton's own TRITON_INTERPRET is Triton's business)
            reads_env = value is not None and "environ" in ast.unparse(value) and "WHIFLASH_" in ast.unparse(value)
            if names and (is_switch or reads_env):
                offenders.append(f"{rel}:{node.lineno}: {', '.join(names)} = {ast.unparse(value)}")
    assert not offenders, offenders


def test_options_default_from_the_environment_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in settings.ENGINE_VARIABLES.values():
        monkeypatch.delenv(name, raising=False)
    assert EngineOptions.from_environment() == EngineOptions()
    monkeypatch.setenv("WHIFLASH_GEMV", "0")
    monkeypatch.setenv("WHIFLASH_TREE_KERNEL", "off")
    monkeypatch.setenv("WHIFLASH_CHECK_TREES", "1")
    options = EngineOptions.from_environment(tree_kernel=True)
    assert (options.gemv, options.tree_kernel, options.check_trees) == (False, True, True)
    monkeypatch.setenv("WHIFLASH_GEMV", "maybe")
    with pytest.raises(ValueError, match="WHIFLASH_GEMV='maybe': expected one of 1/0"):
        EngineOptions.from_environment()
    with pytest.raises(TypeError, match="no field graphs"):
        EngineOptions().with_(graphs=True)


def test_drafters_take_the_targets_options_when_they_attach(worlds) -> None:
    target, drafters = worlds["qwen3-mixed"].load()
    options = target.engine.with_(attention_kernel=False, gemv=False, tree_kernel=False)
    target.set_engine(options)
    layer = target.model.layers[0]
    assert not layer.kernels.attention and layer.kernels.gemv is None and layer.mlp.kernels.gemv is None
    for drafter in drafters.values():
        whiflash.generate(target, drafter, [1, 5, 7], 4)
        assert drafter.engine is options and drafter.kernels.gemv is None, drafter.kind
        assert all(m.kernels.gemv is None for m in drafter.modules() if hasattr(m, "kernels") and m is not drafter)
    assert options.to_dict()["tree_kernel"] is False and set(options.to_dict()) >= {"cuda_graphs", "compiled_layers"}
