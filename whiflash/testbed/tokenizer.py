"""Byte-level BPE tokenizer for the testbed, saved as a ``transformers`` fast tokenizer.

Special tokens take the first ids (``<|endoftext|>`` = 0 is eos and the document separator,
``<|pad|>``, ``<|mask|>`` reserved for DFlash, ``<|im_start|>``/``<|im_end|>`` reserved for
chat formatting). The corpus neutralises every ``<|`` spelling, so encoding corpus text can
never produce a special token: the target never sees the mask token in training, just as
Qwen3's mask row (151669) is an embedding row the target never saw.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Iterator
from pathlib import Path

from .corpus import read_corpus
from .presets import CATEGORIES, TokenizerConfig

__all__ = ["EOS", "PAD", "MASK", "SPECIAL_TOKENS", "train_tokenizer", "load_tokenizer"]

log = logging.getLogger(__name__)

EOS, PAD, MASK, IM_START, IM_END = "<|endoftext|>", "<|pad|>", "<|mask|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (EOS, PAD, MASK, IM_START, IM_END)
"""Special tokens in id order (ids 0..4)."""


def _balanced_sample(corpus_dir: Path, cfg: TokenizerConfig, seed: int) -> Iterator[str]:
    """Up to ``train_chars_per_category`` characters of training text per category.

    Documents are visited in a seeded shuffled order, so the sample is not biased towards
    the alphabetically first standard-library modules.
    """
    for cat in CATEGORIES:
        texts = [r["text"] for r in read_corpus(corpus_dir, "train", cat)]
        random.Random(f"{seed}:{cat}").shuffle(texts)
        budget = cfg.train_chars_per_category
        for text in texts:
            if budget <= 0:
                break
            chunk = text[:budget]
            budget -= len(chunk)
            yield chunk


def train_tokenizer(corpus_dir: Path, cfg: TokenizerConfig, out_dir: Path, seed: int = 0) -> dict:
    """Train the BPE on a balanced sample of the training split and ``save_pretrained`` it.

    Its ``model_max_length`` is set by the target stage, whose config holds the context length."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Byte-level pre-tokenisation as in GPT-2/Qwen: every byte is representable, no unk token.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_balanced_sample(corpus_dir, cfg, seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=PAD,
        mask_token=MASK,
        additional_special_tokens=[IM_START, IM_END],
        clean_up_tokenization_spaces=False,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    vocab_hash = hashlib.sha256((out_dir / "tokenizer.json").read_bytes()).hexdigest()
    ids = {t: fast.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    log.info("tokenizer: %d tokens, special ids %s", len(fast), ids)
    return {"vocab_size": len(fast), "special_token_ids": ids, "mask_token_id": ids[MASK],
            "eos_token_id": ids[EOS], "pad_token_id": ids[PAD], "tokenizer_sha256": vocab_hash}


def load_tokenizer(path: Path | str):
    """The saved tokenizer (``AutoTokenizer``; never executes remote code)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
