"""Evaluation prompt sets: the testbed's held-out split, local JSONL files and named upstream benchmarks.

`--dataset` takes one or more comma-separated sources:

* `testbed:SPLIT` — prompts cut from a built testbed's corpus split (categories: the testbed's);
* a local `.jsonl` file — FastChat records (`turns`, several turns replayed as a conversation),
  or records with `prompt` (text) or `input_ids` (token ids); append `@CATEGORY` to set the
  category, otherwise it comes from the file name when that names a known benchmark
  (`mt_bench.jsonl` -> chat), else the file stem. A record's own free-text `category` field is
  kept as `subcategory` only;
* a named benchmark (`whiflash.eval.benchmarks.BENCHMARKS`: upstream's names, repositories and
  prompt texts) loaded with `datasets.load_dataset` (needs the Hub).

`--max-samples N` keeps N rows of every source by upstream's rule, and a testbed split N prompts in
equal shares per category (`whiflash.eval.selection`); what each source kept is a `SourceSelection`.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path

from . import benchmarks
from .benchmarks import BENCHMARKS, canonical
from .selection import SourceSelection, balanced, upstream_indices

from whiflash.records import prompt_records

log = logging.getLogger(__name__)

__all__ = ["BENCHMARKS", "Sample", "benchmark_category", "load_samples", "load_selection"]


@dataclass(frozen=True)
class Sample:
    """One evaluation prompt: a conversation of user `turns` (text) or fixed `input_ids`."""

    id: str
    category: str
    turns: tuple[str, ...] = ()
    input_ids: tuple[int, ...] | None = None
    subcategory: str = ""
    source: str = ""
    """The `--dataset` entry it came from, as given."""
    dataset: str = ""
    """The dataset's name in tables: the benchmark's upstream name, the file stem or `testbed:SPLIT`."""
    row: int | None = None
    """Its row in the source, in the source's own order (a benchmark's row, a JSONL record, a testbed prompt)."""

    @property
    def n_turns(self) -> int:
        return 1 if self.input_ids is not None else len(self.turns)


def benchmark_category(name: str) -> str | None:
    """The category (chat/math/coding/agentic) of a benchmark named `name` (any alias or file stem), or None."""
    canon = canonical(name)
    return BENCHMARKS[canon].category if canon else None


def load_samples(spec: str | list[str], *, testbed: Path | None = None, max_samples: int | None = None,
                 seed: int = 0, testbed_per_category: int = 32) -> list[Sample]:
    """The samples `load_selection` keeps, in decoding order."""
    return load_selection(spec, testbed=testbed, max_samples=max_samples, seed=seed,
                          testbed_per_category=testbed_per_category)[0]


def load_selection(spec: str | list[str], *, testbed: Path | None = None, max_samples: int | None = None,
                   seed: int = 0, testbed_per_category: int = 32) -> tuple[list[Sample], list[SourceSelection]]:
    """The samples of every source in `spec` (comma-separated string or list), each source's own selection of
    `max_samples` (see the module doc; a testbed split without it gives `testbed_per_category` per category),
    and what each source kept."""
    sources = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    if not sources:
        raise ValueError("--dataset: no source given")
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"--max-samples: expected an integer >= 1, got {max_samples}")
    samples: list[Sample] = []
    selections: list[SourceSelection] = []
    seen: dict[str, str] = {}
    for source in sources:
        kept, sel = _select_source(source, testbed, max_samples, seed, testbed_per_category)
        for s in kept:
            if s.id in seen:  # rows are keyed by sample id: a second copy would pass for the first on resume
                raise ValueError(f"--dataset: sources {seen[s.id]!r} and {source!r} both give sample id {s.id!r}; "
                                 "expected every source once")
            seen[s.id] = source
        samples += kept
        selections.append(sel)
    if not samples:
        raise ValueError(f"--dataset {spec!r} gave no samples")
    return samples, selections


def _select_source(source: str, testbed: Path | None, max_samples: int | None, seed: int,
                   per_category: int) -> tuple[list[Sample], SourceSelection]:
    """The samples `max_samples` keeps of one source, and the record of that choice."""
    rule = "upstream"
    if source.startswith("testbed:"):
        pool = _read_testbed(source, testbed, per_category if max_samples is None else max_samples)
        kept, rows, rule = balanced(list(pool), max_samples, seed), len(pool), "balanced"
    elif (path := source.partition("@")[0]).endswith((".jsonl", ".json")) or Path(path).is_file():
        pool = _read_jsonl(Path(path), source.partition("@")[2] or None, source)
        kept, rows = [pool[i] for i in upstream_indices(len(pool), max_samples, seed)], len(pool)
    elif (name := canonical(source)) is not None:
        kept, rows = _read_hub(name, source, max_samples, seed)
    else:
        raise ValueError(f"--dataset {source!r}: not a file, not testbed:SPLIT and not a known benchmark "
                         f"({', '.join(BENCHMARKS)})")
    return kept, SourceSelection(source, rule, rows, [int(s.row or 0) for s in kept], [s.id for s in kept], seed,
                                 max_samples)


def _read_testbed(source: str, testbed: Path | None, per_category: int) -> list[Sample]:
    from whiflash.testbed import CATEGORIES, held_out_prompts
    from whiflash.testbed.prompts import testbed_split

    split = testbed_split(source if source != "testbed:" else "testbed:test", testbed, "--dataset")  # default: test
    out = [Sample(f"testbed-{split}-{p.id}", cat, (p.prompt,), source=source, dataset=f"testbed:{split}")
           for cat in CATEGORIES for p in held_out_prompts(testbed, cat, per_category, split=split)]
    out = [replace(s, row=i) for i, s in enumerate(out)]
    if not out:
        raise ValueError(f"--dataset {source!r}: the testbed at {testbed} has no prompts in split {split!r}")
    return out


def _read_jsonl(path: Path, category: str | None, source: str) -> list[Sample]:
    if not path.is_file():
        raise FileNotFoundError(f"--dataset {source!r}: no such file {path}")
    cat = category or benchmark_category(path.stem) or path.stem
    # the toolkit's one prompt-file reader (fields typed and checked, errors name FILE:LINE); the record's
    # category is the subcategory here, the file's (or --dataset's @CATEGORY) the category
    out = [Sample(r.id, cat, r.turns or (), input_ids=r.input_ids, subcategory=r.category, source=source)
           for r in prompt_records(path)]
    return [replace(s, dataset=path.stem, row=i) for i, s in enumerate(out)]


def _offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
               for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _read_hub(name: str, source: str, max_samples: int | None, seed: int) -> tuple[list[Sample], int]:
    """The samples `max_samples` keeps of benchmark `name` (upstream's rule), and the rows it has. Only the
    kept rows are rendered: a LiveCodeBench row carries its whole test suite."""
    bench = BENCHMARKS[name]
    hint = (f"--dataset {source}: could not load {bench.describe()} from the Hugging Face Hub. Offline, pass a "
            f"local JSONL file instead, e.g. --dataset path/to/{name.replace('-', '_')}.jsonl@{bench.category} with "
            "one record per line holding 'turns' (FastChat), 'prompt' or 'input_ids'")
    if _offline():
        raise RuntimeError(hint + " (offline mode is set: HF_DATASETS_OFFLINE/HF_HUB_OFFLINE)")
    try:
        rows = benchmarks.fetch(name)
    except Exception as err:
        raise RuntimeError(f"{hint} ({type(err).__name__}: {err})") from None
    benchmarks.check_columns(name, list(rows.column_names))
    out = []
    for i in upstream_indices(len(rows), max_samples, seed):
        row = dict(rows[i])
        sub = str(row.get(bench.subcategory) or "") if bench.subcategory else ""
        out.append(Sample(f"{name}-{i}", bench.category, tuple(benchmarks.turns(name, row)), subcategory=sub,
                          source=source, dataset=name, row=i))
    return out, len(rows)
