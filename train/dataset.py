"""The router dataset contract (DESIGN.md section 6), shared by datagen (writer) and train (reader).

A dataset is a directory of Parquet shards (one row per decoding round) plus ``manifest.json``. This module
holds the column schema, the required manifest fields, atomic shard writing, hashing and validation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from whiflash.decoding.stats import TAU_DEFINITION  # re-exported: the manifest records it

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"

#: Required manifest fields and their JSON types (``None`` allowed where listed).
MANIFEST_FIELDS: dict[str, tuple[type, ...]] = {
    "schema_version": (int,),
    "target": (str,),
    "drafters": (dict,),  # {"slot_0": drafter id, "slot_1": drafter id}
    "pair": (str,),  # df-e3 | ddt-e3 | df-ddt
    "tree_budget": (int, type(None)),
    "tap_layers": (list,),
    "hidden_size": (int,),
    "dtype": (str,),
    "tau_definition": (str,),
    "prompt_sets": (list,),
    "seed": (int,),
    "versions": (dict,),
    "shards": (list,),  # [{"file", "rows", "sha256"}]
}
SHARD_FIELDS = ("file", "rows", "sha256")

#: Per-round columns: name -> Arrow type (``hidden`` is a fixed-size list of float16 of length H).
SCALAR_COLUMNS: dict[str, pa.DataType] = {
    "prompt_id": pa.string(),
    "category": pa.string(),
    "round": pa.int32(),
    "position": pa.int32(),
    "entropy": pa.float32(),
    "tau_0": pa.int16(),
    "tau_1": pa.int16(),
    "gain": pa.float32(),
    "active": pa.int8(),
}
COLUMNS = ("prompt_id", "category", "round", "position", "hidden", "entropy", "tau_0", "tau_1", "gain", "active")


class DatasetFormatError(ValueError):
    """A router dataset does not follow the contract; the message names the file and the field."""


def row_schema(hidden_size: int) -> pa.Schema:
    fields = [pa.field(c, SCALAR_COLUMNS[c]) if c != "hidden" else pa.field("hidden", pa.list_(pa.float16(), hidden_size))
              for c in COLUMNS]
    return pa.schema(fields)


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_shard(path: str | Path, columns: dict[str, np.ndarray | list], hidden_size: int) -> dict[str, Any]:
    """Write one Parquet shard atomically (tmp file + rename); returns its manifest entry."""
    path = Path(path)
    hidden = np.ascontiguousarray(columns["hidden"], dtype=np.float16)
    if hidden.ndim != 2 or hidden.shape[1] != hidden_size:
        raise ValueError(f"hidden must be [N, {hidden_size}], got {hidden.shape}")
    arrays = {c: pa.array(columns[c], type=SCALAR_COLUMNS[c]) for c in SCALAR_COLUMNS}
    arrays["hidden"] = pa.FixedSizeListArray.from_arrays(pa.array(hidden.reshape(-1)), hidden_size)  # zero-copy
    table = pa.Table.from_arrays([arrays[c] for c in COLUMNS], schema=row_schema(hidden_size))
    tmp = path.with_name(path.name + ".tmp")
    # fp16 activations barely compress; skip compression so writing and reading stay I/O bound, not CPU bound.
    pq.write_table(table, tmp, compression="none", row_group_size=max(1, min(len(table), 1 << 14)))
    os.replace(tmp, path)
    return shard_entry(path)


def shard_entry(path: Path) -> dict[str, Any]:
    """The manifest entry of a written shard: file name, row count, sha256."""
    return {"file": path.name, "rows": pq.read_metadata(path).num_rows, "sha256": sha256_file(path)}


def write_manifest(out_dir: str | Path, manifest: dict[str, Any]) -> Path:
    """Validate and write ``manifest.json`` atomically."""
    path = Path(out_dir) / MANIFEST_NAME
    validate_manifest(manifest, path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(tmp, path)
    return path


def validate_manifest(manifest: Any, path: str | Path) -> None:
    """Raise :class:`DatasetFormatError` naming ``path`` and the field when the manifest breaks the contract."""
    if not isinstance(manifest, dict):
        raise DatasetFormatError(f"{path}: expected a JSON object, got {type(manifest).__name__}")
    for field, types in MANIFEST_FIELDS.items():
        if field not in manifest:
            raise DatasetFormatError(f"{path}: manifest lacks required field '{field}' "
                                     f"(expected {' or '.join(t.__name__ for t in types)})")
        value = manifest[field]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise DatasetFormatError(f"{path}: field '{field}' must be {' or '.join(t.__name__ for t in types)}, "
                                     f"got {type(value).__name__} {value!r}")
    if manifest["hidden_size"] < 1:
        raise DatasetFormatError(f"{path}: field 'hidden_size' must be positive, got {manifest['hidden_size']}")
    if manifest["dtype"] != "float16":
        raise DatasetFormatError(f"{path}: field 'dtype' must be 'float16' (schema v{SCHEMA_VERSION}), "
                                 f"got {manifest['dtype']!r}")
    if not manifest["shards"]:
        raise DatasetFormatError(f"{path}: field 'shards' is empty (expected at least one Parquet shard)")
    for i, shard in enumerate(manifest["shards"]):
        missing = [k for k in SHARD_FIELDS if not isinstance(shard, dict) or k not in shard]
        if missing:
            raise DatasetFormatError(f"{path}: shards[{i}] lacks field(s) {missing} (expected {list(SHARD_FIELDS)})")


def read_manifest(data_dir: str | Path) -> dict[str, Any]:
    """Read and validate ``DATA_DIR/manifest.json``."""
    path = Path(data_dir) / MANIFEST_NAME
    if not Path(data_dir).is_dir():
        raise FileNotFoundError(f"router dataset {data_dir}: no such directory (expected Parquet shards + {MANIFEST_NAME})")
    if not path.is_file():
        raise FileNotFoundError(f"router dataset {data_dir}: expected {MANIFEST_NAME} at {path}")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DatasetFormatError(f"{path}: not valid JSON ({e})") from e
    validate_manifest(manifest, path)
    return manifest


def check_shards(data_dir: str | Path, manifest: dict[str, Any], verify_hashes: bool = True) -> list[Path]:
    """Check every shard listed in the manifest exists, has the right schema/row count and (optionally) hash."""
    data_dir = Path(data_dir)
    expected = row_schema(manifest["hidden_size"])
    paths = []
    for shard in manifest["shards"]:
        path = data_dir / shard["file"]
        if not path.is_file():
            raise FileNotFoundError(f"{data_dir / MANIFEST_NAME}: lists shard {shard['file']}, but {path} does not exist")
        meta = pq.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
        for field in expected:
            if field.name not in schema.names:
                raise DatasetFormatError(f"{path}: lacks column '{field.name}' (expected {field.type})")
            got = schema.field(field.name).type
            if field.name == "hidden" and (not pa.types.is_fixed_size_list(got) or got.list_size != manifest["hidden_size"]
                                           or got.value_type != pa.float16()):
                raise DatasetFormatError(f"{path}: column 'hidden' is {got}, expected float16[{manifest['hidden_size']}] "
                                         f"(hidden_size in {MANIFEST_NAME})")
        if meta.num_rows != shard["rows"]:
            raise DatasetFormatError(f"{path}: has {meta.num_rows} rows, {MANIFEST_NAME} says {shard['rows']}")
        if verify_hashes and sha256_file(path) != shard["sha256"]:
            raise DatasetFormatError(f"{path}: sha256 differs from {MANIFEST_NAME} (file changed or truncated)")
        paths.append(path)
    return paths


def manifest_hash(data_dir: str | Path) -> str:
    """sha256 of the manifest file (it pins every shard by hash, so it identifies the data)."""
    return sha256_file(Path(data_dir) / MANIFEST_NAME)
