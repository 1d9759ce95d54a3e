"""Evaluation prompt sets: the testbed's held-out split, local JSONL files and named upstream benchmarks.

`--dataset` takes one or more comma-separated sources:

* `testbed:SPLIT` — prompts cut from a built testbed's corpus split (categories: the testbed's);
* a local `.jsonl` file — FastChat records (`turns`, several turns replayed as a conversation),
  or records with `prompt` (text) or `input_ids` (token ids); append `@CATEGORY` to set the
  category, otherwise it comes from the file name when that names a known benchmark
  (`mt_bench.jsonl` -> chat), else the file stem. A record's own free-text `category` field is
  kept as `subcategory` only;
* a named benchmark (`mt-bench`, `alpaca`, `gsm8k`, `math500`, `aime`, `humaneval`, `mbpp`,
  `livecodebench`, `swe-bench-lite`) loaded with `datasets.load_dataset` (needs the Hub).

Samples are grouped by category, shuffled with the seed and taken round-robin across categories
up to `--max-samples`, so every category keeps its share and the chosen ids are reproducible.
"""
from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whiflash.records import UniqueIds, jsonl_records, prompt_text, text_turns, token_ids

log = logging.getLogger(__name__)

__all__ = ["BENCHMARKS", "Sample", "load_samples", "benchmark_category"]


@dataclass(frozen=True)
class Sample:
    """One evaluation prompt: a conversation of user `turns` (text) or fixed `input_ids`."""

    id: str
    category: str
    turns: tuple[str, ...] = ()
    input_ids: tuple[int, ...] | None = None
    subcategory: str = ""
    source: str = ""

    @property
    def n_turns(self) -> int:
        return 1 if self.input_ids is not None else len(self.turns)


@dataclass(frozen=True)
class Benchmark:
    """A named upstream benchmark on the Hub and how to read one prompt from a row."""

    category: str
    repo: str
    split: str
    text: Callable[[dict[str, Any]], list[str]]
    subset: str | None = None
    aliases: tuple[str, ...] = field(default_factory=tuple)


def _field(name: str) -> Callable[[dict[str, Any]], list[str]]:
    return lambda row: [str(row[name])]


BENCHMARKS: dict[str, Benchmark] = {
    "mt-bench": Benchmark("chat", "HuggingFaceH4/mt_bench_prompts", "train", lambda r: [str(t) for t in r["prompt"]],
                          aliases=("mt_bench", "mtbench")),
    "alpaca": Benchmark("chat", "tatsu-lab/alpaca", "train",
                        lambda r: [f"{r['instruction']}\n\n{r['input']}".strip()]),
    "gsm8k": Benchmark("math", "openai/gsm8k", "test", _field("question"), subset="main"),
    "math500": Benchmark("math", "HuggingFaceH4/MATH-500", "test", _field("problem"), aliases=("math-500",)),
    "aime": Benchmark("math", "HuggingFaceH4/aime_2024", "train", _field("problem"), aliases=("aime24",)),
    "humaneval": Benchmark("coding", "openai/openai_humaneval", "test",
                           lambda r: [f"Complete the code I provided.\n\n{r['prompt']}"]),
    "mbpp": Benchmark("coding", "google-research-datasets/mbpp", "test", _field("text"), subset="sanitized"),
    "livecodebench": Benchmark("coding", "livecodebench/code_generation_lite", "test", _field("question_content")),
    "swe-bench-lite": Benchmark("agentic", "princeton-nlp/SWE-bench_Lite", "test", _field("problem_statement"),
                                aliases=("swe-bench", "swebench-lite")),
}
"""Named upstream benchmarks: `--dataset NAME` value -> Hub dataset, split and category."""


def _canonical(name: str) -> str | None:
    key = name.lower().replace("_", "-")
    for canon, bench in BENCHMARKS.items():
        if key == canon or key in (a.replace("_", "-") for a in bench.aliases):
            return canon
    return None


def benchmark_category(name: str) -> str | None:
    """The category (chat/math/coding/agentic) of a benchmark named `name` (any alias or file stem), or None."""
    canon = _canonical(name)
    return BENCHMARKS[canon].category if canon else None


def load_samples(spec: str | list[str], *, testbed: Path | None = None, max_samples: int | None = None,
                 seed: int = 0, testbed_per_category: int = 32) -> list[Sample]:
    """The samples of every source in `spec` (comma-separated string or list), balanced and seeded (see module doc)."""
    sources = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    if not sources:
        raise ValueError("--dataset: no source given")
    pool: list[Sample] = []
    for source in sources:
        per_cat = testbed_per_category if max_samples is None else max(max_samples, 1)
        pool.extend(_read_source(source, testbed, per_cat))
    if not pool:
        raise ValueError(f"--dataset {spec!r} gave no samples")
    return select(pool, max_samples, seed)


def select(pool: list[Sample], max_samples: int | None, seed: int) -> list[Sample]:
    """Seeded shuffle within each category, then round-robin across categories up to `max_samples`."""
    groups: dict[str, list[Sample]] = {}
    for s in pool:
        groups.setdefault(s.category, []).append(s)
    for cat, items in groups.items():
        random.Random(f"{seed}:{cat}").shuffle(items)
    out: list[Sample] = []
    limit = len(pool) if max_samples is None else max_samples
    while len(out) < limit and any(groups.values()):
        for cat in list(groups):
            if groups[cat] and len(out) < limit:
                out.append(groups[cat].pop(0))
    return out


def _read_source(source: str, testbed: Path | None, per_category: int) -> list[Sample]:
    if source.startswith("testbed:"):
        return _read_testbed(source, testbed, per_category)
    path_part, _, category = source.partition("@")
    if path_part.endswith((".jsonl", ".json")) or Path(path_part).is_file():
        return _read_jsonl(Path(path_part), category or None, source)
    canon = _canonical(source)
    if canon is None:
        raise ValueError(f"--dataset {source!r}: not a file, not testbed:SPLIT and not a known benchmark "
                         f"({', '.join(BENCHMARKS)})")
    return _read_hub(canon)


def _read_testbed(source: str, testbed: Path | None, per_category: int) -> list[Sample]:
    from whiflash.testbed import CATEGORIES, held_out_prompts
    from whiflash.testbed.prompts import testbed_split

    split = testbed_split(source if source != "testbed:" else "testbed:test", testbed, "--dataset")  # default: test
    out = [Sample(f"testbed-{split}-{p.id}", cat, (p.prompt,), source=source)
           for cat in CATEGORIES for p in held_out_prompts(testbed, cat, per_category, split=split)]
    if not out:
        raise ValueError(f"--dataset {source!r}: the testbed at {testbed} has no prompts in split {split!r}")
    return out


def _read_jsonl(path: Path, category: str | None, source: str) -> list[Sample]:
    if not path.is_file():
        raise FileNotFoundError(f"--dataset {source!r}: no such file {path}")
    cat = category or benchmark_category(path.stem) or path.stem
    out, ids = [], UniqueIds()
    for line_no, rec in jsonl_records(path):  # fields typed and checked, errors name FILE:LINE
        where = f"{path}:{line_no}"
        sid = f"{path.stem}-{rec.get('question_id', rec.get('id', line_no))}"
        ids.add(sid, where)
        sub = str(rec.get("category") or "")
        if "input_ids" in rec:
            out.append(Sample(sid, cat, input_ids=token_ids(rec, where), subcategory=sub, source=source))
        elif rec.get("turns") is not None:
            out.append(Sample(sid, cat, text_turns(rec, where), subcategory=sub, source=source))
        elif "prompt" in rec:
            out.append(Sample(sid, cat, (prompt_text(rec, where),), subcategory=sub, source=source))
        else:
            raise ValueError(f"{where}: expected a field 'turns', 'prompt' or 'input_ids'")
    return out


def _offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
               for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _read_hub(name: str) -> list[Sample]:
    bench = BENCHMARKS[name]
    hint = (f"--dataset {name}: could not load {bench.repo} from the Hugging Face Hub. Offline, pass a local JSONL "
            f"file instead, e.g. --dataset path/to/{name.replace('-', '_')}.jsonl@{bench.category} with one record "
            "per line holding 'turns' (FastChat), 'prompt' or 'input_ids'")
    if _offline():
        raise RuntimeError(hint + " (offline mode is set: HF_DATASETS_OFFLINE/HF_HUB_OFFLINE)")
    from huggingface_hub import HfApi

    try:  # a quick reachability check, so an unreachable Hub fails at once rather than after retries
        HfApi().dataset_info(bench.repo, timeout=10)
        import datasets

        rows = datasets.load_dataset(bench.repo, bench.subset, split=bench.split)
    except Exception as err:
        raise RuntimeError(f"{hint} ({type(err).__name__}: {err})") from None
    return [Sample(f"{name}-{i}", bench.category, tuple(bench.text(dict(r))), source=name) for i, r in enumerate(rows)]
