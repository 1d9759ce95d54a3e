"""The testbed target: a Qwen3-architecture causal LM pre-trained on the corpus with Lightning.

It is saved with ``save_pretrained`` (``config.json`` + ``model.safetensors`` + tokenizer
files), the same contract as a real Qwen3 checkpoint, so ``whiflash.load_target`` and
``transformers.AutoModelForCausalLM`` both load it. ``evaluate_target`` reports held-out loss
per category against the unigram baseline, plus next-token entropy figures that predict where
a block drafter can win (low entropy) and where it cannot.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from .data import WindowSampler, fixed_windows, unigram_logprobs
from .presets import CATEGORIES, TargetConfig

__all__ = ["qwen3_config", "TargetModule", "train_target", "evaluate_target", "LOW_ENTROPY_NATS", "lr_lambda",
           "make_trainer", "param_groups", "TimeCap", "TimeCapExceeded"]

log = logging.getLogger(__name__)

LOW_ENTROPY_NATS = 0.2
"""Next-token entropy below which a token counts as "near-deterministic" in the figures."""


def qwen3_config(cfg: TargetConfig, tok_info: dict):
    """The ``Qwen3Config`` of the target (vocabulary and special ids from the tokenizer stage)."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=tok_info["vocab_size"],
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        rms_norm_eps=1e-6,
        tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=tok_info["eos_token_id"],
        pad_token_id=tok_info["pad_token_id"],
        use_cache=True,
    )


def lr_lambda(warmup: int, total: int, floor: float = 0.1):
    """Linear warmup, then cosine decay to ``floor`` of the peak."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def param_groups(module: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: decay on matrices, none on norms and biases (1-D tensors)."""
    params = [p for p in module.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def adamw_schedule(module: torch.nn.Module, lr: float, weight_decay: float, warmup: int, max_steps: int) -> dict:
    """Lightning `configure_optimizers` result: AdamW (0.9, 0.95) with per-step warmup + cosine decay."""
    opt = torch.optim.AdamW(param_groups(module, weight_decay), lr=lr, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(warmup, max_steps))
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class TargetModule(L.LightningModule):
    """Next-token pre-training of ``Qwen3ForCausalLM`` on random corpus windows."""

    def __init__(self, hf_config, cfg: TargetConfig, compile_layers: bool = False):
        super().__init__()
        from transformers import Qwen3ForCausalLM

        torch.manual_seed(cfg.seed)
        self.model = Qwen3ForCausalLM(hf_config)
        self.cfg = cfg
        self.compile_layers = compile_layers
        self.compiled = False
        """Whether the decoder layers ran compiled (``compile_layers`` and the trial step compiled)."""

    def _loss(self, batch: torch.Tensor) -> torch.Tensor:
        # no KV cache in training: a cache would make every layer guard on its own slot (one graph per layer)
        logits = self.model(input_ids=batch[:, :-1], use_cache=False).logits
        return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())

    def on_train_start(self) -> None:
        if not self.compile_layers:
            return
        from .compiled import compiled_or_eager

        # one step on a batch of the training shape, under the trainer's autocast: compiles forward and
        # backward here, where a failure can still fall back; its gradients are dropped before step 1
        x = torch.zeros(self.cfg.batch_size, self.cfg.seq_len + 1, dtype=torch.long, device=self.device)

        def trial() -> None:
            with self.trainer.precision_plugin.forward_context():
                loss = self._loss(x)
            loss.backward()

        self.compiled = compiled_or_eager(self.model, trial, "target")
        self.model.zero_grad(set_to_none=True)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        self.log(f"val_loss_{CATEGORIES[dataloader_idx]}", self._loss(batch[0]), add_dataloader_idx=False)

    def configure_optimizers(self) -> dict:
        return adamw_schedule(self.model, self.cfg.lr, self.cfg.weight_decay, self.cfg.warmup_steps, self.cfg.max_steps)


class TimeCapExceeded(RuntimeError):
    """A training stage ran past its wall-clock cap; the build stops instead of shrinking."""


class TimeCap(L.Callback):
    """Stop a build whose training runs past ``minutes``, with a message, instead of silently
    training fewer steps (Lightning's ``max_time``): a testbed must be a function of its preset
    and seed, not of how loaded the machine was."""

    def __init__(self, stage: str, minutes: float, max_steps: int) -> None:
        self.stage, self.minutes, self.max_steps = stage, minutes, max_steps
        self.t0 = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        elapsed = (time.perf_counter() - self.t0) / 60
        if elapsed > self.minutes and trainer.global_step < self.max_steps:
            raise TimeCapExceeded(
                f"{self.stage}: training passed its time cap of {self.minutes:g} min after {trainer.global_step} of "
                f"{self.max_steps} steps; the build stopped rather than train fewer steps. Raise the cap "
                f"(--set+ {self.stage}.max_minutes=...) or remove it (null), or lower {self.stage}.max_steps.")


class Snapshots(L.Callback):
    """Copies of a drafter during training, for a curve of tau against training tokens.

    After the optimiser steps in ``steps`` the drafter (``module.drafter``) is written to
    ``stage_dir/snapshots/step_N`` in the checkpoint layout, with ``snapshot.json``: the steps and the
    response tokens (``loss_mask``) of the batches seen so far; at the end of training the same record
    of the whole run goes to ``stage_dir/snapshot.json``.
    """

    def __init__(self, stage_dir: Path, config: dict, steps: list[int]) -> None:
        self.stage_dir, self.config, self.steps = stage_dir, config, sorted(set(steps))
        self._seen: torch.Tensor | int = 0  # summed on the batches' device: no host read in the step loop

    @property
    def tokens(self) -> int:
        """Response tokens of the batches seen so far."""
        return int(self._seen)

    @staticmethod
    def at(fractions: list[float], max_steps: int) -> list[int]:
        """Step numbers of ``fractions`` of ``max_steps`` (each in (0, 1); at least step 1, before the last)."""
        for f in fractions:
            if not 0 < f < 1:
                raise ValueError(f"snapshots: {f!r} is not a fraction of max_steps in (0, 1)")
        return sorted({min(max_steps - 1, max(1, round(f * max_steps))) for f in fractions} - {0})

    def _record(self, folder: Path, steps: int) -> None:
        (folder / "snapshot.json").write_text(json.dumps({"steps": steps, "response_tokens_seen": self.tokens}) + "\n")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: object,
                           batch: dict, batch_idx: int) -> None:
        self._seen = self._seen + batch["loss_mask"].sum()
        if trainer.global_step in self.steps:
            from whiflash.drafters import write_checkpoint

            folder = self.stage_dir / "snapshots" / f"step_{trainer.global_step}"
            write_checkpoint(folder, self.config, {k: v.detach().float() for k, v in pl_module.drafter.state_dict().items()})
            self._record(folder, trainer.global_step)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.stage_dir.mkdir(parents=True, exist_ok=True)
        self._record(self.stage_dir, trainer.global_step)


def make_trainer(max_steps: int, device: str, precision: str, log_dir: Path, max_minutes: float | None,
                 val_every: int | None = None, grad_clip: float = 1.0, stage: str = "training",
                 extra: list[L.Callback] | None = None) -> L.Trainer:
    """A quiet Lightning trainer with a CSV log and a tqdm progress bar; ``max_minutes`` aborts (``TimeCap``);
    ``extra`` callbacks are added."""
    from lightning.pytorch.callbacks import TQDMProgressBar
    from lightning.pytorch.loggers import CSVLogger

    callbacks: list[L.Callback] = [TQDMProgressBar(refresh_rate=10), *(extra or [])]
    if max_minutes:
        callbacks.append(TimeCap(stage, max_minutes, max_steps))
    return L.Trainer(
        accelerator="gpu" if device.startswith("cuda") else "cpu",
        devices=1,
        precision=precision,
        max_steps=max_steps,
        val_check_interval=val_every,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        limit_val_batches=None if val_every else 0,
        gradient_clip_val=grad_clip,
        logger=CSVLogger(str(log_dir), name="", version=""),
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=callbacks,
        log_every_n_steps=10,
        default_root_dir=str(log_dir),
    )


def train_target(cfg: TargetConfig, tok_info: dict, tokens_dir: Path, tokenizer, out_dir: Path, *,
                 device: str = "cpu", precision: str = "32-true", compile_layers: bool = False) -> dict:
    """Pre-train the target and ``save_pretrained`` it (weights + tokenizer) into ``out_dir``."""
    hf_config = qwen3_config(cfg, tok_info)
    module = TargetModule(hf_config, cfg, compile_layers)
    n_params = sum(p.numel() for p in module.model.parameters())
    log.info("target: %.2fM parameters, %d steps of %dx%d tokens", n_params / 1e6, cfg.max_steps,
             cfg.batch_size, cfg.seq_len)
    train = DataLoader(WindowSampler(tokens_dir, "train", cfg.mix, cfg.seq_len, cfg.seed), batch_size=cfg.batch_size)
    n_val = max(2, cfg.eval_windows // 4)
    vals = [DataLoader(TensorDataset(fixed_windows(tokens_dir, "validation", c, cfg.seq_len, n_val)),
                       batch_size=cfg.batch_size) for c in CATEGORIES]
    val_every = cfg.val_every if 0 < cfg.val_every <= cfg.max_steps else None
    trainer = make_trainer(cfg.max_steps, device, precision, out_dir / "logs", cfg.max_minutes, val_every,
                           stage="target")
    t0 = time.perf_counter()
    trainer.fit(module, train_dataloaders=train, val_dataloaders=vals if val_every else None)
    seconds = time.perf_counter() - t0
    model = module.model.float().cpu().eval()
    model.generation_config.eos_token_id = tok_info["eos_token_id"]
    model.generation_config.pad_token_id = tok_info["pad_token_id"]
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.model_max_length = cfg.max_position_embeddings  # this stage's figure, not the tokenizer stage's
    tokenizer.save_pretrained(str(out_dir))
    steps = int(trainer.global_step)
    return {
        "parameters": n_params,
        "steps": steps,
        "train_seconds": round(seconds, 1),
        "tokens_seen": steps * cfg.batch_size * cfg.seq_len,
        "tokens_per_second": round(steps * cfg.batch_size * cfg.seq_len / max(seconds, 1e-9)),
        "compiled_layers": module.compiled,
        "final_train_loss": float(trainer.callback_metrics.get("train_loss", float("nan"))),
    }


@torch.no_grad()
def evaluate_target(model, tokens_dir: Path, seq_len: int, n_windows: int, batch_size: int = 8,
                    split: str = "test") -> dict:
    """Held-out loss, unigram baseline, top-1 accuracy and entropy figures per category.

    ``model`` is any HF-style causal LM (``model(input_ids=...).logits``). Entropies are in nats;
    ``low_entropy_frac`` is the share of positions below ``LOW_ENTROPY_NATS``.
    """
    model.eval()
    device = next(model.parameters()).device
    unigram = unigram_logprobs(tokens_dir, model.config.vocab_size)
    out: dict[str, dict] = {}
    for cat in CATEGORIES:
        windows = fixed_windows(tokens_dir, split, cat, seq_len, n_windows)
        nll, uni, correct, n = 0.0, 0.0, 0, 0
        ents: list[torch.Tensor] = []
        for i in range(0, windows.shape[0], batch_size):
            batch = windows[i:i + batch_size].to(device)
            logits = model(input_ids=batch[:, :-1]).logits.float()
            logp = logits.log_softmax(-1)
            y = batch[:, 1:]
            nll += float(-logp.gather(-1, y[..., None]).sum())
            uni += float(-unigram[y.cpu()].sum())
            correct += int((logits.argmax(-1) == y).sum())
            ent = -(logp.exp() * logp).sum(-1)
            ents.append(ent.flatten().cpu())
            n += y.numel()
        ent_all = torch.cat(ents)
        ent_sum = float(ent_all.sum())
        low = int((ent_all < LOW_ENTROPY_NATS).sum())
        out[cat] = {
            "loss": round(nll / n, 4),
            "unigram_loss": round(uni / n, 4),
            "top1_acc": round(correct / n, 4),
            "mean_entropy": round(ent_sum / n, 4),
            "median_entropy": round(float(ent_all.median()), 4),
            "low_entropy_frac": round(low / n, 4),
            "tokens": n,
        }
        log.info("target %s/%s: loss %.3f (unigram %.3f), entropy<%.1f on %.0f%% of tokens", split, cat,
                 out[cat]["loss"], out[cat]["unigram_loss"], LOW_ENTROPY_NATS, 100 * out[cat]["low_entropy_frac"])
    return out
