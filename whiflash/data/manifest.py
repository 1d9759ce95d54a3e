"""The manifest of a router dataset: one typed record, written and read only through this module.

A router dataset is a folder of Parquet shards (one row per decoding round, see
:mod:`whiflash.data.shards`) plus ``manifest.json``, which says what produced the rows (target, drafter
pair and checkpoints, tree budget, feature width, tau definition, prompt sets, seed, versions) and pins
every shard by row count and sha256 (docs/design.md, "The router dataset").

Both writers (``whiflash-datagen`` and the synthetic generator) build a :class:`RouterDatasetManifest`;
readers get one back from :func:`read_manifest`, which is strict about required fields and lenient about
manifests written before the ``kind`` field existed. Only the standard library is imported here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whiflash.containment import ContainmentError, inside, unique
from whiflash.decoding.stats import TAU_DEFINITION
from whiflash.folders import DATAGEN, EVAL, KINDS, MANIFEST, ROUTER_DATASET, TESTBED, TRAIN, folder_kind
from whiflash.io import atomic_write_json
from whiflash.pairs import Pair, tree_budget_for

__all__ = [
    "ADVANCE_RULE", "EVERY_POSITION", "FEATURE", "KIND", "MANIFEST_FIELDS", "MANIFEST_NAME", "SCHEMA_VERSION",
    "TAU_DEFINITION",
    "DatasetFormatError", "RouterDatasetManifest", "ShardEntry", "manifest_hash", "read_manifest", "sha256_file",
    "write_manifest",
]

KIND = ROUTER_DATASET
"""Value of the manifest's ``kind`` field; manifests written before it existed lack it and are still read."""
SCHEMA_VERSION = 1
MANIFEST_NAME = MANIFEST
FEATURE = "final_hidden_state_postnorm"
"""What the ``hidden`` column holds: the target's final post-norm hidden state at the last committed position."""
ADVANCE_RULE = "the slot with the larger tau advances (ties: slot 1); greedy decoding"
EVERY_POSITION = ("every position of the greedy sequence, not a path: both slots' taus from each position's state; "
                  "active is the slot with the larger tau (ties: slot 1); a replay walks the rows, advancing by the "
                  "tau of the slot it takes; greedy decoding")
"""``advance_rule`` of a dataset with a row at every position (``whiflash-datagen --path every``)."""

#: Required manifest fields and their JSON types (``NoneType`` where null is allowed).
MANIFEST_FIELDS: dict[str, tuple[type, ...]] = {
    "schema_version": (int,),
    "target": (str,),
    "drafters": (dict,),  # {"slot_0": drafter id, "slot_1": drafter id}
    "pair": (str,),
    "tree_budget": (int, type(None)),
    "tap_layers": (list,),
    "hidden_size": (int,),
    "dtype": (str,),
    "tau_definition": (str,),
    "prompt_sets": (list,),
    "seed": (int,),
    "versions": (dict,),
    "shards": (list,),
}
#: Optional fields: a manifest without them is read with the dataclass defaults.
OPTIONAL_FIELDS: dict[str, tuple[type, ...]] = {
    "kind": (str,), "feature": (str,), "advance_rule": (str,), "generator": (dict,),
}
SHARD_FIELDS: dict[str, type] = {"file": str, "rows": int, "sha256": str}
SLOTS = ("slot_0", "slot_1")


class DatasetFormatError(ValueError):
    """A router dataset does not follow the contract; the message names the file and the field."""


@dataclass(frozen=True)
class ShardEntry:
    """One Parquet shard as the manifest pins it."""

    file: str
    """File name, relative to the dataset folder."""
    rows: int
    sha256: str


@dataclass(frozen=True)
class RouterDatasetManifest:
    """``manifest.json`` of a router dataset. ``to_json`` gives the on-disk object, ``from_json`` checks one."""

    target: str
    """Target model (Hub id or folder) whose hidden states and verification produced the rows."""
    pair: Pair
    """The drafter pair; ``tau_0`` belongs to its slot 0, ``tau_1`` to its slot 1."""
    drafter_ids: tuple[str, str]
    """The drafter in slot 0 and in slot 1 (Hub id, folder or name); on disk the field ``drafters``."""
    tree_budget: int | None
    """DDTree node budget for pairs with a DDTree slot, else None."""
    tap_layers: list[int]
    """Target layers the drafters read (a record; the router reads the final hidden state only)."""
    hidden_size: int
    """Width H of the ``hidden`` column."""
    prompt_sets: list[Any]
    """The prompt sources (names or descriptions) the rounds come from."""
    seed: int
    versions: dict[str, Any]
    """Package versions of the writer."""
    shards: list[ShardEntry]
    generator: dict[str, Any] = field(default_factory=dict)
    """What wrote the rows (``name``) and the settings that shaped them, e.g. ``max_new_tokens``."""
    feature: str = FEATURE
    advance_rule: str = ADVANCE_RULE
    tau_definition: str = TAU_DEFINITION
    dtype: str = "float16"
    schema_version: int = SCHEMA_VERSION
    kind: str = KIND

    def __post_init__(self) -> None:
        pair = Pair.parse(self.pair, what="manifest field 'pair'")  # writers may pass the name
        object.__setattr__(self, "pair", pair)
        object.__setattr__(self, "drafter_ids", tuple(self.drafter_ids))
        # the budget is part of the data's identity only for tree pairs: store None for the others
        object.__setattr__(self, "tree_budget", tree_budget_for(pair, self.tree_budget))

    @property
    def every_position(self) -> bool:
        """Whether the rows are one per position (``whiflash-datagen --path every``), not a path's rounds: replays
        then walk them (``whiflash.speed_oracle.walked``)."""
        return self.advance_rule == EVERY_POSITION

    @property
    def num_rows(self) -> int:
        return sum(s.rows for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        """The JSON object written to ``manifest.json``."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["pair"] = str(self.pair)
        del out["drafter_ids"]
        out["drafters"] = dict(zip(SLOTS, self.drafter_ids))
        out["shards"] = [dataclasses.asdict(s) for s in self.shards]
        return out

    @classmethod
    def from_json(cls, obj: Any, path: str | Path) -> RouterDatasetManifest:
        """Check ``obj`` (the parsed ``manifest.json`` at ``path``) and type it; errors name ``path`` and the field."""
        _check_fields(obj, path)
        if obj.get("kind", KIND) != KIND:
            raise DatasetFormatError(f"{path}: field 'kind' must be {KIND!r}, got {obj['kind']!r}")
        if obj["schema_version"] > SCHEMA_VERSION:
            raise DatasetFormatError(f"{path}: field 'schema_version' is {obj['schema_version']}, this whiflash "
                                     f"reads up to {SCHEMA_VERSION} (upgrade whiflash)")
        try:
            pair = Pair.parse(obj["pair"], what=f"{path}: field 'pair'")
        except ValueError as e:
            raise DatasetFormatError(str(e)) from None
        if obj["hidden_size"] < 1:
            raise DatasetFormatError(f"{path}: field 'hidden_size' must be positive, got {obj['hidden_size']}")
        if obj["dtype"] != "float16":
            raise DatasetFormatError(f"{path}: field 'dtype' must be 'float16' (schema v{SCHEMA_VERSION}), "
                                     f"got {obj['dtype']!r}")
        slots = obj["drafters"]
        if not all(isinstance(slots.get(s), str) for s in SLOTS):
            raise DatasetFormatError(f"{path}: field 'drafters' must map {list(SLOTS)} to drafter names, got {slots!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        # fields other writers added before the contract was typed (e.g. num_rows) are derivable: skip them
        kwargs = {k: v for k, v in obj.items() if k in known}
        kwargs.update(pair=pair, drafter_ids=(slots["slot_0"], slots["slot_1"]),
                      shards=[ShardEntry(**{k: s[k] for k in SHARD_FIELDS}) for s in obj["shards"]])
        return cls(**kwargs)


def _type_names(types: tuple[type, ...]) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def _check_type(obj: dict[str, Any], name: str, types: tuple[type, ...], path: str | Path) -> None:
    value = obj[name]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise DatasetFormatError(f"{path}: field '{name}' must be {_type_names(types)}, "
                                 f"got {type(value).__name__} {value!r}")


def _check_fields(obj: Any, path: str | Path) -> None:
    if not isinstance(obj, dict):
        raise DatasetFormatError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    for name, types in MANIFEST_FIELDS.items():
        if name not in obj:
            raise DatasetFormatError(f"{path}: manifest lacks required field '{name}' (expected {_type_names(types)})")
        _check_type(obj, name, types, path)
    for name, types in OPTIONAL_FIELDS.items():
        if name in obj:
            _check_type(obj, name, types, path)
    if not obj["shards"]:
        raise DatasetFormatError(f"{path}: field 'shards' is empty (expected at least one Parquet shard)")
    for i, shard in enumerate(obj["shards"]):
        bad = [k for k, t in SHARD_FIELDS.items() if not isinstance(shard, dict) or not isinstance(shard.get(k), t)]
        if bad:
            raise DatasetFormatError(f"{path}: shards[{i}] lacks or mistypes field(s) {bad} "
                                     f"(expected {', '.join(f'{k}: {t.__name__}' for k, t in SHARD_FIELDS.items())})")
    # shard names come from a file: each must name a file of this dataset, once (a repeat would train twice)
    try:
        for i, shard in enumerate(obj["shards"]):
            inside(Path(path).parent, shard["file"], f"{path}: shards[{i}].file")
        unique([os.path.normpath(s["file"]) for s in obj["shards"]], f"{path}: field 'shards'")
    except ContainmentError as e:
        raise DatasetFormatError(str(e)) from None


def write_manifest(out_dir: str | Path, manifest: RouterDatasetManifest) -> Path:
    """Check ``manifest`` as a reader would and write ``OUT_DIR/manifest.json`` atomically; returns its path."""
    path = Path(out_dir) / MANIFEST_NAME
    obj = manifest.to_json()
    RouterDatasetManifest.from_json(obj, path)  # never write what read_manifest would refuse
    return atomic_write_json(path, obj, sort_keys=True)


def read_manifest(data_dir: str | Path, flag: str | None = None) -> RouterDatasetManifest:
    """Read and check ``DATA_DIR/manifest.json``; ``flag`` names where the folder came from (``--data.path``)."""
    path = Path(data_dir) / MANIFEST_NAME
    what = flag or "router dataset"
    if not Path(data_dir).is_dir():
        raise FileNotFoundError(f"{what} {data_dir}: no such directory (expected Parquet shards + {MANIFEST_NAME})")
    kind = folder_kind(data_dir)
    if kind == DATAGEN and not path.is_file():
        raise FileNotFoundError(f"{what} {data_dir}: is a whiflash-datagen output without {MANIFEST_NAME} yet (a run "
                                "still going, or killed: resume it with the same arguments to finish the dataset)")
    if kind in (TESTBED, TRAIN, EVAL):  # another tool's folder, named as such (not by a field its record lacks)
        raise DatasetFormatError(f"{what} {data_dir}: is {KINDS.get(kind, 'a folder')}, kind {kind!r}; expected a "
                                 f"router dataset (the --out folder of whiflash-datagen: Parquet shards + {MANIFEST_NAME})")
    if not path.is_file():
        raise FileNotFoundError(f"{what} {data_dir}: expected {MANIFEST_NAME} at {path}")
    try:
        obj = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DatasetFormatError(f"{path}: not valid JSON ({e})") from e
    return RouterDatasetManifest.from_json(obj, path)


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def manifest_hash(data_dir: str | Path) -> str:
    """sha256 of the manifest file (it pins every shard by hash, so it identifies the data)."""
    return sha256_file(Path(data_dir) / MANIFEST_NAME)
