"""scripts/heldout_prompts.py: calibration rows of a prompt file that the bench does not draw."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from whiflash.datagen.prompts import read_source
from whiflash.eval.datasets import load_samples

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("heldout_prompts", ROOT / "scripts/heldout_prompts.py")
heldout_prompts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(heldout_prompts)


def prompt_file(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"question_id": 100 + i, "category": "writing",
                                        "turns": [f"question {i}", "follow-up"]}) + "\n" for i in range(n)))
    return path


def test_held_out_rows_miss_the_bench_selection_and_carry_the_bench_category_and_ids(tmp_path: Path) -> None:
    src = prompt_file(tmp_path / "mt_bench.jsonl", 12)
    out = tmp_path / "out"
    heldout_prompts.main([str(src), "--bench-samples", "4", "--per-file", "5", "--out", str(out)])
    first = (out / "mt_bench.jsonl").read_text()
    heldout_prompts.main([str(src), "--bench-samples", "4", "--per-file", "5", "--out", str(out)])
    assert (out / "mt_bench.jsonl").read_text() == first  # the same rows again
    rows = read_source(str(out / "mt_bench.jsonl"), None, 0)  # as whiflash-datagen --prompts reads them
    bench = load_samples(str(src), max_samples=4)
    assert len(rows) == 5 and {r.category for r in rows} == {bench[0].category} == {"chat"}
    assert not {r.prompt_id for r in rows} & {s.id for s in bench}
    ids = {s.id: s.turns[0] for s in load_samples(str(src))}
    assert all(ids[r.prompt_id] == r.text for r in rows)  # the bench's id for the same prompt, its first turn


def test_a_file_the_bench_draws_whole_is_refused(tmp_path: Path) -> None:
    src = prompt_file(tmp_path / "gsm8k.jsonl", 3)
    with pytest.raises(SystemExit, match="gsm8k.jsonl: every row is in the bench's selection of 10"):
        heldout_prompts.main([str(src), "--bench-samples", "10", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out/gsm8k.jsonl").exists()
