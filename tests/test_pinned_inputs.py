"""Resume means same inputs (whiflash/inputs.py): a bench resumed on an edited prompt file does not finish the old
rows, and a testbed stage whose files changed since they were recorded is rebuilt, not reused."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest


def _prompts(path: Path, first: list[int]) -> Path:
    path.write_text(json.dumps({"id": 1, "input_ids": first}) + "\n" + json.dumps({"id": 2, "input_ids": [9, 8, 7]})
                    + "\n")
    return path


def test_bench_on_an_edited_prompt_file_does_not_resume_the_old_rows(worlds, tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    from whiflash.eval.cli import main

    world = worlds["qwen3-mixed"]
    prompts = _prompts(tmp_path / "ids.jsonl", [3, 4, 5])
    out = tmp_path / "runs"
    argv = ["bench", "--out", str(out), "--model-name-or-path", str(world.target_dir), "--draft-name-or-path",
            str(world.dflash_dir), "--methods", "dflash", "--dataset", str(prompts), "--name", "r", "--max-new-tokens",
            "4", "--warmup-tokens", "0", "--bootstrap", "10", "--dtype", "float32", "--device", "cpu", "--no-plots"]
    assert main(argv) == 0
    (first,) = out.glob("*_r")
    rows = (first / "samples.jsonl").read_text()
    (first / "samples.jsonl").write_text(rows.splitlines()[0] + "\n")  # killed after its first row
    _prompts(prompts, [3, 4, 6])  # the prompt file edited in place
    with caplog.at_level(logging.WARNING, logger="whiflash.eval.outputs"):
        assert main(argv) == 0
    (second,) = set(out.glob("*_r")) - {first}  # a new run; the old one is left as it was
    assert (first / "samples.jsonl").read_text() == rows.splitlines()[0] + "\n"
    assert f"not resuming {first}: its inputs changed (--dataset {prompts} '" in caplog.text
    fresh = [json.loads(line) for line in (second / "samples.jsonl").read_text().splitlines()]
    assert len(fresh) == 4 and {r["sample"] for r in fresh} == {"ids-1", "ids-2"}  # every row on the new prompts


def test_testbed_stage_whose_files_changed_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from whiflash.locks import owning_folders
    from whiflash.testbed.manifest import Manifest

    built: list[int] = []

    def stage(folder: Path) -> dict:
        built.append(1)
        (folder / "model.safetensors").write_bytes(b"weights" * 100)
        return {}

    with owning_folders():
        man = Manifest(tmp_path / "tb", {"preset": "fake"})
        first = man.run_stage("target", "fp1", stage)
        assert man.run_stage("target", "fp1", stage) == first and len(built) == 1  # unchanged: reused
        weights = tmp_path / "tb" / "target" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:50])  # truncated after the build
    with owning_folders(), caplog.at_level(logging.WARNING, logger="whiflash.testbed.manifest"):
        man = Manifest(tmp_path / "tb", {"preset": "fake"})
        again = man.run_stage("target", "fp1", stage)
    assert len(built) == 2 and again["output_sha256"] == first["output_sha256"]  # rebuilt, as it was
    assert weights.read_bytes() == b"weights" * 100
    assert f"stage target    rebuilt: {tmp_path / 'tb' / 'target'} changed since it was built" in caplog.text
    assert [e["action"] for e in json.loads((tmp_path / "tb" / "manifest.json").read_text())["log"]] == [
        "built", "reused", "built"]
