"""Prompts cut from corpus documents: held-out evaluation prompts and drafter-training prefixes.

Each category is cut where a user of that kind of model would stop typing:

* math  — ``Question: ...\\nAnswer:`` (the worked solution is the continuation);
* code  — the file up to the end of a ``def``/``class`` header line, before its newline (the body
  follows), keeping at most ``max_chars`` characters of preceding context (a generated module that opens with
  its sample data, ``codegen.has_module_data``, whole);
* prose — the first sentence(s) of a docstring or topic, cut at a word boundary; a chat exchange
  (``chatgen``) at its ``Assistant:`` label (the answer is the continuation);
* agentic — the transcript up to a ``Thought:`` label (the tool list, the task and any earlier
  steps are context; the continuation is prose, then a JSON call and its result).

Choice is seeded and deterministic. A document gives one prompt per pass; further passes (new cuts
of the same documents: another header, another sentence end) are made only when a split has fewer
usable documents than prompts asked for, which is how drafter training gets thousands of code
prefixes out of a few hundred source files.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from .chatgen import ASSISTANT
from .codegen import has_module_data
from .corpus import SPLITS, read_corpus
from .presets import CATEGORIES

__all__ = ["DEV", "DEV_POOL", "HELDOUT", "Prompt", "cut_prompt", "dev_prompts", "held_out_prompts", "eval_prompts",
           "heldout_split", "testbed_split"]

HELDOUT = "testbed:heldout"
"""A prompt source of its own: per category, prompts the drafters never learned from (`heldout_split`)."""
DEV = "testbed:dev"
"""A prompt source of its own: per category, test-split prompts from documents the benchmark's pool does not
cut (`dev_prompts`)."""
DEV_POOL = 80
"""Test prompts a category whose documents `testbed:dev` leaves to the benchmark: `whiflash-eval bench --dataset
testbed:test --max-samples N` draws from a pool of N prompts a category, so any N up to 80 stays disjoint."""

_HEADER = re.compile(r"^[ \t]*(?:async\s+)?(?:def|class)\s+\w+.*:[ \t]*$")


@dataclass(frozen=True)
class Prompt:
    """A prefix of a corpus document and the document's true continuation."""

    id: str
    """``<document id>@<cut offset>``."""
    category: str
    """``code``, ``math`` or ``prose``."""
    prompt: str
    """Text given to the model."""
    reference: str
    """What followed in the document (for inspection; never used by acceptance measurements)."""

    @property
    def document(self) -> str:
        """The id of the document the prompt is cut from."""
        return self.id.rsplit("@", 1)[0]


def cut_prompt(category: str, text: str, rng: random.Random, max_chars: int = 600,
               varied: bool = False) -> tuple[str, str] | None:
    """Split one document into (prompt, reference), or None when it has no sensible cut.

    ``varied`` (later passes over a split's documents) cuts prose after a random sentence end within
    ``max_chars`` instead of the first that fits a third of the text, so a docstring gives several prompts.
    """
    if category == "math":
        i = text.find("\nAnswer:")
        if i < 0:
            return None
        cut = i + len("\nAnswer:")
        return text[:cut], text[cut:]
    if category == "code":
        lines = text.splitlines(keepends=True)
        offsets, pos = [], 0
        for line in lines:
            pos += len(line)
            if _HEADER.match(line) and pos < len(text) - 40:
                # Before the newline: byte-level BPE joins a newline with the next line's indentation
                # ("\n   "), so a prompt ending in a lone "\n" token ends where no training text does.
                offsets.append(pos - len(line) + len(line.rstrip("\r\n")))
        if not offsets:
            return None
        cut = rng.choice(offsets)
        # a generated module that opens with its sample data is kept whole: its examples call that data by name
        start = 0 if has_module_data(text) else max(0, cut - max_chars)
        start = text.find("\n", start) + 1 if start > 0 else 0  # begin on a whole line
        return text[start:cut], text[cut:]
    if category == "agentic":
        labels = [m.end() for m in re.finditer(r"\nThought:", text)][:-1]  # the last one only sums up
        if not labels:
            return None
        cut = rng.choice(labels)
        return text[:cut], text[cut:]
    if category == "prose" and ASSISTANT in text:  # a chat exchange: the user's question, then the answer
        cut = text.rindex(ASSISTANT) + len(ASSISTANT)
        if varied:  # or after a sentence of the answer
            cut = rng.choice([cut] + [m.end() for m in re.finditer(r"[.:!?]\s", text) if cut < m.end() <= len(text) - 40])
        prompt = text[:cut].rstrip()
        return prompt, text[len(prompt):]
    if category == "prose":
        if len(text) < 80:
            return None
        if varied:
            ends = [m.end() for m in re.finditer(r"[.:;!?]\s", text[:max_chars]) if 40 <= m.end() <= len(text) - 40]
            if not ends:
                return None
            prompt = text[:rng.choice(ends)].rstrip()
            return prompt, text[len(prompt):]
        limit = min(max(60, len(text) // 3), max_chars)
        # End after the first sentence that fits, else at the last space before the limit.
        m = None
        for m_ in re.finditer(r"[.:;!?]\s", text[:limit]):
            m = m_
        cut = m.end() if m and m.end() >= 40 else text.rfind(" ", 0, limit) + 1
        if cut <= 0:
            return None
        # No trailing space: byte-level BPE attaches a space to the word after it.
        prompt = text[:cut].rstrip()
        return prompt, text[len(prompt):]
    raise ValueError(f"unknown category {category!r}; expected one of {CATEGORIES}")


def held_out_prompts(testbed_dir: str | Path, category: str, n: int, split: str = "test", seed: int = 0,
                     max_chars: int = 600, max_passes: int = 8, exclude_docs: frozenset[str] = frozenset()
                     ) -> list[Prompt]:
    """Up to ``n`` distinct prompts of one category from one corpus split of a built testbed.

    Documents are visited in a seeded order, one cut each; while fewer than ``n`` prompts exist the
    documents are visited again (at most ``max_passes`` times) for cuts not taken yet. Documents whose id is
    in ``exclude_docs`` are left out.
    """
    if category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}; expected one of {CATEGORIES}")
    docs = list(read_corpus(Path(testbed_dir) / "corpus", split, category))
    rng = random.Random(f"{seed}:{split}:{category}")
    rng.shuffle(docs)
    docs = [d for d in docs if d["id"] not in exclude_docs]
    out: list[Prompt] = []
    seen: set[str] = set()
    for n_pass in range(max_passes):
        grown = len(out)
        for doc in docs:
            if len(out) >= n:
                return out
            cut = cut_prompt(category, doc["text"], rng, max_chars, varied=n_pass > 0)
            if cut is None:
                continue
            prompt, reference = cut
            pid = f"{doc['id']}@{len(doc['text']) - len(reference)}"  # the cut offset: code prompts of one
            # length cut at different headers are different prompts
            if pid not in seen:
                seen.add(pid)
                out.append(Prompt(pid, category, prompt, reference))
        if len(out) == grown:  # no document has a cut left that was not taken
            break
    return out


def dev_prompts(testbed_dir: str | Path, category: str, n: int, seed: int = 0, pool: int = DEV_POOL) -> list[Prompt]:
    """Up to ``n`` prompts of one category (``testbed:dev``) from the test split's documents that none of its
    first ``pool`` prompts (the benchmark's pool, `DEV_POOL`) is cut from. Like the benchmark's prompts they are
    new to the target and both drafters, which no other split is for every category (`heldout_split`), and they
    share no document with them: what router data is tuned on where it should resemble the benchmark.
    ``ValueError`` when no such document is left."""
    taken = frozenset(p.document for p in held_out_prompts(testbed_dir, category, pool, seed=seed))
    out = held_out_prompts(testbed_dir, category, n, seed=seed, exclude_docs=taken)
    if n > 0 and not out:
        raise ValueError(f"{DEV}: the test split's {len(taken)} {category} documents are all cut by the benchmark's "
                         f"pool of {pool} prompts a category; use {HELDOUT} or a preset with a larger corpus")
    return out


def eval_prompts(testbed_dir: str | Path, category: str, n: int, split: str = "test", seed: int = 0) -> list[str]:
    """Held-out evaluation prompts (prefixes from the test split) of one category, as strings."""
    return [p.prompt for p in held_out_prompts(testbed_dir, category, n, split=split, seed=seed)]


def testbed_split(source: str, testbed: str | Path | None, flag: str) -> str:
    """The SPLIT of a prompt source ``testbed:SPLIT`` (datagen's ``--prompts``, eval's ``--dataset``), once the
    split is known and the testbed holds its corpus file; errors name ``flag``, the source and what is expected."""
    split = source.partition(":")[2]
    if split not in SPLITS:
        raise ValueError(f"{flag} {source!r}: unknown testbed split {split!r}; expected one of "
                         f"{', '.join('testbed:' + s for s in SPLITS)} (each gives every category: "
                         f"{', '.join(CATEGORIES)})")
    if testbed is None:
        raise ValueError(f"{flag} {source!r} needs --testbed DIR (a built testbed folder)")
    corpus = Path(testbed) / "corpus" / f"{split}.jsonl"
    if not corpus.is_file():
        why = "no such folder" if not Path(testbed).is_dir() else f"no {corpus}"
        raise FileNotFoundError(f"{flag} {source!r}: --testbed {testbed}: {why} (expected a built testbed: "
                                f"python -m whiflash.testbed build --out {testbed})")
    return split


def heldout_split(testbed: str | Path, category: str, flag: str = "--prompts") -> str:
    """The split of `category` whose prompts neither drafter learned from and no benchmark reads: the responses
    stage continued `train` or `validation` prompts of each category for the drafters' training data (its manifest
    entry says which), so this is the other of the two. Router data from the drafters' own training prompts repeat
    the very continuations the drafters learned (the same prompts, the same greedy tokens): there a drafter
    accepts far more than on any new prompt, and a router learns a world the benchmark does not show. Where the
    drafters learned from validation prompts (`small`'s prose and agentic) this gives train, the split the target
    itself was trained on: no split but test is new to all three models there, and test is the benchmark's."""
    path = Path(testbed) / "manifest.json"
    try:
        used = json.loads(path.read_text())["stages"]["responses"]["per_category"][category]["split"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"{flag} {HELDOUT}: {path} does not say which split the drafters' responses came from for "
                         f"{category} (expected a testbed built through its responses stage)") from None
    return "validation" if used == "train" else "train"
