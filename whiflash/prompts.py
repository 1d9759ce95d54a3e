"""Turning prompt text (one or several chat turns) into target token ids, shared by datagen and eval.

With a tokenizer that has a chat template, the conversation is rendered with it (generation prompt
added, thinking off unless asked: templates such as Qwen3's read `enable_thinking`). Without a
template, the turns and replies are concatenated as plain text, separated by blank lines.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["encode_chat", "encode_text"]


def _ids(value: Any) -> list[int]:
    # transformers 5 returns a BatchEncoding/dict from apply_chat_template(tokenize=True) by default
    if isinstance(value, dict) or hasattr(value, "keys"):
        value = value["input_ids"]
    if value and isinstance(value[0], list):
        value = value[0]
    return [int(t) for t in value]


def encode_chat(tokenizer: Any, turns: Sequence[str], replies: Sequence[str] = (), *,
                enable_thinking: bool = False, system: str | None = None) -> list[int]:
    """Token ids for user `turns[i]` answered by `replies[i]` (one fewer reply than turns), ready to generate.

    `replies` are the assistant's earlier answers (eval replays the AR baseline's replies as history).
    """
    if len(replies) != len(turns) - 1:
        raise ValueError(f"expected {len(turns) - 1} earlier replies for {len(turns)} turns, got {len(replies)}")
    if getattr(tokenizer, "chat_template", None):
        messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        for i, turn in enumerate(turns):
            messages.append({"role": "user", "content": turn})
            if i < len(replies):
                messages.append({"role": "assistant", "content": replies[i]})
        kwargs = {"add_generation_prompt": True, "tokenize": True, "return_dict": False}
        try:
            return _ids(tokenizer.apply_chat_template(messages, enable_thinking=enable_thinking, **kwargs))
        except TypeError:  # an old tokenizer that rejects extra template variables
            return _ids(tokenizer.apply_chat_template(messages, **kwargs))
    parts: list[str] = []
    for i, turn in enumerate(turns):
        parts.append(turn)
        if i < len(replies):
            parts.append(replies[i])
    return encode_text(tokenizer, "\n\n".join(parts))


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Plain-text encoding without special tokens (testbed prompts are raw document prefixes)."""
    return _ids(tokenizer(text, add_special_tokens=False)["input_ids"])
