"""Train the testbed's EAGLE-3 drafter: training-time-test (TTT) unrolling with Lightning.

The trained module is ``whiflash.drafters.Eagle3Drafter`` itself, so the checkpoint is written
from its own ``state_dict`` in the SpecForge layout (flat ``fc``/``midlayer.*``/``norm``/
``lm_head`` + ``d2t``/``t2d``, no embedding) and loads with ``whiflash.load_drafter``.

The training forward reproduces the inference math (``Eagle3Drafter.catch_up``/``propose``):

* row ``t`` of step 0 reads the fused true target feature at ``t`` and the token ``x[t+1]``,
  at RoPE position ``t``; its attention is causal over the step-0 rows;
* row ``t`` of step ``k >= 1`` reads the drafter's own pre-norm output of step ``k-1`` at ``t``
  and the token ``x[t+1+k]`` (teacher forcing: on the target's greedy responses this is the
  token an accepted chain feeds), at position ``t+k``; it additionally sees the "diagonal" keys
  of steps ``1..k`` at the same ``t`` -- exactly the speculative rows of a chain at inference;
* step ``k`` predicts ``x[t+2+k]``: soft cross-entropy to the target's distribution at
  ``t+1+k`` restricted to the draft vocabulary and renormalised, positions whose target argmax
  lies outside the draft vocabulary dropped, step weight ``step_decay**k``.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F

from .drafter_data import (Sample, TargetFeatures, cache_features, load_features, pad_batch, response_samples,
                           sample_loader, tap_layers, with_features)
from .presets import CATEGORIES, Eagle3Config
from .target import Snapshots, adamw_schedule, make_trainer

__all__ = ["build_draft_vocab", "eagle3_config", "Eagle3Module", "train_eagle3"]

log = logging.getLogger(__name__)


def build_draft_vocab(samples: list[Sample], root: Path, vocab_size: int, draft_vocab_size: int
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(used ids ascending, d2t offsets, t2d mask) from response-token frequencies.

    Ties and the tail are filled from the training corpus unigram counts, so a short response
    set still yields a full-size vocabulary of plausible tokens (SpecForge pads with ids 0..).
    """
    from .data import train_token_counts

    counts = np.zeros(vocab_size, dtype=np.float64)
    for s in samples:
        counts += np.bincount(s.ids[s.loss_mask].cpu().numpy(), minlength=vocab_size)
    corpus = train_token_counts(root / "tokens", vocab_size)
    score = counts * (corpus.sum() + 1) + corpus  # response frequency first, corpus frequency breaks ties
    used = np.sort(np.argsort(-score, kind="stable")[:draft_vocab_size])
    used_t = torch.from_numpy(used).long()
    d2t = used_t - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used_t] = True
    return used_t, d2t, t2d


def eagle3_config(cfg: Eagle3Config, target_cfg, taps: list[int]) -> dict:
    """The SpecForge-style ``config.json`` of the drafter (Llama block, one layer)."""
    tc = target_cfg
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": tc.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": tc.num_attention_heads,
        "num_key_value_heads": tc.num_key_value_heads,
        "head_dim": tc.head_dim,
        "num_hidden_layers": 1,
        "rms_norm_eps": tc.rms_norm_eps,
        "rope_theta": tc.rope_theta,
        "max_position_embeddings": tc.max_position_embeddings,
        "vocab_size": tc.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": tc.hidden_size,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": taps},
    }


def _shift(x: torch.Tensor, k: int, fill) -> torch.Tensor:
    """``out[:, t] = x[:, t + k]``, ``fill`` past the end."""
    if k == 0:
        return x
    pad = torch.full_like(x[:, :k], fill)
    return torch.cat([x[:, k:], pad], dim=1)


class Eagle3Module(L.LightningModule):
    """TTT training of an ``Eagle3Drafter`` against frozen target embedding and LM head."""

    def __init__(self, drafter, features: TargetFeatures, embed_weight: torch.Tensor, head_weight: torch.Tensor,
                 used: torch.Tensor, cfg: Eagle3Config, pad_id: int):
        super().__init__()
        self.drafter, self.features, self.cfg, self.pad_id = drafter, features, cfg, pad_id
        self.register_buffer("embed_weight", embed_weight.detach().clone(), persistent=False)
        self.register_buffer("head_weight", head_weight.detach().clone(), persistent=False)
        self.register_buffer("used", used.clone(), persistent=False)

    def ttt(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[float]]:
        d, cfg = self.drafter, self.cfg
        layer, attn = d.midlayer, d.midlayer.self_attn
        batch = with_features(batch, self.features)
        ids, mask = batch["ids"], batch["loss_mask"]
        b, s = ids.shape
        with torch.no_grad():
            full = batch["hidden"].float() @ self.head_weight.float().T  # target logits [B, S, V]
            in_vocab = d.t2d[full.argmax(-1)]
            teacher = full[..., self.used].softmax(-1)  # restricted and renormalised
        feature = d.fuse(batch["feats"].flatten(2).to(d.fc.weight.dtype))
        pos = torch.arange(s, device=ids.device)
        d.rope.ensure(s + cfg.ttt_length + 1, ids.device)
        rep = attn.nh // attn.nkv
        scale = 1.0 / math.sqrt(attn.hd)
        causal = torch.ones(s, s, dtype=torch.bool, device=ids.device).tril_()
        k0 = v0 = None
        diag: list[tuple[torch.Tensor, torch.Tensor]] = []
        total = feature.new_zeros((), dtype=torch.float32)
        hits: list[torch.Tensor] = []
        for k in range(cfg.ttt_length):
            tok = _shift(ids, k + 1, self.pad_id)
            normed = layer.hidden_norm(feature)
            x = torch.cat([layer.input_layernorm(F.embedding(tok, self.embed_weight)), normed], dim=-1)
            residual = normed if d.cfg.get("norm_before_residual") else feature
            q = d.rope(attn.q(x).view(b, s, attn.nh, attn.hd).transpose(1, 2), pos + k)
            kk = d.rope(attn.k(x).view(b, s, attn.nkv, attn.hd).transpose(1, 2), pos + k)
            vv = attn.v(x).view(b, s, attn.nkv, attn.hd).transpose(1, 2)
            kk, vv = kk.repeat_interleave(rep, dim=1), vv.repeat_interleave(rep, dim=1)  # SDPA's GQA grouping
            if k == 0:
                k0, v0 = kk, vv
            else:
                diag.append((kk, vv))
            scores = [(q @ k0.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))]
            scores += [(q * dk).sum(-1, keepdim=True) * scale for dk, _ in diag]
            probs = torch.cat(scores, dim=-1).float().softmax(-1).to(q.dtype)
            out = probs[..., :s] @ v0
            for j, (_, dv) in enumerate(diag):
                out = out + probs[..., s + j:s + j + 1] * dv
            h = residual + attn.o_proj(out.transpose(1, 2).reshape(b, s, attn.nh * attn.hd))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            # The head and the loss only on the rows step k is scored on (the response's; ~half of a sequence):
            # the rows' logits are a step's largest tensors.
            rows = (_shift(mask, k + 2, False) & _shift(in_vocab, k + 1, False)).nonzero(as_tuple=True)
            hv = h[rows]
            logits = d.lm_head(d.norm(hv) if d.cfg.get("norm_output", True) else hv).float()
            p = teacher[rows[0], rows[1] + k + 1]
            n = max(len(hv), 1)
            ce = -(p * logits.log_softmax(-1)).sum(-1)
            total = total + (cfg.step_decay ** k) * ce.sum() / n
            with torch.no_grad():
                hits.append((logits.argmax(-1) == p.argmax(-1)).sum() / n)
            feature = h  # the pre-norm output feeds the next step, as in propose()
        return total, torch.stack(hits).tolist()  # one transfer for every step's accuracy

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, accs = self.ttt(batch)
        self.log("loss", loss, prog_bar=True)
        self.log("acc0", accs[0], prog_bar=True)
        return loss

    def configure_optimizers(self) -> dict:
        return adamw_schedule(self.drafter, self.cfg.lr, 0.0, max(1, self.cfg.max_steps // 20), self.cfg.max_steps)


def train_eagle3(root: Path, cfg: Eagle3Config, out_dir: Path, *, device: str = "cpu",
                 precision: str = "32-true", seed: int = 0) -> dict:
    """Train on the responses stage and write the checkpoint into ``out_dir``."""
    from whiflash.drafters import build_drafter, write_checkpoint
    from whiflash.runtime import ModelConfig, load_target

    tc = ModelConfig.from_json(root / "target" / "config.json")
    taps = tap_layers("eagle3", tc.num_hidden_layers)
    target = load_target(root / "target", device=device)
    samples = response_samples(root, cfg.sequences, cfg.mix, field="eagle3.mix")
    pad_id = int(target.config.extra.get("pad_token_id") or 0)
    used, d2t, t2d = build_draft_vocab(samples, root, tc.vocab_size, cfg.draft_vocab_size)
    config = eagle3_config(cfg, tc, taps)
    torch.manual_seed(seed)
    drafter = build_drafter("eagle3", config, target)
    drafter.d2t.copy_(d2t)
    drafter.t2d.copy_(t2d)
    with torch.no_grad():  # start from the target's own output head restricted to the draft vocabulary
        drafter.lm_head.weight.copy_(target.lm_head.weight[used])
        drafter.norm.weight.copy_(target.model.norm.weight)
    drafter.to(device)
    module = Eagle3Module(drafter, load_features(root, taps, device), target.model.embed_tokens.weight, target.lm_head.weight, used.to(device),
                          cfg, pad_id)
    snapshots = Snapshots(out_dir, config, Snapshots.at(cfg.snapshots, cfg.max_steps))
    trainer = make_trainer(cfg.max_steps, device, precision, out_dir / "logs", cfg.max_minutes, stage="eagle3",
                           extra=[snapshots])
    cache = cache_features(samples, module.features, cfg.batch_size, bf16=precision.startswith("bf16"),
                           desc="eagle3 features")
    t0 = time.perf_counter()
    trainer.fit(module, train_dataloaders=sample_loader(samples, cfg.batch_size, pad_id, seed))
    seconds = time.perf_counter() - t0
    drafter = module.drafter.float().cpu()
    write_checkpoint(out_dir, config, drafter.state_dict())
    module.to("cpu")
    acc = {}
    with torch.no_grad():  # per-step argmax agreement with the target on training sequences
        for cat in CATEGORIES:
            some = [s for s in samples if s.category == cat][:8]
            if some:
                batch = {k: v.cpu() for k, v in pad_batch(some, pad_id).items()}  # the cache may be on the GPU
                acc[cat] = [round(a, 3) for a in module.ttt(batch)[1]]
    return {"taps": taps, "steps": int(trainer.global_step), "train_seconds": round(seconds, 1), **cache,
            "final_loss": float(trainer.callback_metrics.get("loss", float("nan"))),
            "train_acc_per_step": acc, "draft_vocab_size": cfg.draft_vocab_size, "sequences": len(samples),
            "response_tokens": int(sum(int(x.loss_mask.sum()) for x in samples)),
            "response_tokens_seen": snapshots.tokens, "snapshots": snapshots.steps}

