"""`--preset NAME`: the checkpoint sets of `checkpoints/registry.json` as flag defaults.

A preset names a target, its DFlash and EAGLE-3 drafters, the neural routers per drafter pair
(key `df-e3`, or `ddt-e3-b32` for a tree pair: pair and DDTree budget) and example thresholds per
pair key. Its folder `checkpoints/<name>/{target,dflash,eagle3}/config.json` holds offline
configs at the released shapes (what `whiflash-eval profile --random-weights` builds). Preset
values are defaults only: a flag given on the command line or in a `--config` file wins.
"""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from whiflash import settings
from whiflash.pairs import Pair

__all__ = ["CHECKPOINTS_ENV", "bench_defaults", "checkpoints_dir", "get_preset", "registry", "router_key"]

CHECKPOINTS_ENV = settings.CHECKPOINTS
"""Environment variable naming a `checkpoints/` folder (default: the source checkout's)."""


def checkpoints_dir() -> Path:
    """The `checkpoints/` folder: `$WHIFLASH_CHECKPOINTS`, else the one of the source checkout."""
    env = settings.checkpoints_dir()
    # eval/ sits next to checkpoints/ in a checkout (editable installs included); a wheel has no copy
    root = Path(env) if env else Path(__file__).resolve().parents[1] / "checkpoints"
    if not (root / "registry.json").is_file():
        raise FileNotFoundError(f"--preset: no registry.json in {root}; presets come from a source checkout's "
                                f"checkpoints/ folder (or set {CHECKPOINTS_ENV} to such a folder)")
    return root


@cache
def _read(path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) and "target" in v for v in data.values()):
        raise ValueError(f"{path}: expected {{preset name: {{\"target\": ..., \"dflash\": ..., \"eagle3\": ...}}}}")
    return data


def registry() -> dict[str, dict[str, Any]]:
    """Every preset of `checkpoints/registry.json`, by name."""
    return _read(checkpoints_dir() / "registry.json")


def get_preset(name: str) -> dict[str, Any]:
    """The registry entry `name`; an unknown name is an error listing the known ones."""
    known = registry()
    if name not in known:
        raise ValueError(f"--preset {name!r}: unknown; known presets: {', '.join(sorted(known))} "
                         f"(from {checkpoints_dir() / 'registry.json'})")
    return known[name]


def router_key(pair: str | Pair, tree_budget: int | None) -> str:
    """The registry key of a router or threshold: the pair, plus `-b<budget>` for pairs with a DDTree slot."""
    pair = Pair.parse(pair)
    return f"{pair}-b{tree_budget}" if pair.uses_tree and tree_budget is not None else str(pair)


def bench_defaults(name: str, *, algorithm: str = "WHIFLASH", pair: str = "df-e3",
                   tree_budget: int | None = None) -> dict[str, Any]:
    """Flag defaults (config field -> value) of preset `name` for a run of `algorithm` on `pair`:
    target and drafter ids (`--draft-name-or-path` is the EAGLE-3 draft under EAGLE3, as upstream),
    the pair's router and its example thresholds when the registry has them."""
    entry = get_preset(name)
    key = router_key(pair, tree_budget)
    draft = entry.get("eagle3") if algorithm.upper() == "EAGLE3" else entry.get("dflash")
    thresholds = entry.get("thresholds", {}).get(key, {})
    values = {
        "model_name_or_path": entry["target"], "draft_name_or_path": draft, "whiflash_eagle_draft": entry.get("eagle3"),
        "whiflash_neural_router_path": entry.get("routers", {}).get(key),
        "whiflash_neural_router_threshold": thresholds.get("neural"),
        "whiflash_entropy_threshold": thresholds.get("entropy"),
    }
    return {k: v for k, v in values.items() if v is not None}
