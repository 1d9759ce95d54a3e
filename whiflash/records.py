"""Prompt records of JSONL files, read strictly: every error names the file and line and what was expected.

Both prompt readers (``whiflash-datagen --prompts`` and ``whiflash-eval --dataset``) take records with one of
``turns`` (FastChat: a list of user turns), ``prompt`` (text) or ``input_ids`` (token ids), and an optional
``question_id`` or ``id``. A field of the wrong type is refused rather than coerced: a ``turns`` string
would otherwise be iterated as one turn per character. Only the standard library is imported here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whiflash.errors import UsageError

__all__ = ["PromptRecord", "UniqueIds", "jsonl_records", "prompt_records", "prompt_text", "text_turns", "token_ids"]


def jsonl_records(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` of every non-blank line of the JSONL file ``path``; a line that is not UTF-8,
    not JSON or not a JSON object is refused naming ``FILE:LINE``."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise FileNotFoundError(f"{path}: cannot read ({err.strerror or err}); expected a JSONL file") from None
    for line_no, raw in enumerate(data.splitlines(), start=1):
        try:
            line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")  # an editor's byte-order mark is fine
        except UnicodeDecodeError as err:
            raise UsageError(f"{path}:{line_no}: not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1}); "
                             "expected a UTF-8 encoded JSONL file (re-encode it, e.g. iconv -t utf-8)") from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise UsageError(f"{path}:{line_no}: not a JSON record ({err.msg} at column {err.colno})") from None
        if not isinstance(record, dict):
            raise UsageError(f"{path}:{line_no}: expected a JSON object, got {type(record).__name__}")
        yield line_no, record


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def text_turns(record: dict[str, Any], where: str) -> tuple[str, ...]:
    """The ``turns`` of ``record``: a non-empty list of non-empty strings; ``where`` is ``FILE:LINE``."""
    turns = record["turns"]
    if (not isinstance(turns, list) or not turns
            or not all(isinstance(t, str) and t.strip() for t in turns)):
        raise UsageError(f"{where}: field 'turns': expected a non-empty list of non-empty strings (the user turns, "
                         f"e.g. [\"Write a haiku\"]), got {_shown(turns)}")
    return tuple(turns)


def prompt_text(record: dict[str, Any], where: str) -> str:
    """The ``prompt`` of ``record``: non-empty text."""
    text = record["prompt"]
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"{where}: field 'prompt': expected non-empty text, got {text!r}")
    return text


def token_ids(record: dict[str, Any], where: str) -> tuple[int, ...]:
    """The ``input_ids`` of ``record``: a non-empty list of integers >= 0."""
    ids = record["input_ids"]
    if (not isinstance(ids, list) or not ids
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)):
        raise UsageError(f"{where}: field 'input_ids': expected a non-empty list of token ids (integers >= 0), "
                         f"got {_shown(ids)}")
    return tuple(ids)


class UniqueIds:
    """Prompt ids seen so far and where; :meth:`add` refuses one seen before (the rows of two prompts would
    merge under one id, and a repeated prompt would count twice)."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def add(self, prompt_id: str, where: str) -> None:
        if prompt_id in self.seen:
            raise UsageError(f"{where}: prompt id {prompt_id!r} was already given by {self.seen[prompt_id]}; expected "
                             "every record to have its own question_id/id (and every source to be listed once)")
        self.seen[prompt_id] = where


@dataclass(frozen=True)
class PromptRecord:
    """One prompt of a JSONL file, read and checked (`prompt_records`)."""

    id: str
    """``<file stem>-<question_id | id | line number>``, unique in its file."""
    category: str
    """The record's own `category` field ('' when it has none)."""
    where: str
    """``FILE:LINE``, for messages."""
    turns: tuple[str, ...] | None = None
    """The user turns (`turns`, or `prompt` as one turn); None for a token-id prompt."""
    input_ids: tuple[int, ...] | None = None


def prompt_records(path: str | Path) -> list[PromptRecord]:
    """Every prompt of a JSONL file, in file order: FastChat-style `turns`, a `prompt` text or `input_ids`, each
    record optionally with `question_id`/`id` and `category`. A record without any of the three, a field of the
    wrong type or a repeated id is refused, naming its line. The one reader of prompt files: `whiflash-datagen
    --prompts` and `whiflash-eval --dataset` both read through it."""
    path = Path(path)
    out, ids = [], UniqueIds()
    for line_no, rec in jsonl_records(path):
        where = f"{path}:{line_no}"
        pid = f"{path.stem}-{rec.get('question_id', rec.get('id', line_no))}"
        ids.add(pid, where)
        category = str(rec.get("category") or "")
        if "input_ids" in rec:
            out.append(PromptRecord(pid, category, where, input_ids=token_ids(rec, where)))
        elif rec.get("turns") is not None:
            out.append(PromptRecord(pid, category, where, turns=text_turns(rec, where)))
        elif "prompt" in rec:
            out.append(PromptRecord(pid, category, where, turns=(prompt_text(rec, where),)))
        else:
            raise ValueError(f"{where}: expected a field 'turns', 'prompt' or 'input_ids'")
    return out
