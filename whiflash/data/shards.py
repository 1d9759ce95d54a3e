"""The rows of a router dataset: the Arrow schema of a shard, writing one, and checking them against the manifest.

One row per decoding round (docs/design.md, "The router dataset"): where the round happened
(``prompt_id``, ``category``, ``round``, ``position``), the router's features (``hidden``, float16[H],
and ``entropy``), both slots' acceptance lengths (``tau_0``, ``tau_1``), their difference ``gain`` and the
slot that advanced the sequence (``active``). Imports pyarrow, so ``import whiflash`` does not load this.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from whiflash.io import atomic_path

from .manifest import MANIFEST_NAME, DatasetFormatError, RouterDatasetManifest, ShardEntry, sha256_file

__all__ = ["COLUMNS", "FINITE_COLUMNS", "SCALAR_COLUMNS", "check_row_values", "check_shards", "row_schema",
           "shard_entry", "write_shard"]

#: Per-round columns other than ``hidden``: name -> Arrow type.
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
#: Numeric columns whose every value must be finite (no NaN, inf or null).
FINITE_COLUMNS = ("hidden", "entropy", "tau_0", "tau_1", "gain")
#: Rows of ``hidden`` scanned per block when looking for non-finite values (bounds the temporary memory).
_HIDDEN_BLOCK_ROWS = 1 << 14
_F16_EXPONENT = np.uint16(0x7C00)
COLUMNS = ("prompt_id", "category", "round", "position", "hidden", "entropy", "tau_0", "tau_1", "gain", "active")


def row_schema(hidden_size: int) -> pa.Schema:
    """The Arrow schema of a shard whose ``hidden`` column is a fixed-size list of ``hidden_size`` float16."""
    return pa.schema([pa.field(c, pa.list_(pa.float16(), hidden_size) if c == "hidden" else SCALAR_COLUMNS[c])
                      for c in COLUMNS])


def write_shard(path: str | Path, columns: dict[str, np.ndarray | list], hidden_size: int) -> ShardEntry:
    """Write one Parquet shard atomically (a resumed run trusts every shard it finds); returns its manifest entry."""
    path = Path(path)
    hidden = np.ascontiguousarray(columns["hidden"], dtype=np.float16)
    if hidden.ndim != 2 or hidden.shape[1] != hidden_size:
        raise ValueError(f"shard {path}: column 'hidden' must be [N, {hidden_size}], got {hidden.shape}")
    arrays = {c: pa.array(columns[c], type=SCALAR_COLUMNS[c]) for c in SCALAR_COLUMNS}
    arrays["hidden"] = pa.FixedSizeListArray.from_arrays(pa.array(hidden.reshape(-1)), hidden_size)  # zero-copy
    table = pa.Table.from_arrays([arrays[c] for c in COLUMNS], schema=row_schema(hidden_size))
    with atomic_path(path) as tmp:
        # fp16 activations barely compress; skip compression so writing and reading stay I/O bound, not CPU bound.
        pq.write_table(table, tmp, compression="none", row_group_size=max(1, min(len(table), 1 << 14)))
    return shard_entry(path)


def read_metadata(path: Path) -> pq.FileMetaData:
    """The Parquet footer of the shard ``path``; an unreadable one (truncated, not Parquet) is refused naming it."""
    try:
        return pq.read_metadata(path)
    except (pa.ArrowInvalid, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise DatasetFormatError(f"{path}: not a readable Parquet shard ({e}); expected a shard as whiflash-datagen "
                                 "writes it (truncated or overwritten? regenerate the dataset, or delete this shard "
                                 "and resume the datagen run that wrote it)") from None


def shard_entry(path: Path) -> ShardEntry:
    """The manifest entry of a written shard: file name, row count, sha256."""
    return ShardEntry(file=path.name, rows=read_metadata(path).num_rows, sha256=sha256_file(path))


def check_shards(data_dir: str | Path, manifest: RouterDatasetManifest, verify_hashes: bool = True) -> list[Path]:
    """Check every shard the manifest lists exists, has the right schema and row count and (optionally) hash."""
    data_dir = Path(data_dir)
    expected = row_schema(manifest.hidden_size)
    paths = []
    for shard in manifest.shards:
        path = data_dir / shard.file
        if not path.is_file():
            raise FileNotFoundError(f"{data_dir / MANIFEST_NAME}: lists shard {shard.file}, but {path} does not exist")
        meta = read_metadata(path)
        schema = meta.schema.to_arrow_schema()
        for column in expected:
            if column.name not in schema.names:
                raise DatasetFormatError(f"{path}: lacks column '{column.name}' (expected {column.type})")
            got = schema.field(column.name).type
            if column.name == "hidden" and (not pa.types.is_fixed_size_list(got) or got.list_size != manifest.hidden_size
                                            or got.value_type != pa.float16()):
                raise DatasetFormatError(f"{path}: column 'hidden' is {got}, expected float16[{manifest.hidden_size}] "
                                         f"(field 'hidden_size' of {MANIFEST_NAME})")
        if meta.num_rows != shard.rows:
            raise DatasetFormatError(f"{path}: has {meta.num_rows} rows, {MANIFEST_NAME} says {shard.rows}")
        if verify_hashes and sha256_file(path) != shard.sha256:
            raise DatasetFormatError(f"{path}: sha256 differs from {MANIFEST_NAME} (file changed or truncated)")
        paths.append(path)
    return paths


def check_row_values(table: pa.Table, shards: list[tuple[Path, int]]) -> None:
    """Refuse non-finite values and a ``gain`` other than ``tau_0 - tau_1``; errors name shard, column and row.

    ``table`` is the concatenation of ``shards`` (path, row count) in order. Vectorised over the Arrow
    columns: ``hidden`` is scanned block by block (one integer max per row over the float16 exponent bits), so
    the check costs one pass over the data and little memory.
    """
    scalars = {c: _as_float(table, c) for c in FINITE_COLUMNS if c != "hidden"}
    for name in FINITE_COLUMNS:
        bad = _nonfinite_rows(table.column(name)) if name == "hidden" else ~np.isfinite(scalars[name])
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            value = "a NaN, inf or null element" if name == "hidden" else f"{scalars[name][row]}"
            _raise_at(shards, row, name, f"holds {value} (expected finite values; {int(bad.sum())} such row(s) "
                                         "in the dataset)")
    gain, tau_0, tau_1 = scalars["gain"], scalars["tau_0"], scalars["tau_1"]
    bad = gain != tau_0 - tau_1
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        _raise_at(shards, row, "gain", f"is {gain[row]:g}, expected tau_0 - tau_1 = {tau_0[row]:g} - {tau_1[row]:g} "
                                       f"= {tau_0[row] - tau_1[row]:g} ({int(bad.sum())} such row(s) in the dataset)")


def _as_float(table: pa.Table, name: str) -> np.ndarray:
    """Column ``name`` as float64 numpy (nulls become NaN, so they are caught as non-finite)."""
    return table.column(name).to_numpy().astype(np.float64)


def _nonfinite_rows(column: pa.ChunkedArray) -> np.ndarray:
    """Bool per row of a fixed-size-list column: does the row hold a NaN, inf or null (or is it null)?"""
    return np.concatenate([_nonfinite_chunk_rows(c) for c in column.chunks] or [np.zeros(0, dtype=bool)])


def _nonfinite_chunk_rows(chunk: pa.FixedSizeListArray) -> np.ndarray:
    """:func:`_nonfinite_rows` of one chunk, ``_HIDDEN_BLOCK_ROWS`` rows at a time."""
    width = chunk.type.list_size
    # .values keeps the slots of null rows (flatten() drops them), so rows and values stay aligned
    values = chunk.values.slice(chunk.offset * width, len(chunk) * width).to_numpy(zero_copy_only=False)
    values = values.reshape(len(chunk), width)
    bad = np.zeros(len(chunk), dtype=bool)
    for i in range(0, len(chunk), _HIDDEN_BLOCK_ROWS):
        bad[i : i + _HIDDEN_BLOCK_ROWS] = _nonfinite_block_rows(values[i : i + _HIDDEN_BLOCK_ROWS])
    if chunk.null_count:
        bad |= chunk.is_null().to_numpy(zero_copy_only=False)
    return bad


def _nonfinite_block_rows(block: np.ndarray) -> np.ndarray:
    """Bool per row of a 2-D block: does it hold a NaN or inf? For float16 (the contract's ``hidden``) an element
    is NaN or inf exactly when its 5 exponent bits are all set, so one integer max per row decides (2-3x faster
    than ``isfinite``); other dtypes take ``isfinite``."""
    if block.dtype == np.float16:
        return (block.view(np.uint16) & _F16_EXPONENT).max(axis=1, initial=0) == _F16_EXPONENT
    return ~np.isfinite(block).all(axis=1)


def _raise_at(shards: list[tuple[Path, int]], row: int, column: str, what: str) -> None:
    """Raise :class:`DatasetFormatError` for global ``row``, named by its shard file and its row in that shard."""
    ends = np.cumsum([rows for _, rows in shards])
    k = int(np.searchsorted(ends, row, side="right"))
    start = int(ends[k - 1]) if k else 0
    raise DatasetFormatError(f"{shards[k][0]}: column '{column}' row {row - start} {what}")
