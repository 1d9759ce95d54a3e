"""Paths made from user text or read from files stay inside their folder (whiflash/containment.py): run names,
a dataset manifest's shard names, a sharded checkpoint's index; a shard listed twice is refused."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import whiflash
from whiflash.testing import make_target
from whiflash.train.synthetic import write_synthetic_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("contain") / "ds"
    write_synthetic_dataset(out, num_prompts=6, rounds_per_prompt=4, hidden_size=8, progress=False)
    return out


def _ids_file(folder: Path) -> Path:
    path = folder / "ids.jsonl"
    path.write_text("".join(json.dumps({"id": i, "input_ids": [3 + i, 4, 5]}) + "\n" for i in range(2)))
    return path


def test_bench_and_train_run_names_that_climb_out_are_refused(worlds, dataset: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from whiflash.eval.cli import main
    from whiflash.train.cli import run

    world = worlds["qwen3-mixed"]
    bench = ["bench", "--out", str(tmp_path / "runs" / "eval"), "--model-name-or-path", str(world.target_dir),
             "--draft-name-or-path", str(world.dflash_dir), "--methods", "dflash", "--dataset", str(_ids_file(tmp_path)),
             "--max-new-tokens", "4", "--warmup-tokens", "1", "--bootstrap", "10", "--dtype", "float32",
             "--device", "cpu", "--no-plots"]
    with pytest.raises(ValueError, match=r"--name 'a/../../x': it holds a path separator; expected a plain name"):
        main([*bench, "--name", "a/../../x"])
    monkeypatch.setattr("sys.argv", ["whiflash-train"])
    with pytest.raises(ValueError, match=r"--run_name 'a/../../x': it holds a path separator"):
        run(["fit", "--data.path", str(dataset), "--trainer.default_root_dir", str(tmp_path / "runs" / "train"),
             "--run_name", "a/../../x", "--trainer.max_epochs", "1", "--data.cache_dir", str(tmp_path / "cache"),
             "--trainer.enable_progress_bar", "false"])
    assert not (tmp_path / "x").exists() and not (tmp_path / "runs" / "x").exists()  # nothing written out there
    assert not (tmp_path / "runs").exists()  # nor an empty run folder inside


@pytest.mark.parametrize("shard, message", [
    ("../outside/shard-00000.parquet", r"shards\[0\].file '../outside/shard-00000.parquet': points outside"),
    ("ABSOLUTE", r"shards\[0\].file '/.*/outside/shard-00000.parquet': points outside"),
    ("DUPLICATE", r"field 'shards': 'shard-00000.parquet' is listed twice \(entries 0 and 1\)"),
])
def test_manifest_shards_outside_the_dataset_or_listed_twice_are_refused(dataset: Path, tmp_path: Path, shard: str,
                                                                         message: str) -> None:
    from whiflash.train.data import RouterDataModule

    bad = shutil.copytree(dataset, tmp_path / "bad")
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(dataset / "shard-00000.parquet", outside / "shard-00000.parquet")  # a readable file out there
    obj = json.loads((bad / "manifest.json").read_text())
    if shard == "DUPLICATE":
        obj["shards"].append(dict(obj["shards"][0]))  # its rows would be trained on twice
    else:
        obj["shards"][0]["file"] = str(outside / "shard-00000.parquet") if shard == "ABSOLUTE" else shard
    (bad / "manifest.json").write_text(json.dumps(obj))
    with pytest.raises(ValueError, match=rf"{bad}/manifest.json: {message}"):
        RouterDataModule(str(bad), cache_dir=str(tmp_path / "cache"))


def test_checkpoint_index_pointing_outside_its_folder_is_refused(tmp_path: Path) -> None:
    from safetensors import safe_open

    folder = make_target(tmp_path / "target")
    whiflash.load_target(folder)  # loads as made
    outside = tmp_path / "elsewhere.safetensors"
    (folder / "model.safetensors").rename(outside)
    with safe_open(str(outside), framework="pt") as f:
        keys = list(f.keys())
    for name in ("../elsewhere.safetensors", str(outside)):
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {k: name for k in keys}}))
        with pytest.raises(ValueError, match=rf"{folder}/model.safetensors.index.json: weight_map file "
                                             rf"'{name}': points outside {folder}"):
            whiflash.load_target(folder)
