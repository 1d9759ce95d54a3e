"""Drafter training data: the target's own greedy continuations of corpus prefixes (``ResponsesConfig.split``).

The ``responses`` stage stores only token ids (``responses.jsonl``: prompt ids, response ids,
category); target features are recomputed in memory by each drafter stage with our runtime
(``whiflash.runtime.load_target``), which is exactly what the drafters read at inference.
Generation uses ``transformers`` batched greedy decoding; the stage also records how often the
runtime's argmax reproduces the generated tokens (a cross-check of the two forwards).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from whiflash.drafters.dflash import fallback_layer_ids
from whiflash.drafters.eagle3 import default_layer_ids

from .presets import CATEGORIES, ResponsesConfig
from .prompts import held_out_prompts

__all__ = ["generate_responses", "greedy_batch", "load_responses", "Sample", "target_features", "even_layers", "released_taps", "tap_layers",
           "pad_batch", "sample_loader", "to_cpu"]

log = logging.getLogger(__name__)


@torch.no_grad()
def generate_responses(root: Path, cfg: ResponsesConfig, out_dir: Path, *,
                       device: str = "cpu", seed: int = 0) -> dict:
    """Greedy continuations of prompts of every category (from ``cfg.split_of(category)``) -> ``responses.jsonl``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(root / "target"))
    model = AutoModelForCausalLM.from_pretrained(str(root / "target")).to(device).eval()
    eos, pad = tok.eos_token_id, tok.pad_token_id
    rows: list[dict] = []
    stats: dict[str, dict[str, float]] = {}
    for cat in CATEGORIES:
        prompts = held_out_prompts(root, cat, cfg.prompts_per_category, split=cfg.split_of(cat), seed=seed)
        ids = [tok(p.prompt, add_special_tokens=False)["input_ids"][-cfg.max_prompt_tokens:] for p in prompts]
        n_tokens = 0
        for i in tqdm(range(0, len(ids), cfg.batch_size), desc=f"responses {cat}", leave=False):
            batch = ids[i:i + cfg.batch_size]
            width = max(len(x) for x in batch)
            # Left padding so every row's continuation starts at the same column.
            input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in batch], device=device)
            attn = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in batch], device=device)
            gen = greedy_batch(model, input_ids, attn, cfg.max_new_tokens, eos)
            for j, x in enumerate(batch):
                resp = gen[j].tolist()
                if eos in resp:
                    resp = resp[:resp.index(eos) + 1]  # keep the eos: drafters learn to predict it
                rows.append({"id": prompts[i + j].id, "category": cat, "prompt_ids": x, "response_ids": resp})
                n_tokens += len(resp)
        stats[cat] = {"split": cfg.split_of(cat), "prompts": len(ids), "response_tokens": n_tokens}
    with open(out_dir / "responses.jsonl", "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    stats_all = {"per_category": stats, "runtime_argmax_agreement": _runtime_agreement(root, rows, device)}
    log.info("responses: %s", stats_all)
    return stats_all


@torch.no_grad()
def greedy_batch(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 eos: int) -> torch.Tensor:
    """``[B, max_new_tokens]`` greedy continuations of left-padded prompts (KV-cached).

    A plain loop instead of ``model.generate``: on a small CPU model generate's per-step
    bookkeeping costs more than the forward itself. Rows that emitted ``eos`` keep decoding
    (their tail is cut by the caller); the loop stops early once every row has.
    """
    from transformers import DynamicCache

    pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, past_key_values=cache,
                use_cache=True)
    nxt = out.logits[:, -1].argmax(-1)
    tokens = [nxt]
    done = nxt == eos
    for _ in range(max_new_tokens - 1):
        if bool(done.all()):
            break
        attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
        pos = pos[:, -1:] + 1
        out = model(input_ids=nxt[:, None], attention_mask=attention_mask, position_ids=pos,
                    past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1)
        tokens.append(nxt)
        done |= nxt == eos
    return torch.stack(tokens, dim=1)


def load_responses(root: Path) -> list[dict]:
    """Rows of ``responses/responses.jsonl``."""
    with open(Path(root) / "responses" / "responses.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _runtime_agreement(root: Path, rows: list[dict], device: str, n: int = 12) -> float:
    """Share of response tokens that our runtime's greedy argmax reproduces (should be ~1)."""
    from whiflash.runtime import load_target

    target = load_target(root / "target", device=device)
    hits = total = 0
    for row in rows[:: max(1, len(rows) // n)]:
        ids = torch.tensor(row["prompt_ids"] + row["response_ids"], device=device)
        target.setup_cache(ids.numel())
        pred = target.forward(ids, 0).logits.argmax(-1)
        p = len(row["prompt_ids"])
        hits += int((pred[p - 1:-1] == ids[p:]).sum())
        total += ids.numel() - p
    return round(hits / max(1, total), 4)


def even_layers(num_layers: int, n: int) -> list[int]:
    """``n`` tap layers spread evenly over ``0 .. num_layers-1`` (last layer included)."""
    if n == 1:
        return [num_layers - 1]
    return [round(i * (num_layers - 1) / (n - 1)) for i in range(n)]


def released_taps(kind: str, num_layers: int) -> list[int]:
    """Tap layers by the released drafters' rules (docs/design.md, "Testbed"), output-of-layer ids.

    EAGLE-3: SpecForge's default ``[1, N//2 - 1, N - 4]``; DFlash (5 taps): ids spaced evenly from
    1 to ``N - 3`` and rounded, which gives ``[1, 9, 17, 25, 33]`` for Qwen3-8B's 36 layers.
    """
    if kind == "eagle3":
        return default_layer_ids(num_layers)
    if kind == "dflash":
        return fallback_layer_ids(num_layers, 5)
    raise ValueError(f"released_taps: unknown drafter kind {kind!r}; expected 'eagle3' or 'dflash'")


def tap_layers(kind: str, num_layers: int) -> list[int]:
    """The released rule where the target is deep enough for it to give distinct, increasing layers
    (real-depth testbeds); else taps spread evenly with the last layer, the most informative tap a
    shallow target has (3 for EAGLE-3, ``min(5, N)`` for DFlash)."""
    taps = released_taps(kind, num_layers)
    if taps[0] >= 0 and all(a < b for a, b in zip(taps, taps[1:])):  # the last is N - 4 or N - 3
        return taps
    return even_layers(num_layers, 3 if kind == "eagle3" else min(5, num_layers))


@dataclass
class Sample:
    """One training sequence with everything a drafter step needs, on the training device."""

    ids: torch.Tensor
    """``[S]`` prompt + response token ids."""
    loss_mask: torch.Tensor
    """``[S]`` bool, True on response tokens."""
    feats: torch.Tensor
    """``[S, n_taps, H]`` output of each tap layer (`hidden_states[i + 1]`, runtime forward)."""
    hidden: torch.Tensor
    """``[S, H]`` final post-norm hidden state (the teacher's LM-head input)."""
    category: str = ""
    """Corpus category of the prompt."""


@torch.no_grad()
def target_features(root: Path, taps: list[int], device: str = "cpu", dtype: torch.dtype = torch.float32,
                    pack_tokens: int | None = None) -> tuple[list[Sample], object]:
    """Run our runtime over every response sequence once; return samples and the loaded target.

    Sequences are packed up to ``pack_tokens`` tokens per pass (default: 8192 on CUDA, where a
    pass per sequence is launch-bound; none on the CPU, where attention over the packed length
    costs more than it saves): positions restart at 0 for each sequence and a block-diagonal
    causal mask keeps sequences apart, so every feature equals that of a pass over the sequence
    alone.
    """
    from whiflash.runtime import load_target

    target = load_target(root / "target", device=device)
    uniq = tuple(sorted(set(taps)))
    order = [uniq.index(t) for t in taps]
    rows = [r for r in load_responses(root) if len(r["response_ids"]) >= 2]
    pack = pack_tokens if pack_tokens is not None else (8192 if str(device).startswith("cuda") else 0)
    samples: list[Sample] = []
    for group in tqdm(_packs(rows, pack), desc="target features", leave=False):
        seqs = [torch.tensor(r["prompt_ids"] + r["response_ids"], device=device) for r in group]
        sizes = [x.numel() for x in seqs]
        lens = torch.tensor(sizes, device=device)
        ids = torch.cat(seqs)
        seg = torch.repeat_interleave(torch.arange(len(seqs), device=device), lens)
        first = torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens)
        positions = torch.arange(ids.numel(), device=device) - first
        mask = None
        if len(seqs) > 1:
            mask = (seg[:, None] == seg[None, :]) & torch.ones(ids.numel(), ids.numel(), dtype=torch.bool,
                                                                device=device).tril_()
        target.setup_cache(ids.numel())
        out = target.forward(ids, 0, positions=positions, tree_mask=mask, taps=uniq, logits="none")
        for row, x, feats, hidden in zip(group, seqs, out.feats[:, order].split(sizes), out.hidden.split(sizes)):
            loss_mask = torch.zeros(x.numel(), dtype=torch.bool, device=device)
            loss_mask[len(row["prompt_ids"]):] = True
            samples.append(Sample(x, loss_mask, feats.to(dtype), hidden.to(dtype), row["category"]))
    return samples, target


def _packs(rows: list[dict], pack_tokens: int) -> list[list[dict]]:
    """Consecutive rows grouped while their total length stays within ``pack_tokens`` (one row per group
    when ``pack_tokens`` is 0 or a row alone exceeds it)."""
    groups: list[list[dict]] = []
    size = 0
    for row in rows:
        n = len(row["prompt_ids"]) + len(row["response_ids"])
        if groups and size + n <= pack_tokens:
            groups[-1].append(row)
            size += n
        else:
            groups.append([row])
            size = n
    return groups


def pad_batch(samples: list[Sample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of samples into ``[B, S, ...]`` tensors (padding has ``loss_mask`` False)."""
    s = max(x.ids.numel() for x in samples)
    b = len(samples)
    ref = samples[0]
    ids = torch.full((b, s), pad_id, dtype=torch.long, device=ref.ids.device)
    mask = torch.zeros((b, s), dtype=torch.bool, device=ref.ids.device)
    feats = torch.zeros((b, s) + tuple(ref.feats.shape[1:]), dtype=ref.feats.dtype, device=ref.ids.device)
    hidden = torch.zeros((b, s, ref.hidden.shape[-1]), dtype=ref.hidden.dtype, device=ref.ids.device)
    for i, x in enumerate(samples):
        n = x.ids.numel()
        ids[i, :n], mask[i, :n], feats[i, :n], hidden[i, :n] = x.ids, x.loss_mask, x.feats, x.hidden
    return {"ids": ids, "loss_mask": mask, "feats": feats, "hidden": hidden}


def to_cpu(s: Sample) -> Sample:
    """A copy of a sample on the CPU (for the figures computed after training)."""
    return Sample(s.ids.cpu(), s.loss_mask.cpu(), s.feats.cpu(), s.hidden.cpu(), s.category)


def sample_loader(samples: list[Sample], batch_size: int, pad_id: int, seed: int) -> torch.utils.data.DataLoader:
    """Seeded shuffled batches of padded samples (epochs repeat until the step budget is spent)."""
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.DataLoader(samples, batch_size=min(batch_size, len(samples)), shuffle=True,
                                       drop_last=True, generator=g, collate_fn=lambda xs: pad_batch(xs, pad_id))
