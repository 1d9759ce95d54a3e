"""What routing adds to a round: standalone drafters against routed decoding pinned to one slot.

Usage: python scripts/bench_routing.py [--shapes small|qwen3-8b|DIR ...] [--new-tokens 128] [--repeats 5]

Random weights at real shapes (`--shapes`: a testbed preset, whose configs are written the way its build
writes them, a `checkpoints/` preset, or a folder with `{target,eagle3,dflash}/config.json`). Random
drafts are rejected, so every round commits one token and a round's time is its fixed cost: the draft,
the verify pass and what routing adds. Each routed method is pinned to one slot, so it drafts exactly as
the standalone drafter does and the difference is routing alone:

- `fixed`: a fixed slot, decided inside the verify pass;
- `neural`: a neural router (threshold far below or above its scores), decided inside the verify pass;
- `neural-after`: the same router asked after the pass from the path's last row (a router that reads the
  previous round decides that way).

Methods run side by side in one process, interleaved, CUDA graphs on a GPU; the table gives the median
milliseconds per round over the repeats and each routed method's difference to its standalone drafter.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

import whiflash
from whiflash.router import NeuralRouter


def testbed_shapes(preset: str, folder: Path) -> Path:
    """`{target,eagle3,dflash}/config.json` of testbed preset `preset`, as its build writes them, in `folder`."""
    from whiflash.runtime import ModelConfig
    from whiflash.testbed.dflash_train import dflash_config
    from whiflash.testbed.drafter_data import tap_layers
    from whiflash.testbed.eagle3_train import eagle3_config
    from whiflash.testbed.presets import get_preset
    from whiflash.testbed.target import qwen3_config

    cfg = get_preset(preset)
    vocab = cfg.tokenizer.vocab_size
    target = qwen3_config(cfg.target, {"vocab_size": vocab, "eos_token_id": 0, "pad_token_id": 0}).to_dict()
    tc = ModelConfig.from_dict(target, source=f"{preset} target")
    n = tc.num_hidden_layers
    parts = {"target": target, "eagle3": eagle3_config(cfg.eagle3, tc, tap_layers("eagle3", n)),
             "dflash": dflash_config(cfg.dflash, tc, tap_layers("dflash", n), mask_token_id=vocab - 1)}
    for part, config in parts.items():
        (folder / part).mkdir(parents=True, exist_ok=True)
        (folder / part / "config.json").write_text(json.dumps(config))
    return folder


class AfterThePass:
    """A policy without `rows`: the loop asks it after the verify pass, from the path's last row."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def __call__(self, hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return self.policy(hidden, logits)


def methods(target: Any, eagle: Any, dflash: Any) -> dict[str, tuple[str, Any]]:
    """name -> (the standalone method it is compared with, drafter)."""
    router = NeuralRouter(target.config.hidden_size, drafters="df-e3").to(target.device).eval()
    pinned = {0: whiflash.NeuralPolicy(router, threshold=-1e9), 1: whiflash.NeuralPolicy(router, threshold=1e9)}
    routed = lambda policy: whiflash.RoutedDrafter("df-e3", policy, eagle3=eagle, dflash=dflash)  # noqa: E731
    out: dict[str, tuple[str, Any]] = {"ar": ("ar", None), "dflash": ("dflash", dflash), "eagle3": ("eagle3", eagle)}
    for slot, alone in ((0, "dflash"), (1, "eagle3")):
        out[f"fixed-{slot}"] = (alone, routed(whiflash.FixedRouter(slot)))
        out[f"neural-{slot}"] = (alone, routed(pinned[slot]))
        out[f"neural-after-{slot}"] = (alone, routed(AfterThePass(pinned[slot])))
    return out


def measure(shapes: str, device: str, dtype: torch.dtype, new_tokens: int, prompt_tokens: int,
            repeats: int, folder: str | None = None) -> list[dict[str, Any]]:
    """Rows of the table for `shapes` (its configs in `folder` when given)."""
    from whiflash.eval.shapes import random_models

    target, eagle, dflash = random_models(folder or shapes, device, dtype)
    target.set_engine(target.engine.with_(cuda_graphs=device == "cuda", compiled_layers=False))
    prompt = torch.randint(0, target.config.vocab_size, (prompt_tokens,)).tolist()
    table = methods(target, eagle, dflash)
    times: dict[str, list[float]] = {name: [] for name in table}
    rounds: dict[str, int] = {}
    for r in range(repeats + 1):  # the first pass captures graphs and is not counted
        for name, (_, drafter) in table.items():
            _, stats = whiflash.generate(target, drafter, prompt, new_tokens)
            rounds[name] = stats.rounds
            if r:
                times[name].append(stats.decode_seconds / stats.rounds * 1e3)
    rows = []
    for name, (alone, _) in table.items():
        ms, base = statistics.median(times[name]), statistics.median(times[alone])
        rows.append({"shapes": shapes, "method": name, "rounds": rounds[name], "ms_per_round": round(ms, 4),
                     "vs_standalone_ms": round(ms - base, 4), "vs_standalone_pct": round(100 * (ms / base - 1), 2)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["small", "qwen3-8b"],
                    help="testbed presets (small, tiny, ...), checkpoints/ presets (qwen3-8b, ...) or config folders")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    from whiflash.testbed.presets import PRESETS

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shapes in args.shapes:
            folder = str(testbed_shapes(shapes, Path(tmp) / shapes)) if shapes in PRESETS else None
            rows += measure(shapes, args.device, getattr(torch, args.dtype), args.new_tokens, args.prompt_tokens,
                            args.repeats, folder)
    print("| shapes | method | rounds | ms/round | vs standalone |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['shapes']} | {row['method']} | {row['rounds']} | {row['ms_per_round']:.4f} | "
              f"{row['vs_standalone_ms']:+.4f} ms ({row['vs_standalone_pct']:+.2f}%) |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
