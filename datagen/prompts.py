"""Prompt sources for datagen: testbed corpus splits and JSONL prompt sets.

A source is `testbed:SPLIT` (prefixes of the testbed corpus split, every category) or a JSONL file:
FastChat-style records (`question_id`, `category`, `turns`: the first turn is used) or records with
`prompt` (text) or `input_ids` (token ids), each optionally with `id` and `category`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PromptItem:
    prompt_id: str
    category: str
    text: str | None = None
    input_ids: tuple[int, ...] | None = None


def read_source(source: str, testbed: Path | None, per_category: int) -> list[PromptItem]:
    """Prompts of one source, in a fixed order (resumption relies on it)."""
    if source.startswith("testbed:"):
        if testbed is None:
            raise ValueError(f"prompt source {source!r} needs --testbed DIR")
        from whiflash.testbed import CATEGORIES, held_out_prompts

        split = source.split(":", 1)[1]
        return [PromptItem(f"testbed-{split}-{cat}-{i}", cat, p.prompt)
                for cat in CATEGORIES for i, p in enumerate(held_out_prompts(testbed, cat, per_category, split=split))]
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"prompt source {source!r}: no such file (expected a JSONL file or testbed:SPLIT)")
    items = []
    for line_no, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec: dict[str, Any] = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{line_no}: not a JSON record ({err.msg})") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{path}:{line_no}: expected a JSON object, got {type(rec).__name__}")
        pid = f"{path.stem}-{rec.get('question_id', rec.get('id', line_no))}"
        cat = str(rec.get("category") or path.stem)
        if "input_ids" in rec:
            items.append(PromptItem(pid, cat, input_ids=tuple(int(t) for t in rec["input_ids"])))
        elif rec.get("turns"):
            items.append(PromptItem(pid, cat, text=str(rec["turns"][0])))
        elif "prompt" in rec:
            items.append(PromptItem(pid, cat, text=str(rec["prompt"])))
        else:
            raise ValueError(f"{path}:{line_no}: expected a field 'turns', 'prompt' or 'input_ids'")
    return items
