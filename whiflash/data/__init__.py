"""The router dataset contract between ``whiflash-datagen`` (writer), the synthetic generator (writer) and
``whiflash-train`` (reader): the typed manifest and the Parquet shard schema (docs/design.md, "The router dataset").

Importing this package imports pyarrow; ``import whiflash`` does not import it.
"""

from whiflash.data.manifest import (
    ADVANCE_RULE, EVERY_POSITION, FEATURE, KIND, MANIFEST_FIELDS, MANIFEST_NAME, SCHEMA_VERSION, TAU_DEFINITION,
    DatasetFormatError,
    RouterDatasetManifest, ShardEntry, manifest_hash, read_manifest, sha256_file, write_manifest,
)
from whiflash.data.shards import (
    COLUMNS, FINITE_COLUMNS, SCALAR_COLUMNS, check_row_values, check_shards, row_schema, shard_entry, write_shard,
)

__all__ = [
    "ADVANCE_RULE", "COLUMNS", "EVERY_POSITION", "FEATURE", "FINITE_COLUMNS", "KIND", "MANIFEST_FIELDS",
    "MANIFEST_NAME",
    "SCALAR_COLUMNS", "SCHEMA_VERSION", "TAU_DEFINITION", "DatasetFormatError", "RouterDatasetManifest", "ShardEntry",
    "check_row_values", "check_shards",
    "manifest_hash", "read_manifest", "row_schema", "sha256_file", "shard_entry", "write_manifest", "write_shard",
]
