"""One rule for "local path or Hugging Face Hub repo id?", shared by every loader.

A name that exists on disk is local. Otherwise it goes to the Hub only when huggingface_hub itself
accepts it as a repo id and nothing about it says "local path"; anything else fails at once with a
``FileNotFoundError`` naming the path, instead of spending many seconds on Hub retries for a typo
(docs/design.md, "Drafters and checkpoints").
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub.utils import HFValidationError, validate_repo_id

__all__ = ["is_hub_id", "local_or_hub", "public_name"]

#: Suffixes of files the toolkit reads; a Hub repo id never names a file.
FILE_SUFFIXES = (".safetensors", ".json")


def _looks_local(name: str) -> bool:
    """Whether ``name`` can only mean a path: ``./x``, ``/x``, ``~/x``, ``a/b/c``, ``x.safetensors``,
    a bare ``x`` (the toolkit names Hub repos with their organisation), or ``runs/typo`` where ``runs``
    is a folder here (a mistyped run folder is the usual mistake, a Hub organisation named like a folder
    in the working directory a rare one)."""
    if name.startswith((".", "/", "~")) or name.count("/") != 1 or name.endswith(FILE_SUFFIXES):
        return True
    return Path(name.partition("/")[0]).is_dir()


def is_hub_id(name: str) -> bool:
    """True when ``name`` is a Hub repo id ``ORG/NAME`` that huggingface_hub accepts and not a local path."""
    if Path(name).expanduser().exists() or _looks_local(name):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def local_or_hub(name_or_path: str | Path, what: str = "checkpoint") -> Path | str:
    """An existing local path as a ``Path``, or a Hub repo id as a ``str``; else ``FileNotFoundError``.

    Args:
        name_or_path: a local file or folder, or a Hub repo id.
        what: what is being loaded, for the error message (e.g. ``"target"``, ``"router"``).
    """
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    name = str(name_or_path)
    if is_hub_id(name):
        return name
    thing = "file" if name.endswith(FILE_SUFFIXES) else "folder"
    raise FileNotFoundError(f"{what}: no such {thing}: {name} (and not a Hub repo id of the form ORG/NAME)")


def public_name(name_or_path: str | Path) -> str:
    """How shared artefacts (model cards, configs, plots) name a checkpoint: a Hub repo id as is, a local path
    by its folder (or file) name only, so that no local directory layout leaves this machine."""
    name = str(name_or_path)
    return name if is_hub_id(name) else (Path(name).expanduser().name or name)
