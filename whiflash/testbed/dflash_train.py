"""Train the testbed's DFlash drafter: random-anchor block training with Lightning.

The trained module is ``whiflash.drafters.DFlashDrafter`` itself; its checkpoint is the z-lab
layout (``fc``, ``hidden_norm``, ``layers.{i}.*``, ``norm``; no embedding and no LM head) with
``block_size`` and ``dflash_config.{mask_token_id, target_layer_ids}`` in ``config.json``.

The training forward reproduces ``DFlashDrafter.catch_up``/``block_logits`` for many blocks at
once (SpecForge's recipe; docs/design.md, "Testbed"):

* context: ``hidden_norm(fc(taps))`` of every position, projected by each layer's own
  ``k_proj``/``v_proj`` (with ``k_norm`` and RoPE at the position) -- never through the layers;
* each anchor ``a`` (a response position with a response token after it) opens a block
  ``[x[a], MASK x (b-1)]`` embedded with the target's frozen embedding at positions
  ``a .. a+b-1``; its queries see context keys strictly before ``a`` and every key of their own
  block (non-causal), nothing of other blocks;
* slot ``k`` predicts ``x[a+k]`` (same-position labels) through the target's frozen LM head,
  weighted ``exp(-(k-1)/gamma)`` for ``k >= 1`` (slot 0 has weight 0); loss = weighted mean CE.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F

from .drafter_data import (TargetFeatures, cache_features, load_features, pad_batch, response_samples, sample_loader,
                           tap_layers, with_features)
from .presets import CATEGORIES, DFlashConfig
from .target import Snapshots, adamw_schedule, make_trainer

__all__ = ["dflash_config", "DFlashModule", "sample_anchors", "train_dflash"]

log = logging.getLogger(__name__)


def dflash_config(cfg: DFlashConfig, target_cfg, taps: list[int], mask_token_id: int) -> dict:
    """The z-lab-style ``config.json`` (a Qwen3 config with the DFlash fields)."""
    tc = target_cfg
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": cfg.block_size,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": taps},
        "num_target_layers": tc.num_hidden_layers,
        "num_hidden_layers": cfg.num_hidden_layers,
        "hidden_size": tc.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": tc.num_attention_heads,
        "num_key_value_heads": tc.num_key_value_heads,
        "head_dim": tc.head_dim,
        "rms_norm_eps": tc.rms_norm_eps,
        "rope_theta": tc.rope_theta,
        "max_position_embeddings": tc.max_position_embeddings,
        "vocab_size": tc.vocab_size,
        "layer_types": ["full_attention"] * cfg.num_hidden_layers,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def sample_anchors(loss_mask: torch.Tensor, n: int, generator: torch.Generator | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, up to ``n`` distinct random anchors ``p`` with ``loss_mask[p] & loss_mask[p+1]``, sorted.

    Returns ``anchors [B, n]`` (0 where unused) and ``keep [B, n]`` (False for padding anchors).
    """
    valid = loss_mask[:, :-1] & loss_mask[:, 1:]
    keys = torch.rand(valid.shape, generator=generator, device="cpu").to(valid.device)
    keys = keys.masked_fill(~valid, 2.0)  # invalid positions sort last
    order = keys.argsort(-1)[:, :n]
    keep = torch.gather(valid, 1, order)
    anchors = torch.where(keep, order, torch.full_like(order, loss_mask.shape[1]))
    anchors, idx = anchors.sort(-1)
    keep = torch.gather(keep, 1, idx)
    return torch.where(keep, anchors, torch.zeros_like(anchors)), keep


class DFlashModule(L.LightningModule):
    """Block training of a ``DFlashDrafter`` with the target's embedding and LM head frozen."""

    def __init__(self, drafter, features: TargetFeatures, embed_weight: torch.Tensor, head_weight: torch.Tensor,
                 cfg: DFlashConfig, seed: int = 0):
        super().__init__()
        self.drafter, self.features, self.cfg = drafter, features, cfg
        self.register_buffer("embed_weight", embed_weight.detach().clone(), persistent=False)
        self.register_buffer("head_weight", head_weight.detach().clone(), persistent=False)
        self.gen = torch.Generator().manual_seed(seed)

    def block_loss(self, batch: dict[str, torch.Tensor], anchors: torch.Tensor, keep: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """Weighted CE and argmax hits per block slot ``[bs]`` for the given anchors."""
        d, bs = self.drafter, self.drafter.block_size
        # Kept anchors come first in every row; past the most any row keeps there are only dropped blocks, which
        # nothing attends to and nothing scores.
        used = max(int(keep.sum(1).max()), 1)
        anchors, keep = anchors[:, :used], keep[:, :used]
        batch = with_features(batch, self.features)
        ids, mask = batch["ids"], batch["loss_mask"]
        b, s = ids.shape
        n = anchors.shape[1]
        dev = ids.device
        d.rope.ensure(s + bs + 1, dev)
        ctx = d.hidden_norm(d.fc(batch["feats"].flatten(2).to(d.fc.weight.dtype)))  # [B, S, H]
        offs = torch.arange(bs, device=dev)
        bpos = (anchors[..., None] + offs).reshape(b, n * bs)  # block positions [B, N*bs]
        tok = torch.full((b, n, bs), d.mask_token_id, dtype=torch.long, device=dev)
        tok[..., 0] = torch.gather(ids, 1, anchors)
        x = F.embedding(tok.reshape(b, n * bs), self.embed_weight).to(ctx.dtype)
        # Visibility: context key j < anchor of the query's block; block keys of the same block only (queries of
        # dropped blocks, anchor 0, see only their block; their loss weight is 0).
        q_anchor = anchors.repeat_interleave(bs, dim=1)  # [B, N*bs]
        ctx_vis = torch.arange(s, device=dev)[None, None, :] < q_anchor[..., None]  # [B, N*bs, S]
        vis = _square_mask(ctx_vis, n, bs)
        cpos = torch.arange(s, device=dev)
        for layer in d.layers:
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q = a.q_norm(a.q(h).view(b, n * bs, a.nh, a.hd)).transpose(1, 2)
            q = _rope_rows(d.rope, q, bpos)
            kc = a.k_norm(a.k(ctx).view(b, s, a.nkv, a.hd)).transpose(1, 2)
            kc = d.rope(kc, cpos)
            vc = a.v(ctx).view(b, s, a.nkv, a.hd).transpose(1, 2)
            kb = _rope_rows(d.rope, a.k_norm(a.k(h).view(b, n * bs, a.nkv, a.hd)).transpose(1, 2), bpos)
            vb = a.v(h).view(b, n * bs, a.nkv, a.hd).transpose(1, 2)
            k, v = torch.cat([kc, kb], dim=2), torch.cat([vc, vb], dim=2)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=vis, enable_gqa=True)
            x = x + a.o_proj(out.transpose(1, 2).reshape(b, n * bs, a.nh * a.hd))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        lpos = anchors[..., None] + offs  # label positions [B, N, bs]
        inside = lpos < s
        labels = torch.gather(ids, 1, lpos.clamp(max=s - 1).reshape(b, -1)).view(b, n, bs)
        lmask = torch.gather(mask, 1, lpos.clamp(max=s - 1).reshape(b, -1)).view(b, n, bs)
        decay = torch.exp(-(offs - 1).clamp(min=0).float() / self.cfg.loss_decay_gamma)
        decay[0] = 0.0
        w = decay * (keep[..., None] & inside & lmask).float()
        # The head and the loss on the scored rows only: full-vocabulary logits are a step's largest tensors, and
        # slot 0, labels past a response's end and dropped blocks weigh nothing.
        rows = (w > 0).nonzero(as_tuple=True)
        logits = (d.norm(x.reshape(b, n, bs, -1)[rows]) @ self.head_weight.to(x.dtype).T).float()
        ce = F.cross_entropy(logits, labels[rows], reduction="none")
        loss = (ce * w[rows]).sum() / w.sum().clamp(min=1e-6)
        with torch.no_grad():
            slot = rows[2]
            hits = torch.zeros(bs, device=dev).index_add_(0, slot, (logits.argmax(-1) == labels[rows]).float())
            hit = hits / torch.bincount(slot, minlength=bs).clamp(min=1)
        return loss, hit

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        anchors, keep = sample_anchors(batch["loss_mask"], self.cfg.num_anchors, self.gen)
        loss, hit = self.block_loss(batch, anchors, keep)
        self.log("loss", loss, prog_bar=True)
        self.log("acc1", hit[1], prog_bar=True)
        return loss

    def configure_optimizers(self) -> dict:
        return adamw_schedule(self.drafter, self.cfg.lr, 0.0, max(1, self.cfg.max_steps // 20), self.cfg.max_steps)


def _square_mask(ctx_vis: torch.Tensor, n: int, bs: int) -> torch.Tensor:
    """``[B, 1, N*bs, S + N*bs]``: the context part, then each block's queries on their own block's keys."""
    blk = torch.arange(n, device=ctx_vis.device).repeat_interleave(bs)
    blk_vis = (blk[:, None] == blk[None, :])[None].expand(ctx_vis.shape[0], -1, -1)
    return torch.cat([ctx_vis, blk_vis], dim=-1)[:, None]


def _rope_rows(rope, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """RoPE with per-row positions ``[B, T]`` for ``x [B, heads, T, hd]`` (Rotary takes one ``[T]``)."""
    cos = rope.cos[positions].to(x.dtype)[:, None]
    sin = rope.sin[positions].to(x.dtype)[:, None]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def train_dflash(root: Path, cfg: DFlashConfig, out_dir: Path, *, device: str = "cpu",
                 precision: str = "32-true", seed: int = 0) -> dict:
    """Train on the responses stage and write the checkpoint into ``out_dir``."""
    from whiflash.drafters import build_drafter, write_checkpoint
    from whiflash.runtime import ModelConfig, load_target
    from whiflash.testbed.tokenizer import load_tokenizer

    tc = ModelConfig.from_json(root / "target" / "config.json")
    taps = tap_layers("dflash", tc.num_hidden_layers)
    mask_id = load_tokenizer(root / "target").mask_token_id
    target = load_target(root / "target", device=device)
    samples = response_samples(root, cfg.sequences, cfg.mix, field="dflash.mix")
    pad_id = int(target.config.extra.get("pad_token_id") or 0)
    config = dflash_config(cfg, tc, taps, mask_id)
    torch.manual_seed(seed)
    drafter = build_drafter("dflash", config, target).to(device)
    with torch.no_grad():
        drafter.norm.weight.copy_(target.model.norm.weight)  # the frozen LM head expects the target's scale
    module = DFlashModule(drafter, load_features(root, taps, device), target.model.embed_tokens.weight, target.lm_head.weight, cfg, seed)
    snapshots = Snapshots(out_dir, config, Snapshots.at(cfg.snapshots, cfg.max_steps))
    trainer = make_trainer(cfg.max_steps, device, precision, out_dir / "logs", cfg.max_minutes, stage="dflash",
                           extra=[snapshots])
    cache = cache_features(samples, module.features, cfg.batch_size, bf16=precision.startswith("bf16"),
                           desc="dflash features")
    t0 = time.perf_counter()
    trainer.fit(module, train_dataloaders=sample_loader(samples, cfg.batch_size, pad_id, seed + 1))
    seconds = time.perf_counter() - t0
    drafter = module.drafter.float().cpu()
    write_checkpoint(out_dir, config, drafter.state_dict())
    module.to("cpu")
    acc = {}
    with torch.no_grad():  # per-slot argmax agreement with the target's tokens on training sequences
        for cat in CATEGORIES:
            some = [s for s in samples if s.category == cat][:8]
            if some:
                batch = {k: v.cpu() for k, v in pad_batch(some, pad_id).items()}  # the cache may be on the GPU
                anchors, keep = sample_anchors(batch["loss_mask"], cfg.num_anchors, torch.Generator().manual_seed(0))
                acc[cat] = [round(float(a), 3) for a in module.block_loss(batch, anchors, keep)[1][1:]]
    return {"taps": taps, "mask_token_id": mask_id, "steps": int(trainer.global_step), **cache,
            "train_seconds": round(seconds, 1), "final_loss": float(trainer.callback_metrics.get("loss", float("nan"))),
            "train_acc_per_slot": acc, "sequences": len(samples),
            "response_tokens": int(sum(int(x.loss_mask.sum()) for x in samples)),
            "response_tokens_seen": snapshots.tokens, "snapshots": snapshots.steps}
