"""Prompt sources for datagen: testbed corpus splits and JSONL prompt sets.

A source is `testbed:SPLIT` (prefixes of the testbed corpus split, every category), `testbed:heldout` (per
category, prefixes of the split the drafters did not learn from: `whiflash.testbed.prompts.heldout_split`; what
router data should come from), `testbed:dev` (per category, test-split prefixes from documents the benchmark's
pool does not cut: `whiflash.testbed.prompts.dev_prompts`) or a UTF-8 JSONL file:
FastChat-style records (`question_id`, `category`, `turns`: a list of strings, the first turn is used) or
records with `prompt` (text) or `input_ids` (token ids), each optionally with `id` and `category`. Ids
are unique: a record repeating another's id (or a source listed twice) is refused.

Every source is read, and every prompt checked, before datagen pins its arguments or loads a model;
the pinned record holds the sources' resolved paths and a hash of the prompts they gave
(`prompts_sha256`), so a resume with edited prompts is refused.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from whiflash.records import prompt_records

__all__ = ["PromptItem", "parse_sources", "prompts_sha256", "read_source", "resolve_source"]


@dataclass(frozen=True)
class PromptItem:
    prompt_id: str
    category: str
    text: str | None = None
    input_ids: tuple[int, ...] | None = None
    source: str = ""
    """Where it came from (`FILE:LINE` or the testbed split), for messages; not part of the prompts' hash."""


def parse_sources(prompts: str | list[str]) -> list[str]:
    """The sources of `--prompts`: a list, or one string naming one source or several separated by commas
    (as whiflash-eval's `--dataset`), so `--prompts testbed:train` needs no brackets."""
    sources = [s.strip() for s in prompts.split(",")] if isinstance(prompts, str) else [str(s).strip() for s in prompts]
    sources = [s for s in sources if s]
    if not sources:
        raise ValueError(f"--prompts: expected testbed:SPLIT or a JSONL file (or a list of them), got {prompts!r}")
    return sources


def resolve_source(source: str) -> str:
    """How the pinned record names a source: a file by its absolute, normalised path; `testbed:SPLIT` as is."""
    return source if source.startswith("testbed:") else str(Path(source).resolve())


def prompts_sha256(items: list[PromptItem]) -> str:
    """sha256 of the prompts' ids, categories and content, in order: what the rows depend on."""
    blob = json.dumps([[i.prompt_id, i.category, i.text, list(i.input_ids) if i.input_ids is not None else None]
                       for i in items])
    return hashlib.sha256(blob.encode()).hexdigest()


def read_source(source: str, testbed: Path | None, per_category: int) -> list[PromptItem]:
    """Prompts of one source, in a fixed order (resumption relies on it)."""
    if source.startswith("testbed:"):
        from whiflash.testbed import CATEGORIES, held_out_prompts
        from whiflash.testbed.prompts import DEV, HELDOUT, dev_prompts, heldout_split, testbed_split

        if source in (HELDOUT, DEV) and testbed is None:
            raise ValueError(f"--prompts {source} needs --testbed DIR (a built testbed folder)")
        out = []
        for cat in CATEGORIES:  # testbed:heldout: each category from the split its drafters did not learn from
            if source == DEV:  # the test split's documents outside the benchmark's pool
                split = testbed_split("testbed:test", testbed, "--prompts")
                try:
                    prompts = dev_prompts(testbed, cat, per_category)
                except ValueError as err:
                    raise ValueError(f"--prompts {err}") from None
            else:
                split = testbed_split(f"testbed:{heldout_split(testbed, cat)}" if source == HELDOUT else source,
                                      testbed, "--prompts")
                prompts = held_out_prompts(testbed, cat, per_category, split=split)
            # the id whiflash-eval gives the same prompt (`testbed-SPLIT-DOC@CUT`), so rows and bench samples pair up
            out += [PromptItem(f"testbed-{split}-{p.id}", cat, p.prompt, source=source) for p in prompts]
        return out
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"--prompts {source!r}: no such file (expected a JSONL file or testbed:SPLIT)")
    # the toolkit's one prompt-file reader; a datagen row keeps the first turn, categories default to the stem
    return [PromptItem(r.id, r.category or path.stem, text=r.turns[0] if r.turns is not None else None,
                       input_ids=r.input_ids, source=r.where) for r in prompt_records(path)]
