"""Sharpening: the pre-trained target fine-tuned on its own low-temperature continuations.

A pre-trained language model continues open text (code, prose) with a broad next-token
distribution; instruction tuning is what makes real chat and code models predictable on their own
answers, and that predictability is what speculative decoding feeds on. The testbed's stand-in is
self-distillation: the target samples continuations of prompts at a low temperature (from the training
split, or per category from validation: prompts it never saw, as instruction tuning answers), loops are dropped (a target trained on its own loops becomes a copy machine), and the target is
fine-tuned on them (loss on the continuation tokens only) beside a replayed share of pre-training
windows, which keeps it a language model of the corpus. The figures say what it did: held-out
loss and entropy on corpus windows, and the mean entropy along the target's own greedy
continuations of test prompts, before and after.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F

from .data import WindowSampler
from .drafter_data import repetitive
from .generate import continue_prompts
from .presets import CATEGORIES, SharpenConfig
from .prompts import held_out_prompts

__all__ = ["sharpen_target", "continuation_entropy", "SharpenModule"]

log = logging.getLogger(__name__)


class SharpenModule(L.LightningModule):
    """Continuation-only cross-entropy on self-generated sequences plus replayed pre-training windows."""

    def __init__(self, model: torch.nn.Module, cfg: SharpenConfig, replay: WindowSampler | None) -> None:
        super().__init__()
        self.model, self.cfg = model, cfg
        self._replay = iter(replay) if replay is not None and cfg.replay > 0 else None

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        ids, labels = batch["ids"], batch["labels"]
        logits = self.model(input_ids=ids[:, :-1]).logits.float()
        loss = F.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        self.log("sft_loss", loss, prog_bar=True)
        if self._replay is not None:
            # Half a batch of windows: enough to hold the corpus loss, at half the cost of a pre-training step.
            windows = torch.stack([next(self._replay) for _ in range(max(1, ids.shape[0] // 2))]).to(ids.device)
            replay = self.model(input_ids=windows[:, :-1]).logits.float()
            replay_loss = F.cross_entropy(replay.flatten(0, 1), windows[:, 1:].flatten())
            self.log("replay_loss", replay_loss, prog_bar=True)
            loss = loss + self.cfg.replay * replay_loss
        return loss

    def configure_optimizers(self) -> dict:
        from .target import adamw_schedule

        return adamw_schedule(self.model, self.cfg.lr, 0.0, max(1, self.cfg.steps // 10), self.cfg.steps)


def _collate(rows: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (p, c) in enumerate(rows):
        ids[i, :len(p) + len(c)] = torch.tensor(p + c)
        labels[i, len(p):len(p) + len(c)] = torch.tensor(c)
    return {"ids": ids, "labels": labels}


def _prompt_ids(root: Path, tok, split_of: Callable[[str], str], count_of: Callable[[str], int], max_tokens: int,
                seed: int) -> list[tuple[str, list[int]]]:
    out = []
    for cat in CATEGORIES:
        for p in held_out_prompts(root, cat, count_of(cat), split=split_of(cat), seed=seed, max_passes=64):
            out.append((cat, tok(p.prompt, add_special_tokens=False)["input_ids"][-max_tokens:]))
    return out


@torch.no_grad()
def continuation_entropy(model: torch.nn.Module, root: Path, tok, n: int, new_tokens: int, *,
                         device: str, seed: int = 0) -> dict[str, float]:
    """Per category, the target's mean next-token entropy (nats) along its own greedy continuations of
    ``n`` test prompts: how predictable the target is where drafters draft it."""
    out: dict[str, float] = {}
    bf16 = str(device).startswith("cuda")
    every = _prompt_ids(root, tok, lambda cat: "test", lambda cat: n, 128, seed)
    for cat in CATEGORIES:
        prompts = [ids for c, ids in every if c == cat]
        conts = continue_prompts(model, prompts, new_tokens, eos=tok.eos_token_id, pad_id=tok.pad_token_id,
                                 batch_size=max(1, len(prompts)), bf16=bf16, desc=f"entropy {cat}")
        total, count = 0.0, 0
        for p, c in zip(prompts, conts):
            ids = torch.tensor([p + c], device=device)
            logp = model(input_ids=ids).logits[0, len(p) - 1:-1].float().log_softmax(-1)
            total += float(-(logp.exp() * logp).sum())
            count += len(c)
        out[cat] = round(total / max(1, count), 4)
    return out


def sharpen_target(model_dir: Path, root: Path, cfg: SharpenConfig, mix: dict[str, float], seq_len: int, seed: int,
                   *, device: str = "cpu", precision: str = "32-true") -> dict:
    """Fine-tune the target saved in ``model_dir`` on its own continuations and save it there again."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .target import make_trainer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).to(device)
    figures: dict = {"own_entropy_before": continuation_entropy(model, root, tok, cfg.eval_prompts, 64,
                                                                device=device, seed=seed)}
    t0 = time.perf_counter()
    prompts = _prompt_ids(root, tok, cfg.split_of, cfg.count_of, cfg.max_prompt_tokens, seed)
    conts = continue_prompts(model, [ids for _, ids in prompts], cfg.max_new_tokens, eos=tok.eos_token_id,
                             pad_id=tok.pad_token_id, batch_size=cfg.generate_batch_size,
                             temperature=cfg.temperature, seed=seed, bf16=str(device).startswith("cuda"),
                             desc="sharpen: continuations")
    rows = [(ids, c) for (_, ids), c in zip(prompts, conts) if len(c) >= 2 and not repetitive(c)]
    figures["splits"] = {cat: cfg.split_of(cat) for cat in CATEGORIES}
    figures["generate_seconds"] = round(time.perf_counter() - t0, 1)
    figures["sequences"] = len(rows)
    figures["dropped_repetitive"] = len(prompts) - len(rows)
    figures["continuation_tokens"] = sum(len(c) for _, c in rows)
    if not rows:
        raise RuntimeError(f"sharpen: every one of the {len(prompts)} continuations was repetitive or empty; "
                           f"raise target.sharpen.temperature or lower its max_new_tokens")
    g = torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(rows, batch_size=min(cfg.batch_size, len(rows)), shuffle=True,
                                         drop_last=True, generator=g,
                                         collate_fn=lambda xs: _collate(xs, tok.pad_token_id))
    replay = WindowSampler(root / "tokens", "train", mix, seq_len, seed + 7) if cfg.replay > 0 else None
    module = SharpenModule(model.train(), cfg, replay)
    trainer = make_trainer(cfg.steps, device, precision, model_dir / "logs-sharpen", None, stage="target.sharpen")
    t1 = time.perf_counter()
    trainer.fit(module, train_dataloaders=loader)
    figures["train_seconds"] = round(time.perf_counter() - t1, 1)
    figures["steps"] = int(trainer.global_step)
    model = module.model.float().to(device).eval()
    figures["own_entropy_after"] = continuation_entropy(model, root, tok, cfg.eval_prompts, 64, device=device,
                                                        seed=seed)
    model.cpu().save_pretrained(str(model_dir), safe_serialization=True)
    log.info("sharpen: %s", figures)
    return figures
