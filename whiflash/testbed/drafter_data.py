"""Drafter training data: the target's own greedy continuations of corpus prefixes (``ResponsesConfig.split``).

The ``responses`` stage stores only token ids (``responses.jsonl``: prompt ids, response ids,
category); the drafter stages compute the target's features (``TargetFeatures``) once per sequence before
they train when they fit in memory (``cache_features``), else batch by batch while they train.
Generation is batched (``generate.py``); the stage also records how often the runtime's argmax
reproduces the generated tokens (a cross-check of the two forwards, exact in fp32 and near 1 under
bf16 generation).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

import torch
from tqdm import tqdm

from whiflash.drafters.dflash import fallback_layer_ids
from whiflash.drafters.eagle3 import default_layer_ids

from .presets import CATEGORIES, ResponsesConfig
from .prompts import held_out_prompts

__all__ = ["generate_responses", "repetitive", "load_responses", "Sample", "response_samples", "check_mix",
           "TargetFeatures", "load_features", "with_features", "cache_features", "FEATURE_CACHE_SHARE", "even_layers",
           "released_taps", "tap_layers", "pad_batch", "sample_loader"]

log = logging.getLogger(__name__)


@torch.no_grad()
def generate_responses(root: Path, cfg: ResponsesConfig, out_dir: Path, *,
                       device: str = "cpu", seed: int = 0) -> dict:
    """Greedy continuations of prompts of every category (from ``cfg.split_of(category)``) -> ``responses.jsonl``.

    Batched with a static cache (``generate.continue_prompts``); on a GPU under bf16 autocast, the
    precision the drafters are served in.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .generate import continue_prompts

    tok = AutoTokenizer.from_pretrained(str(root / "target"))
    model = AutoModelForCausalLM.from_pretrained(str(root / "target")).to(device).eval()
    eos, pad = tok.eos_token_id, tok.pad_token_id
    rows: list[dict] = []
    stats: dict[str, dict[str, float]] = {}
    t0 = time.perf_counter()
    for cat in CATEGORIES:
        prompts = held_out_prompts(root, cat, cfg.count_of(cat), split=cfg.split_of(cat), seed=seed,
                                   max_passes=cfg.max_passes)
        ids = [tok(p.prompt, add_special_tokens=False)["input_ids"][-cfg.max_prompt_tokens:] for p in prompts]
        conts = continue_prompts(model, ids, cfg.max_new_tokens, eos=eos, pad_id=pad, batch_size=cfg.batch_size,
                                 bf16=str(device).startswith("cuda"), desc=f"responses {cat}")
        for p, x, resp in zip(prompts, ids, conts):
            rows.append({"id": p.id, "category": cat, "prompt_ids": x, "response_ids": resp})
        stats[cat] = {"split": cfg.split_of(cat), "prompts": len(ids), "response_tokens": sum(map(len, conts)),
                      "repetitive_share": round(sum(map(repetitive, conts)) / max(1, len(conts)), 4)}
    seconds = time.perf_counter() - t0
    with open(out_dir / "responses.jsonl", "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    total = sum(s["response_tokens"] for s in stats.values())
    stats_all = {"per_category": stats, "response_tokens": total, "generate_seconds": round(seconds, 1),
                 "tokens_per_second": round(total / max(seconds, 1e-9)),
                 "runtime_argmax_agreement": _runtime_agreement(root, rows, device)}
    log.info("responses: %s", stats_all)
    return stats_all


def repetitive(tokens: list[int], n: int = 8, min_distinct: float = 0.5) -> bool:
    """Whether a continuation loops: fewer than ``min_distinct`` of its ``n``-grams are distinct.

    Small targets fall into repetition under greedy decoding; such sequences are what a drafter
    accepts whole, so their share is the heavy tail of a benchmark.
    """
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) >= 2 * n and len(set(grams)) < min_distinct * len(grams)


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
    """One training sequence: prompt + response ids and which of them the drafter learns to predict."""

    ids: torch.Tensor
    """``[S]`` prompt + response token ids."""
    loss_mask: torch.Tensor
    """``[S]`` bool, True on response tokens."""
    category: str = ""
    """Corpus category of the prompt."""
    feats: torch.Tensor | None = None
    """``[S, n_taps, H]`` the target's tap outputs, once ``cache_features`` has computed them."""
    hidden: torch.Tensor | None = None
    """``[S, H]`` the target's final post-norm hidden state, with ``feats``."""


def response_samples(root: Path, limit: int | None = None, mix: dict[str, float] | None = None,
                     field: str = "mix") -> list[Sample]:
    """Responses of the ``responses`` stage with at least two tokens, as training sequences.

    ``mix`` (category -> share) redraws them so that each category makes up its share of as many sequences as
    there are responses: a category's responses in file order, repeated where its share asks for more than it
    has (released drafters learn from data sets of their own, EAGLE-3's mostly chat, DFlash's heavy in math and
    code). ``limit`` then keeps that many, taking the categories in turn (so a subset keeps the categories'
    balance); None keeps all, in file order. ``field`` names the option in errors.
    """
    by_cat: dict[str, list[Sample]] = {}
    for row in load_responses(root):
        if len(row["response_ids"]) < 2:
            continue
        ids = torch.tensor(row["prompt_ids"] + row["response_ids"])
        mask = torch.zeros(ids.numel(), dtype=torch.bool)
        mask[len(row["prompt_ids"]):] = True
        by_cat.setdefault(row["category"], []).append(Sample(ids, mask, row["category"]))
    if mix is not None:
        by_cat = _mixed(by_cat, mix, field)
    if limit is None:
        return [s for rows in by_cat.values() for s in rows]
    turns = [s for group in zip_longest(*by_cat.values()) for s in group if s is not None]
    return turns[:limit]


def check_mix(mix: object, field: str) -> None:
    """Raise a ``ValueError`` naming ``field`` unless ``mix`` is None or maps categories to shares >= 0, not all 0."""
    if mix is None:
        return
    if not isinstance(mix, dict) or not mix:
        raise ValueError(f"{field}: expected a mapping of category to share, e.g. {{\"prose\": 0.7, \"code\": 0.3}}, "
                         f"got {mix!r}")
    unknown = sorted(set(mix) - set(CATEGORIES))
    bad = [v for v in mix.values() if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < math.inf]
    if unknown or bad or sum(mix.values()) <= 0:
        raise ValueError(f"{field}: expected shares >= 0 (not all 0) of the categories {list(CATEGORIES)}, got "
                         f"{mix!r}" + (f" (unknown: {unknown})" if unknown else ""))


def _mixed(by_cat: dict[str, list[Sample]], mix: dict[str, float], field: str) -> dict[str, list[Sample]]:
    """``by_cat`` redrawn to the shares of ``mix`` (see ``response_samples``)."""
    check_mix(mix, field)
    empty = sorted(c for c, share in mix.items() if share > 0 and not by_cat.get(c))
    if empty:
        raise ValueError(f"{field}: the responses hold no sequence of {empty}, which have a share")
    total, weight = sum(len(rows) for rows in by_cat.values()), sum(mix.values())
    return {c: [by_cat[c][i % len(by_cat[c])] for i in range(round(total * share / weight))]
            for c, share in mix.items() if share > 0}


class TargetFeatures(torch.nn.Module):
    """The frozen target's tap-layer outputs and final post-norm hidden state for a padded batch.

    Computed on the fly in every drafter training step (one target forward per batch) instead of once
    for every response token beforehand, which at millions of tokens would not fit in memory. Taps
    follow ``TAP_CONVENTION``: tap ``i`` is transformers' ``hidden_states[i + 1]``, the output of
    layer ``i`` (for the last layer the post-final-norm state). Batches are right-padded, so under the
    causal mask padding never reaches a real token. On a GPU, under the build's bf16 autocast, the
    features are bf16, as a drafter reads them when it is served in bf16; on a CPU they are fp32.
    """

    def __init__(self, model: torch.nn.Module, taps: list[int]) -> None:
        super().__init__()
        self.model = model.eval().requires_grad_(False)
        self.taps = list(taps)

    def train(self, mode: bool = True) -> TargetFeatures:
        return super().train(False)  # the frozen target stays in eval mode inside a training module

    @torch.no_grad()
    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``ids [B, S]`` -> (``[B, S, n_taps, H]`` tap outputs, ``[B, S, H]`` final post-norm hidden state)."""
        # On a CPU the features stay fp32 (bf16 autocast is emulated, and slow, on CPUs without bf16 units).
        with torch.autocast("cpu", enabled=False) if ids.device.type == "cpu" else nullcontext():
            out = self.model.model(input_ids=ids, output_hidden_states=True, use_cache=False)
        states = out.hidden_states
        return torch.stack([states[t + 1] for t in self.taps], dim=2), out.last_hidden_state


def load_features(root: Path, taps: list[int], device: str = "cpu") -> TargetFeatures:
    """``TargetFeatures`` of the testbed's target (``transformers`` weights, the same checkpoint the runtime loads)."""
    from transformers import AutoModelForCausalLM

    return TargetFeatures(AutoModelForCausalLM.from_pretrained(str(root / "target")).to(device), taps)


def with_features(batch: dict[str, torch.Tensor], features: TargetFeatures) -> dict[str, torch.Tensor]:
    """``batch`` with ``feats`` and ``hidden`` from the target added (when it has none yet)."""
    if "feats" not in batch:
        batch = dict(batch)
        batch["feats"], batch["hidden"] = features(batch["ids"])
    return batch


FEATURE_CACHE_SHARE = 0.5
"""``cache_features`` keeps the features when they take at most this share of the free device memory (CUDA) or
of the machine's memory (CPU); beyond it the drafters compute them batch by batch."""


def _memory_for_cache(device: torch.device) -> int:
    """Bytes the feature cache may take on ``device`` (``FEATURE_CACHE_SHARE`` of what is free there; on CUDA what
    torch's allocator holds unused counts as free: the stage before may have left it reserved)."""
    if device.type == "cuda":
        unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(FEATURE_CACHE_SHARE * (torch.cuda.mem_get_info(device)[0] + unused))
    return int(FEATURE_CACHE_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


@torch.no_grad()
def cache_features(samples: list[Sample], features: TargetFeatures, batch_size: int, bf16: bool = False,
                   desc: str = "features") -> dict:
    """Compute every distinct sample's features once, in length-sorted batches, onto the target's device.

    A drafter stage reads each sequence ``steps * batch_size / len(samples)`` times (two to ten epochs), and on
    the fly every read is a full forward of the deep target: that forward was 15-42% of a drafter step
    (``scripts/profile_drafter_step.py``). ``bf16``: under bf16 autocast on CUDA, as the training step would be,
    and kept in bf16 (the drafter's autocast matmuls read them in bf16 either way; on a CPU they stay fp32). Skipped,
    and the features left to the training steps, when they would take more than ``FEATURE_CACHE_SHARE`` of
    the memory there. Samples repeated by a mix are computed once. Returns the figures for the stage's record.
    """
    device = next(features.model.parameters()).device
    distinct = list({id(s): s for s in samples}.values())
    positions = sum(s.ids.numel() for s in distinct)
    width = (len(features.taps) + 1) * features.model.config.hidden_size
    dtype = torch.bfloat16 if bf16 and device.type == "cuda" else torch.float32
    nbytes = positions * width * dtype.itemsize
    budget = _memory_for_cache(device)
    figures = {"feature_cache_gb": round(nbytes / 2**30, 2), "feature_cache_budget_gb": round(budget / 2**30, 2)}
    if nbytes > budget:
        log.warning("%s: the target's features of %d sequences take %.1f GiB, more than %.0f%% of the %s memory "
                    "free (%.1f GiB allowed): computed in every training step instead", desc, len(distinct),
                    nbytes / 2**30, 100 * FEATURE_CACHE_SHARE, device.type, budget / 2**30)
        return {**figures, "features_cached": False}
    t0 = time.perf_counter()
    order = sorted(distinct, key=lambda s: s.ids.numel())
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 and device.type == "cuda" else nullcontext()
    for i in tqdm(range(0, len(order), batch_size), desc=desc, leave=False):
        group = order[i:i + batch_size]
        with autocast:
            feats, hidden = features(pad_batch(group, 0)["ids"].to(device))
        for row, s in enumerate(group):
            n = s.ids.numel()
            s.feats, s.hidden = feats[row, :n].to(dtype, copy=True), hidden[row, :n].to(dtype, copy=True)
    return {**figures, "features_cached": True, "feature_seconds": round(time.perf_counter() - t0, 1)}


def pad_batch(samples: list[Sample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of samples into ``[B, S]`` tensors (padding has ``loss_mask`` False), with their cached
    features (zero on padding, which no real position reads: attention is causal, the loss masked)."""
    s = max(x.ids.numel() for x in samples)
    ids = torch.full((len(samples), s), pad_id, dtype=torch.long)
    mask = torch.zeros((len(samples), s), dtype=torch.bool)
    for i, x in enumerate(samples):
        ids[i, :x.ids.numel()], mask[i, :x.ids.numel()] = x.ids, x.loss_mask
    batch = {"ids": ids, "loss_mask": mask}
    if all(x.feats is not None for x in samples):
        first = samples[0]
        feats = first.feats.new_zeros((len(samples), s, *first.feats.shape[1:]))
        hidden = first.hidden.new_zeros((len(samples), s, first.hidden.shape[-1]))
        for i, x in enumerate(samples):
            feats[i, :x.ids.numel()], hidden[i, :x.ids.numel()] = x.feats, x.hidden
        batch |= {"feats": feats, "hidden": hidden}
    return batch


def sample_loader(samples: list[Sample], batch_size: int, pad_id: int, seed: int) -> torch.utils.data.DataLoader:
    """Seeded shuffled batches of padded samples (epochs repeat until the step budget is spent)."""
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.DataLoader(samples, batch_size=min(batch_size, len(samples)), shuffle=True,
                                       drop_last=True, generator=g, collate_fn=lambda xs: pad_batch(xs, pad_id))
