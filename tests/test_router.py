"""The shared neural router module: forward, export formats, strict loading and compatibility checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from whiflash.router import (
    NeuralRouter,
    export_single_file,
    load_router,
    suggested_repo_name,
)

H = 12


@pytest.fixture
def router() -> NeuralRouter:
    torch.manual_seed(0)
    r = NeuralRouter(hidden_size=H, mlp_dim=16, drafters="ddt-e3", tree_budget=32, target="Qwen/Qwen3-8B",
                     tap_layers=[1, 17, 32], threshold=0.5)
    r.set_normalization(torch.randn(H), torch.rand(H) + 0.5)
    return r.eval()


@pytest.fixture
def saved(router: NeuralRouter, tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "r"
    router.save_pretrained(folder, config=router.config())
    return folder, export_single_file(router, tmp_path / "r.safetensors")


def test_forward_shapes_dtype_and_normalisation(router: NeuralRouter) -> None:
    x = torch.randn(5, H)
    out = router(x)
    assert out.shape == (5,) and out.dtype == torch.float32
    assert router(x[0]).shape == () and torch.allclose(router(x[0]), out[0])
    half = x.half()
    assert torch.equal(router(half), router(half.float()))  # cast inside, float32 math
    # Normalisation is part of forward: (h - mean) / std feeds the MLP.
    expected = router.mlp((x - router.mean) / router.std).squeeze(-1)
    assert torch.allclose(out, expected)
    with pytest.raises(ValueError, match="hidden size 12"):
        router(torch.randn(3, H + 1))


def test_history_widens_the_input_and_travels_with_the_export(tmp_path: Path) -> None:
    """`history=2`: the input is the decision point's state and the two before it (`[N, 3H]`), normalised and saved
    with the router; a router without the field (older configs) reads the state alone; a bad value names the field."""
    torch.manual_seed(1)
    r = NeuralRouter(hidden_size=H, mlp_dim=8, history=2, context=["entropy"]).eval()
    r.set_normalization(torch.randn(3 * H + 1), torch.rand(3 * H + 1) + 0.5)
    x, ctx = torch.randn(4, 3 * H), torch.randn(4, 1)
    single = export_single_file(r, tmp_path / "h.safetensors")
    loaded = load_router(single)
    assert loaded.history == 2 and loaded.config()["history"] == 2 and torch.equal(loaded(x, ctx), r(x, ctx))
    with pytest.raises(ValueError, match=r"hidden size 12 x \(1 \+ history 2\)"):
        r(torch.randn(4, H), ctx)
    with pytest.raises(ValueError, match="mean/std must have shape \\(37,\\)"):
        r.set_normalization(torch.zeros(H + 1), torch.ones(H + 1))
    old = {k: v for k, v in r.config().items() if k != "history"}
    assert NeuralRouter(**{**old, "context": []}).history == 0
    with pytest.raises(ValueError, match="router config field 'history': expected an integer >= 0, got -1"):
        NeuralRouter(hidden_size=H, history=-1)


def test_folder_and_single_file_load_strictly_with_identical_outputs(router: NeuralRouter, saved) -> None:
    folder, single = saved
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg == router.config() and cfg["threshold"] == 0.5 and cfg["tap_layers"] == [1, 17, 32]
    assert {"mean", "std"} <= set(load_file(str(folder / "model.safetensors")))
    x = torch.randn(7, H)
    a, b = load_router(folder), load_router(single)
    assert a.config() == b.config() == router.config()
    assert not a.training and not b.training
    assert torch.equal(a(x), router(x)) and torch.equal(b(x), router(x))


def test_strict_loading_rejects_extra_or_missing_weights(saved, tmp_path: Path) -> None:
    folder, _ = saved
    state = load_file(str(folder / "model.safetensors"))
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    save_file({**state, "extra.weight": torch.zeros(1)}, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match="unexpected keys \\['extra.weight'\\]"):
        load_router(bad)
    save_file({k: v for k, v in state.items() if k != "mean"}, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match="missing keys \\['mean'\\]"):
        load_router(bad)
    cfg = json.loads((folder / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "mlp_dim": 8}))
    save_file(state, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match="do not match its config"):
        load_router(bad)


def test_missing_files_name_the_path(saved, tmp_path: Path) -> None:
    folder, single = saved
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=f"expected model.safetensors .* at {folder}/model.safetensors"):
        load_router(folder)
    (folder / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="expected config.json"):
        load_router(folder)
    with pytest.raises(FileNotFoundError, match="no such file: .*nope.safetensors"):
        load_router(tmp_path / "nope.safetensors")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="expected config.json \\+ model.safetensors .*found none"):
        load_router(tmp_path / "empty")


def test_mismatch_refusals_name_both_sides(saved) -> None:
    folder, single = saved
    with pytest.raises(ValueError, match=r"trained for pair 'ddt-e3' with tree budget 32, but this run uses 'df-e3'"):
        load_router(folder, pair="df-e3")
    with pytest.raises(ValueError, match=r"tree budget 32, but this run uses 'ddt-e3' with tree budget 128"):
        load_router(single, pair="ddt-e3", tree_budget=128)
    with pytest.raises(ValueError, match=r"hidden size 12 .*'Qwen/Qwen3-8B'.*hidden size 4096"):
        load_router(folder, hidden_size=4096)
    assert load_router(folder, hidden_size=H, pair="ddt-e3", tree_budget=32).hidden_size == H


def test_hub_repo_id_downloads_safetensors_only(saved, monkeypatch) -> None:
    folder, _ = saved
    calls = []

    def fake_download(repo_id: str, filename: str, revision: str | None = None, **kw) -> str:
        calls.append((repo_id, filename, revision))
        return str(folder / filename)

    monkeypatch.setattr("whiflash.router.hf_hub_download", fake_download)
    r = load_router("WhiFlash/Qwen3-8B-NeuralRouter-ddt-e3-b32", revision="abc123")
    assert r.tree_budget == 32
    assert calls == [("WhiFlash/Qwen3-8B-NeuralRouter-ddt-e3-b32", "config.json", "abc123"),
                     ("WhiFlash/Qwen3-8B-NeuralRouter-ddt-e3-b32", "model.safetensors", "abc123")]


def test_suggested_repo_name() -> None:
    assert suggested_repo_name("Qwen/Qwen3-8B", "ddt-e3", 128) == "Qwen3-8B-NeuralRouter-ddt-e3-b128"
    assert suggested_repo_name("Qwen/Qwen3-4B", "df-e3", 128) == "Qwen3-4B-NeuralRouter-df-e3"
    assert suggested_repo_name("meta-llama/Llama-3.1-8B-Instruct", "df-ddt", 32) == \
        "Llama-3.1-8B-Instruct-NeuralRouter-df-ddt-b32"
    assert suggested_repo_name("local-target", "ddt-e3", None) == "local-target-NeuralRouter-ddt-e3"


def test_constructor_validates_pair() -> None:
    with pytest.raises(ValueError, match="router config field 'drafters': expected one of df-e3, ddt-e3, df-ddt, got 'e3-df'"):
        NeuralRouter(hidden_size=4, drafters="e3-df")


def test_pair_is_the_python_name_of_the_published_drafters_key(router, saved) -> None:
    from whiflash.pairs import PAIRS

    assert router.pair is PAIRS["ddt-e3"] and router.drafters == "ddt-e3" and router.config()["drafters"] == "ddt-e3"
    folder, _ = saved
    assert json.loads((folder / "config.json").read_text())["drafters"] == "ddt-e3"
    assert load_router(folder, pair=PAIRS["ddt-e3"], tree_budget=32).pair is PAIRS["ddt-e3"]
    router.drafters = "df-e3"  # the config key stays writable and is validated like the pair
    assert router.pair is PAIRS["df-e3"]
    with pytest.raises(ValueError, match="router config field 'drafters': expected one of"):
        router.drafters = "e3"


def _layouts(router: NeuralRouter) -> dict[str, dict[str, torch.Tensor]]:
    """The router's tensors under the key names and orientations other exporters use."""
    sd = {k: v.clone() for k, v in router.state_dict().items()}
    w1, b1, w2, b2, mean, std = (sd[k] for k in ("mlp.0.weight", "mlp.0.bias", "mlp.3.weight", "mlp.3.bias", "mean",
                                                 "std"))
    return {
        "ours": sd,  # this toolkit's keys, exported without the config metadata
        "fc": {"fc1.weight": w1, "fc1.bias": b1, "fc2.weight": w2, "fc2.bias": b2, "mean": mean, "std": std},
        "sequential": {"net.0.weight": w1, "net.0.bias": b1, "net.2.weight": w2, "net.2.bias": b2,
                       "input_mean": mean, "input_std": std},
        "input-first": {"W1": w1.t().contiguous(), "b1": b1, "W2": w2.t().contiguous(), "b2": b2, "mu": mean,
                        "var": std ** 2},
        "sklearn": {"model.layers.0.weight": w1, "model.layers.0.bias": b1, "model.layers.1.weight": w2,
                    "model.layers.1.bias": b2, "scaler.mean_": mean, "scaler.scale_": std},
    }


@pytest.mark.parametrize("layout", ["ours", "fc", "sequential", "input-first", "sklearn"])
def test_any_exported_mlp_loads_with_its_dimensions_inferred(router: NeuralRouter, tmp_path: Path,
                                                             layout: str) -> None:
    state = _layouts(router)[layout]
    file = tmp_path / f"{layout}.safetensors"
    save_file(state, str(file))  # no config anywhere: the pair comes from the run
    loaded = load_router(file, pair="ddt-e3", hidden_size=H)
    x = torch.randn(6, H)
    assert (loaded.hidden_size, loaded.mlp_dim, loaded.drafters) == (H, 16, "ddt-e3")
    torch.testing.assert_close(loaded(x), router(x), rtol=1e-5, atol=1e-5)
    folder = tmp_path / f"{layout}-repo"  # a folder of weights under another name and a config of other keys
    folder.mkdir()
    save_file(state, str(folder / "router.safetensors"))
    (folder / "config.json").write_text(json.dumps({"input_dim": H, "hidden_dim": 16, "pair": "df-e3",
                                                    "threshold": 1.5, "activation": "gelu"}))
    from_folder = load_router(folder)
    assert (from_folder.drafters, from_folder.threshold) == ("df-e3", 1.5)
    torch.testing.assert_close(from_folder(x), router(x), rtol=1e-5, atol=1e-5)


def test_exported_mlp_without_statistics_and_its_pair_from_the_name(router: NeuralRouter, tmp_path: Path) -> None:
    state = {k: v for k, v in _layouts(router)["fc"].items() if k not in ("mean", "std")}
    folder = tmp_path / "Qwen3-8B-NeuralRouter-ddt-e3-b128"
    folder.mkdir()
    save_file(state, str(folder / "model.safetensors"))
    loaded = load_router(folder)  # no config.json: pair and budget from the upstream-style name
    assert (loaded.drafters, loaded.tree_budget) == ("ddt-e3", 128)
    x = torch.randn(3, H)
    torch.testing.assert_close(loaded(x), router.mlp(x).squeeze(-1), rtol=1e-5, atol=1e-5)  # identity normalisation
    with pytest.raises(ValueError, match="trained for pair 'ddt-e3' with tree budget 128, but this run uses 'df-e3'"):
        load_router(folder, pair="df-e3")


def test_unreadable_exports_list_the_tensors_found(router: NeuralRouter, tmp_path: Path) -> None:
    fc = _layouts(router)["fc"]
    cases = {
        "three-layers": ({**fc, "fc3.weight": torch.zeros(1, 16)}, r"3 two-dimensional float tensors, expected 2"),
        "extra": ({**fc, "ln.weight": torch.ones(7)}, r"tensors \['ln.weight'\] have no place"),
        "wide-output": ({**fc, "fc2.weight": torch.zeros(2, 16)}, r"no weight with a side of 1"),
        "mean-only": ({k: v for k, v in fc.items() if k != "std"}, r"an input mean without a std"),
    }
    for name, (state, why) in cases.items():
        file = tmp_path / f"{name}.safetensors"
        save_file(state, str(file))
        with pytest.raises(ValueError, match=why) as info:
            load_router(file, pair="df-e3")
        assert f"router {file}" in str(info.value) and "fc1.weight [16, 12]" in str(info.value), str(info.value)
    save_file(fc, str(tmp_path / "fc.safetensors"))
    (tmp_path / "cfg").mkdir()
    save_file(fc, str(tmp_path / "cfg" / "model.safetensors"))
    (tmp_path / "cfg" / "config.json").write_text(json.dumps({"hidden_size": H, "mlp_dim": 32}))
    with pytest.raises(ValueError, match="its config says mlp_dim 32, but the weights are fc1.weight \\[16x12\\]"):
        load_router(tmp_path / "cfg")


def test_hub_repo_of_weights_only(router: NeuralRouter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from unittest import mock

    from huggingface_hub.errors import RemoteEntryNotFoundError

    save_file(_layouts(router)["fc"], str(tmp_path / "router.safetensors"))

    def fake_download(repo_id: str, filename: str, revision: str | None = None, **kw) -> str:
        if filename != "router.safetensors":  # what the Hub answers for a file the repo does not have
            raise RemoteEntryNotFoundError(f"{filename} not in {repo_id}", response=mock.MagicMock(status_code=404))
        return str(tmp_path / filename)

    monkeypatch.setattr("whiflash.router.hf_hub_download", fake_download)
    monkeypatch.setattr("huggingface_hub.HfApi.list_repo_files", lambda self, repo, revision=None: ["README.md",
                                                                                                 "router.safetensors"])
    loaded = load_router("WhiFlash/Qwen3-8B-NeuralRouter-df-e3")
    assert loaded.drafters == "df-e3" and loaded.mlp_dim == 16
