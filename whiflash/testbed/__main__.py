"""``python -m whiflash.testbed build --preset tiny --out DIR`` (and ``prompts``, ``presets``)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path


def build(preset: str = "tiny", out: Path | None = None, set: list[str] | str | None = None, device: str | None = None,
          until: str | None = None, quiet: bool = False) -> None:
    """Build (or resume) a testbed and print a summary table.

    Args:
        out: Output folder (re-running with the same folder reuses finished stages); default
            ``$WHIFLASH_TESTBED_DIR/<preset>`` or ``~/.cache/whiflash/testbed/<preset>``.
        preset: ``micro`` (tests), ``tiny`` (CPU demo), ``small`` (one GPU).
        set: Overrides ``section.field=value``, e.g. ``target.max_steps=50``: one with ``--set``, several
            with ``--set+`` each.
        device: Override the preset's device (``cpu`` / ``cuda``).
        until: Stop after this stage (corpus, tokenizer, tokens, target, responses, eagle3, dflash, acceptance).
        quiet: Log warnings only.
    """
    from .build import build as run_build
    from .build import default_dir
    from .presets import apply_overrides, get_preset

    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("lightning").setLevel(logging.WARNING)  # its own handler already prints; no duplicates
    config = apply_overrides(get_preset(preset), [set] if isinstance(set, str) else list(set or []))
    if device:
        config.device = device
    manifest = run_build(out or default_dir(preset), config, until=until)
    print(summary(manifest))


def prompts(testbed: Path, category: str, n: int = 5, split: str = "test") -> None:
    """Print held-out evaluation prompts of one category as JSON lines."""
    from .prompts import eval_prompts

    for p in eval_prompts(testbed, category, n, split=split):
        print(json.dumps(p))


def presets() -> None:
    """Print the presets' resolved configurations as JSON."""
    from .presets import PRESETS

    print(json.dumps({name: f().to_dict() for name, f in PRESETS.items()}, indent=2))


def summary(manifest: dict) -> str:
    """A plain-text table of stage timings and output hashes, and the target's held-out figures.

    The hashes (first 16 hex digits of each stage's output sha256) say whether two builds made the
    same world: equal target, eagle3 and dflash hashes mean equal models.
    """
    lines = [f"testbed preset {manifest.get('preset')}  corpus sha256 {manifest.get('corpus_sha256', '')[:16]}",
             f"{'stage':<10} {'seconds':>8}  {'action':<7}  output sha256"]
    actions = {}
    for entry in manifest.get("log", []):
        actions[entry["stage"]] = entry["action"]
    from .build import STAGES

    for name in STAGES:
        rec = manifest["stages"].get(name)
        if rec is None:
            continue
        lines.append(f"{name:<10} {rec.get('seconds', 0):>8.1f}  {actions.get(name, ''):<7}  "
                     f"{rec.get('output_sha256', '')[:16]}")
    target = manifest["stages"].get("target")
    if target and "test" in target:
        lines.append(f"\ntarget {target['parameters'] / 1e6:.2f}M params, {target['steps']} steps, "
                     f"{target['tokens_per_second']} tok/s")
        lines.append(f"{'category':<8} {'loss':>7} {'unigram':>8} {'top1':>6} {'H mean':>7} {'H<0.2':>6}")
        for cat, f in target["test"].items():
            lines.append(f"{cat:<8} {f['loss']:>7.3f} {f['unigram_loss']:>8.3f} {f['top1_acc']:>6.3f} "
                         f"{f['mean_entropy']:>7.3f} {f['low_entropy_frac']:>6.3f}")
    acc = manifest["stages"].get("acceptance")
    if acc:
        lines.append(f"\ntau per category ({acc['tau_definition']})")
        lines.append(f"{'drafter':<8} " + " ".join(f"{c:>7}" for c in next(iter(acc["tau"].values()))))
        for kind, per in acc["tau"].items():
            lines.append(f"{kind:<8} " + " ".join(f"{v:>7.2f}" for v in per.values()))
        if acc.get("oracle_headroom"):
            lines.append("oracle   headroom over the best single drafter (EAGLE-3 or DFlash): "
                         + ", ".join(f"{c} x{v:.2f}" for c, v in acc["oracle_headroom"].items()))
        if acc.get("switching"):
            lines.append("round winners (oracle; DFlash / EAGLE-3 / tie) and sequences where each wins >= 20%: "
                         + ", ".join(f"{c} {v['dflash_wins']:.2f}/{v['eagle3_wins']:.2f}/{v['ties']:.2f} "
                                     f"switching {v['switching_sequences']:.2f}" for c, v in acc["switching"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the testbed CLI in-process (errors are raised to the caller); the command is :func:`console`."""
    from jsonargparse import auto_cli, set_parsing_settings

    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    auto_cli([build, prompts, presets], args=argv if argv is not None else sys.argv[1:])


def console(argv: list[str] | None = None) -> None:
    """``python -m whiflash.testbed``: :func:`main`, ending with exit status 2 (bad usage or input) or 1 (a failure
    while running) and a one-line ``error:`` message; ``--debug`` or ``WHIFLASH_DEBUG=1`` adds the traceback."""
    from whiflash.errors import run_cli

    run_cli("python -m whiflash.testbed", main, argv)


if __name__ == "__main__":
    console()
