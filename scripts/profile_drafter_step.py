"""Where a drafter stage's training step spends its time, at a preset's shapes, on random weights.

Usage: python scripts/profile_drafter_step.py [--preset small] [--device cuda] [--steps 8] [--prompt 256]
       [--response 256] [--json OUT]

A drafter stage (eagle3, dflash) computes the frozen target's tap features once per sequence where they fit (else
one forward per batch), then runs the drafter's training forward, backward and AdamW step. This script builds a
target of the preset's shapes with random weights (time depends on shapes, not values), one batch of ``batch_size``
sequences of ``prompt`` + ``response`` tokens (the loss on the response), and times, after two warm-up steps, the
mean of ``steps``: ``features`` (the target forward alone), ``step`` (a whole training step, features included) and
``drafter`` (the step with the features already in the batch), under bf16 autocast on CUDA, fp32 on a CPU. It then
prints the top operators of one step with the features given, as the stage runs it (torch.profiler, by device
time): what the drafter's own time is made of. The ``features`` share says what computing the features in every
step would cost where they do not fit.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from whiflash.testbed.presets import get_preset

MASK_ID, EOS_ID, PAD_ID = 1, 2, 0


def save_random_target(preset, folder: Path) -> None:
    """A target of the preset's shapes with random weights, saved as the target stage saves one."""
    from transformers import Qwen3ForCausalLM

    from whiflash.testbed.target import qwen3_config

    info = {"vocab_size": preset.tokenizer.vocab_size, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID}
    torch.manual_seed(0)
    Qwen3ForCausalLM(qwen3_config(preset.target, info)).save_pretrained(folder)


def make_module(kind: str, preset, folder: Path, device: str):
    """The stage's LightningModule for ``kind`` on the saved target, as ``train_eagle3`` / ``train_dflash`` build it."""
    from whiflash.drafters import build_drafter
    from whiflash.runtime import ModelConfig, load_target
    from whiflash.testbed.dflash_train import DFlashModule, dflash_config
    from whiflash.testbed.drafter_data import load_features, tap_layers
    from whiflash.testbed.eagle3_train import Eagle3Module, eagle3_config

    tc = ModelConfig.from_json(folder / "config.json")
    target = load_target(folder, device=device)
    taps = tap_layers(kind, tc.num_hidden_layers)
    features = load_features(folder.parent, taps, device)  # it reads folder.parent / "target"
    embed, head = target.model.embed_tokens.weight, target.lm_head.weight
    if kind == "eagle3":
        cfg = preset.eagle3
        drafter = build_drafter("eagle3", eagle3_config(cfg, tc, taps), target).to(device)
        used = torch.arange(cfg.draft_vocab_size, device=device)
        return Eagle3Module(drafter, features, embed, head, used, cfg, PAD_ID), cfg
    cfg = preset.dflash
    drafter = build_drafter("dflash", dflash_config(cfg, tc, taps, MASK_ID), target).to(device)
    return DFlashModule(drafter, features, embed, head, cfg), cfg


def batch_of(batch_size: int, vocab: int, prompt: int, response: int, device: str) -> dict[str, torch.Tensor]:
    """``batch_size`` random sequences of ``prompt + response`` tokens, the loss on the response."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (batch_size, prompt + response), generator=g)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, prompt:] = True
    return {"ids": ids.to(device), "loss_mask": mask.to(device)}


def timed(fn, steps: int, device: str) -> float:
    """Mean seconds of ``fn()`` over ``steps`` calls after two warm-up calls."""
    for _ in range(2):
        fn()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    sync()
    return (time.perf_counter() - t0) / steps


def profile(kind: str, preset, folder: Path, args: argparse.Namespace) -> dict:
    """Timings of one drafter's training step (feature forward, whole step, step with the features given) and the
    profiler's operator table of one whole step."""
    module, cfg = make_module(kind, preset, folder, args.device)
    module.train()
    opt = torch.optim.AdamW(module.drafter.parameters(), lr=1e-4)
    batch = batch_of(args.batch_size or cfg.batch_size, preset.tokenizer.vocab_size, args.prompt, args.response,
                     args.device)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if args.device == "cuda" else nullcontext())
    with autocast:
        feats, hidden = module.features(batch["ids"])
    cached = {**batch, "feats": feats, "hidden": hidden}

    def step(b: dict[str, torch.Tensor]) -> None:
        with autocast:
            loss = module.training_step(b, 0)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def features() -> None:
        with autocast:
            module.features(batch["ids"])

    module.log = lambda *a, **k: None  # no trainer attached
    out = {"features_s": timed(features, args.steps, args.device),
           "step_s": timed(lambda: step(batch), args.steps, args.device),
           "drafter_s": timed(lambda: step(cached), args.steps, args.device)}
    out["features_share"] = out["features_s"] / out["step_s"]
    activities = [torch.profiler.ProfilerActivity.CPU]
    if args.device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        step(cached)
        if args.device == "cuda":
            torch.cuda.synchronize()
    key = "device_time_total" if args.device == "cuda" else "cpu_time_total"
    out["top_ops"] = prof.key_averages().table(sort_by=key, row_limit=args.top)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=8, help="timed steps after two warm-up steps")
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens a sequence (no loss)")
    ap.add_argument("--response", type=int, default=256, help="response tokens a sequence (the loss)")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="sequences a step (default: the stage's; fewer to read a large preset's shares on a CPU)")
    ap.add_argument("--drafters", default="eagle3,dflash", help="which stages to profile, comma-separated")
    ap.add_argument("--top", type=int, default=15, help="operators listed a drafter")
    ap.add_argument("--json", type=Path, default=None, help="write the timings here too")
    args = ap.parse_args()
    preset = get_preset(args.preset)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "target"
        save_random_target(preset, folder)
        for kind in args.drafters.split(","):
            r = profile(kind, preset, folder, args)
            print(r.pop("top_ops"))
            steps = getattr(preset, kind).max_steps
            print(f"{kind}: step {r['step_s'] * 1e3:.1f} ms, of which the target's feature forward "
                  f"{r['features_s'] * 1e3:.1f} ms ({r['features_share']:.0%}); with the features given "
                  f"{r['drafter_s'] * 1e3:.1f} ms; {steps} steps = {steps * r['step_s']:.0f} s "
                  f"({steps * r['drafter_s']:.0f} s without the feature forwards)")
            results[kind] = {k: round(v, 5) for k, v in r.items()}
    if args.json:
        args.json.write_text(json.dumps({"preset": args.preset, "device": args.device, **results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
