"""Resolving checkpoints (Hub repo id or local folder) and strict safetensors loading.

Never executes remote code and never unpickles: only `config.json` and `*.safetensors`
(single file or a sharded `model.safetensors.index.json`) are read.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from whiflash.containment import inside
from whiflash.hub import local_or_hub

log = logging.getLogger(__name__)


def resolve_checkpoint(name_or_path: str | Path, what: str = "checkpoint") -> Path:
    """A local folder as is; otherwise a Hub repo id, fetched (json + safetensors only) into the HF cache.

    Which names are local and which go to the Hub is decided by :func:`whiflash.hub.local_or_hub`.
    """
    found = local_or_hub(name_or_path, what)
    if isinstance(found, Path):
        if not found.is_dir():
            raise ValueError(f"{what} {str(name_or_path)!r} is a file; expected a folder with config.json and *.safetensors")
        return found
    from huggingface_hub import snapshot_download

    log.info("fetching %s %s from the Hugging Face Hub", what, found)
    try:
        return Path(snapshot_download(found, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]))
    except Exception as err:  # network, auth, missing repo: say what was asked for
        raise FileNotFoundError(f"{what} {found!r}: not a local folder and the Hub download failed: {err}") from err


def read_json(path: str | Path, expected: str) -> dict[str, Any]:
    """The JSON object in ``path``; errors name the full path and ``expected`` (what the file should be)."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no {path.name}; expected {expected}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e}); expected {expected}") from e
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: holds a JSON {type(obj).__name__}; expected {expected} (a JSON object)")
    return obj


@contextmanager
def readable_safetensors(file: str | Path) -> Iterator[None]:
    """Turn a failure to read ``file`` into ``ValueError("FILE: not a readable safetensors file (why)")``."""
    try:
        yield
    except (SafetensorError, OSError, RuntimeError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"{file}: not a readable safetensors file ({e}); expected safetensors weights "
                         "(truncated or garbled? download or export it again)") from e


def read_safetensors(file: str | Path, keys: set[str] | None = None) -> dict[str, Tensor]:
    """The tensors of one safetensors file (only ``keys``, where given), on CPU; errors name the file."""
    out: dict[str, Tensor] = {}
    with readable_safetensors(file), safe_open(str(file), framework="pt") as f:
        for key in f.keys():
            if keys is None or key in keys:
                out[key] = f.get_tensor(key)
    return out


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files of a folder: the shards named by the index, or the single `model.safetensors`."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index, "a safetensors index with a 'weight_map' object").get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: field 'weight_map' is missing or not an object")
        # the shard names come from a file: each must name a file of this checkpoint's folder
        return [inside(folder, f, f"{index}: weight_map file") for f in sorted(set(map(str, weight_map.values())))]
    single = folder / "model.safetensors"
    if single.exists():
        return [single]
    found = sorted(folder.glob("*.safetensors"))
    if len(found) == 1:
        return found
    pickled = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
    hint = f" (found {pickled}: pickle formats are refused, convert to safetensors)" if pickled else ""
    raise FileNotFoundError(f"{folder}: no model.safetensors or model.safetensors.index.json{hint}")


def read_state_dict(folder: Path, keys: Iterable[str] | None = None) -> dict[str, Tensor]:
    """All tensors of a folder's safetensors files (or only `keys`, where given), on CPU."""
    wanted = set(keys) if keys is not None else None
    out: dict[str, Tensor] = {}
    for file in safetensors_files(folder):
        if not file.exists():
            raise FileNotFoundError(f"{file}: shard named in the index is missing")
        out.update(read_safetensors(file, wanted))
    return out


def load_strict(
    module: nn.Module,
    state: dict[str, Tensor],
    source: str,
    allow_missing: Iterable[str] = (),
    ignore_unexpected: Iterable[str] = (),
) -> None:
    """Copy `state` into `module`, refusing missing keys (outside `allow_missing`), extra keys and wrong shapes.

    Error messages name the checkpoint, the key and both shapes, so a wrong file is obvious.
    """
    own = dict(module.state_dict())
    allow = set(allow_missing)
    missing = sorted(k for k in own if k not in state and k not in allow)
    if missing:
        raise KeyError(f"{source}: missing key(s) {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    unexpected = sorted(k for k in state if k not in own and k not in set(ignore_unexpected))
    if unexpected:
        raise KeyError(f"{source}: unexpected key(s) {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
    for key, value in state.items():
        if key not in own:
            continue
        if tuple(value.shape) != tuple(own[key].shape):
            raise ValueError(
                f"{source}: key {key!r} has shape {tuple(value.shape)}, expected {tuple(own[key].shape)}"
            )
    with torch.no_grad():
        for key, value in state.items():
            if key in own:
                own[key].copy_(value.to(own[key].dtype))
