"""Token streams of the corpus and the random-window sampler used for target training.

Each (split, category) becomes one flat ``uint16``/``int32`` stream in which every document
is followed by ``<|endoftext|>``; training samples random windows from the category streams
with the preset's mixing weights (the raw corpus is code-heavy, so the mix is what balances
the categories).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from .corpus import SPLITS, read_corpus
from .presets import CATEGORIES

__all__ = ["tokenize_corpus", "load_stream", "train_token_counts", "unigram_logprobs", "WindowSampler", "fixed_windows"]

log = logging.getLogger(__name__)


def tokenize_corpus(corpus_dir: Path, tokenizer, out_dir: Path, batch: int = 256) -> dict:
    """Encode every split and category into ``{split}.{category}.npy``; return token counts."""
    out_dir.mkdir(parents=True, exist_ok=True)
    eos = tokenizer.eos_token_id
    dtype = np.uint16 if len(tokenizer) <= 65535 else np.int32
    counts: dict[str, dict[str, int]] = {}
    for split in SPLITS:
        counts[split] = {}
        for cat in CATEGORIES:
            texts = [r["text"] for r in read_corpus(corpus_dir, split, cat)]
            parts: list[np.ndarray] = []
            backend = tokenizer.backend_tokenizer  # the Rust tokenizer: no length warnings, parallel batches
            for i in range(0, len(texts), batch):
                for enc in backend.encode_batch(texts[i:i + batch], add_special_tokens=False):
                    parts.append(np.asarray(enc.ids + [eos], dtype=dtype))
            stream = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
            np.save(out_dir / f"{split}.{cat}.npy", stream)
            counts[split][cat] = int(stream.size)
            log.info("tokens %s/%s: %d", split, cat, stream.size)
    return {"tokens": counts}


def load_stream(tokens_dir: Path, split: str, category: str) -> np.ndarray:
    """One token stream, memory-mapped."""
    return np.load(Path(tokens_dir) / f"{split}.{category}.npy", mmap_mode="r")


def train_token_counts(tokens_dir: Path, vocab_size: int) -> np.ndarray:
    """How often each token id occurs in the training split, all categories together."""
    counts = np.zeros(vocab_size, dtype=np.float64)
    for cat in CATEGORIES:
        counts += np.bincount(np.asarray(load_stream(tokens_dir, "train", cat)), minlength=vocab_size)[:vocab_size]
    return counts


def unigram_logprobs(tokens_dir: Path, vocab_size: int) -> torch.Tensor:
    """Add-one smoothed log-probabilities of the training tokens (the baseline the target must beat)."""
    counts = train_token_counts(tokens_dir, vocab_size) + 1
    return torch.from_numpy(np.log(counts / counts.sum()))


class WindowSampler(torch.utils.data.IterableDataset):
    """Endless random ``seq_len + 1`` windows drawn from the category streams by weight."""

    def __init__(self, tokens_dir: Path, split: str, mix: dict[str, float], seq_len: int, seed: int):
        self.streams = {c: np.asarray(load_stream(tokens_dir, split, c)) for c in CATEGORIES if mix.get(c, 0) > 0}
        for cat, s in self.streams.items():
            if s.size <= seq_len + 1:
                raise ValueError(f"{split}/{cat} has only {s.size} tokens; need more than {seq_len + 1}")
        self.cats = sorted(self.streams)
        w = np.asarray([mix[c] for c in self.cats], dtype=np.float64)
        self.weights = w / w.sum()
        self.seq_len, self.seed = seq_len, seed

    def __iter__(self) -> Iterator[torch.Tensor]:
        rng = np.random.default_rng(self.seed)
        n = self.seq_len + 1
        while True:
            cat = self.cats[rng.choice(len(self.cats), p=self.weights)]
            s = self.streams[cat]
            start = int(rng.integers(0, s.size - n))
            yield torch.from_numpy(s[start:start + n].astype(np.int64))


def fixed_windows(tokens_dir: Path, split: str, category: str, seq_len: int, n: int) -> torch.Tensor:
    """Up to ``n`` evenly spaced non-overlapping ``seq_len + 1`` windows (deterministic evaluation set)."""
    s = np.asarray(load_stream(tokens_dir, split, category))
    w = seq_len + 1
    available = s.size // w
    if available == 0:
        raise ValueError(f"{split}/{category} has only {s.size} tokens")
    idx = np.linspace(0, available - 1, num=min(n, available)).astype(np.int64)
    return torch.from_numpy(np.stack([s[i * w:(i + 1) * w].astype(np.int64) for i in idx]))
