"""The router dataset contract in whiflash.data: one typed manifest for both writers, strict and lenient reading."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from whiflash.data import (
    KIND, DatasetFormatError, RouterDatasetManifest, check_row_values, read_manifest, write_manifest,
)
from whiflash.pairs import PAIRS
from whiflash.train.synthetic import write_synthetic_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("contract") / "ds"
    write_synthetic_dataset(out, num_prompts=6, rounds_per_prompt=4, hidden_size=8, pair="ddt-e3", tree_budget=16,
                            progress=False)
    return out


def _rewrite(dataset: Path, tmp_path: Path, change) -> Path:
    obj = json.loads((dataset / "manifest.json").read_text())
    change(obj)
    out = tmp_path / "edited"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps(obj))
    return out


def test_synthetic_writer_uses_the_typed_manifest(dataset: Path) -> None:
    on_disk = json.loads((dataset / "manifest.json").read_text())
    assert on_disk["kind"] == KIND and on_disk["pair"] == "ddt-e3" and on_disk["tree_budget"] == 16
    assert on_disk["drafters"] == {"slot_0": "ddtree", "slot_1": "eagle3"}  # the published key and shape
    assert on_disk["generator"]["name"] == "whiflash.train.synthetic"
    m = read_manifest(dataset)
    assert isinstance(m, RouterDatasetManifest) and m.pair is PAIRS["ddt-e3"] and m.num_rows == 24
    assert m.to_json() == on_disk


def test_manifest_before_kind_existed_is_read(dataset: Path, tmp_path: Path) -> None:
    def old_style(obj: dict) -> None:  # what the untyped writers produced: no kind, their own extra fields
        del obj["kind"], obj["generator"]
        obj.update(num_rows=24, max_new_tokens=128)

    m = read_manifest(_rewrite(dataset, tmp_path, old_style))
    assert m.kind == KIND and m.generator == {} and m.num_rows == 24


@pytest.mark.parametrize("change, message", [
    (lambda o: o.update(kind="something-else"), r"field 'kind' must be 'whiflash-router-dataset'"),
    (lambda o: o.update(pair="e3-df"), r"field 'pair': expected one of df-e3, ddt-e3, df-ddt, got 'e3-df'"),
    (lambda o: o.update(drafters={"slot_0": "a"}), r"field 'drafters' must map \['slot_0', 'slot_1'\]"),
    (lambda o: o["shards"][0].pop("sha256"), r"shards\[0\] lacks or mistypes field\(s\) \['sha256'\]"),
    (lambda o: o.update(schema_version=99), r"field 'schema_version' is 99"),
    (lambda o: o.update(generator="datagen"), r"field 'generator' must be dict, got str"),
])
def test_broken_manifest_names_file_and_field(dataset: Path, tmp_path: Path, change, message: str) -> None:
    bad = _rewrite(dataset, tmp_path, change)
    with pytest.raises(DatasetFormatError, match=rf"{bad}/manifest.json: .*{message}"):
        read_manifest(bad)


def test_writer_refuses_what_the_reader_would(dataset: Path, tmp_path: Path) -> None:
    m = read_manifest(dataset)
    with pytest.raises(DatasetFormatError, match="field 'shards' is empty"):
        write_manifest(tmp_path, RouterDatasetManifest(**{**m.__dict__, "shards": []}))
    assert not (tmp_path / "manifest.json").exists()


def test_tree_budget_is_kept_only_for_tree_pairs(dataset: Path) -> None:
    m = read_manifest(dataset)
    assert RouterDatasetManifest(**{**m.__dict__, "pair": "df-e3"}).tree_budget is None


def test_datagen_imports_no_app_and_whiflash_no_heavy_packages() -> None:
    code = ("import sys, whiflash; heavy = [m for m in ('pyarrow', 'datasets', 'lightning', 'sklearn', 'matplotlib') "
            "if m in sys.modules]; assert not heavy, heavy; import whiflash.datagen.cli; "
            "apps = [m for m in sys.modules if m.startswith('whiflash.train')]; assert not apps, apps")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def _rows(hidden: pa.Array, n: int, gain: float = 2.0) -> pa.Table:
    """A table of ``n`` rows with ``hidden`` and consistent scalar columns (tau_0 = 3, tau_1 = 1)."""
    full = lambda v, t: pa.array(np.full(n, v), type=t)  # noqa: E731
    return pa.table({"hidden": hidden, "entropy": full(1.0, pa.float32()), "tau_0": full(3, pa.int16()),
                     "tau_1": full(1, pa.int16()), "gain": full(gain, pa.float32())})


def test_row_values_name_the_shard_row_across_chunks_and_null_rows() -> None:
    h = np.ones((6, 4), dtype=np.float16)
    h[0, 0] = 65504  # the largest float16 is finite
    check_row_values(_rows(pa.FixedSizeListArray.from_arrays(pa.array(h.reshape(-1)), 4), 6), [(Path("a"), 6)])
    h[4, 2] = -np.inf
    hidden = pa.FixedSizeListArray.from_arrays(pa.array(h.reshape(-1)), 4)
    chunked = pa.concat_tables([_rows(hidden.slice(0, 3), 3), _rows(hidden.slice(3), 3)])
    with pytest.raises(DatasetFormatError, match=r"^b: column 'hidden' row 2 holds a NaN, inf or null element"):
        check_row_values(chunked, [(Path("a"), 2), (Path("b"), 4)])
    nulls = pa.FixedSizeListArray.from_arrays(pa.array(np.ones(24, np.float16)), 4,
                                              mask=pa.array([False, False, True, False, False, False]))
    with pytest.raises(DatasetFormatError, match=r"^b: column 'hidden' row 0 holds a NaN, inf or null element"):
        check_row_values(_rows(nulls.slice(1), 5), [(Path("a"), 1), (Path("b"), 4)])
