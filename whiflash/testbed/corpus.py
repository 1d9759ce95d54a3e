"""The testbed corpus: text every Python install has, split by document group.

Four categories:

* ``code``  — the interpreter's standard-library ``.py`` files (encodings tables, ``lib2to3``
  and very large files excluded; test suites only with ``include_tests``) and, with ``code_modules``,
  generated modules of HumanEval-shaped functions (``codegen``);
* ``math``  — seeded arithmetic word problems with worked solutions (``mathgen``);
* ``prose`` — English from the standard library: module/class/function docstrings and the
  ``pydoc_data`` topic texts, a share of them (``chat_prose``) as user-assistant exchanges (``chatgen``);
* ``agentic`` — seeded agent transcripts that switch regime within a sequence: free prose
  interleaved with JSON calls of real standard-library functions and their results (``agentgen``), with
  ``agent_explanations`` some thoughts explaining a documented object of their split in the chat house style.

Splits are assigned per *group* by a seeded hash, not per document: a source file's code
document and its docstring documents share the group ``stdlib/<path>``, so no held-out code
file has its docstrings in the training prose (and vice versa). The corpus is written as one
JSON-lines file per split, each record ``{"id", "category", "group", "text"}``.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import multiprocessing
import platform
import random
import sysconfig
import textwrap
import tokenize
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .agentgen import explanation, generate_transcripts, sentences
from .chatgen import Documented, documented, render, render_topic
from .codegen import generate_modules
from .mathgen import generate_problems
from .presets import CATEGORIES, CorpusConfig
from .spawning import spawnable_main

__all__ = ["Document", "SPLITS", "GENERATOR_VERSION", "stdlib_root", "collect_documents", "assign_split", "write_corpus",
           "read_corpus", "SPECIAL_TOKEN_GUARD"]

log = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = ("train", "validation", "test")

GENERATOR_VERSION = 2
"""Part of the corpus stage's fingerprint: bump it when a generator's output changes (2: the agentic
category; its transcripts quote prose of their own split), so a resumed build rebuilds the corpus."""

SPECIAL_TOKEN_GUARD = ("<|", "< |")
"""Every ``<|`` in source text is rewritten so no document can spell a special token
(``<|mask|>``, ``<|endoftext|>``): the target must never see the DFlash mask token."""

# Directory names whose contents are not representative library code.
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings",
              "pydoc_data", "_bundled", "lib2to3", "__phello__"}
_TEST_DIRS = {"test", "tests", "idle_test"}


@dataclass(frozen=True)
class Document:
    """One corpus document."""

    id: str
    """Unique id, e.g. ``code:json/decoder.py`` or ``math:123``."""
    category: str
    """``code``, ``math``, ``prose`` or ``agentic``."""
    group: str
    """Split unit: documents of one group always land in the same split."""
    text: str
    """Document text (special-token spellings neutralised)."""


def stdlib_root() -> Path:
    """Directory of the running interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def _clean(text: str) -> str:
    return text.replace(*SPECIAL_TOKEN_GUARD).replace("\r\n", "\n")


def _stdlib_files(root: Path, max_chars: int, include_tests: bool = False) -> Iterator[tuple[str, str]]:
    """(relative path, source) of the library's ``.py`` files in sorted order."""
    skip = _SKIP_DIRS - _TEST_DIRS if include_tests else _SKIP_DIRS
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        dirs = rel.parts[:-1]
        if any(part in skip for part in dirs):
            continue
        if not include_tests and (rel.name.startswith("test_") or any(p.startswith("test") for p in dirs)):
            continue
        if path.stat().st_size > max_chars * 2:
            continue
        try:
            with tokenize.open(path) as fh:  # honours PEP 263 coding cookies
                source = fh.read()
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        if len(source) <= max_chars and source.strip():
            yield rel.as_posix(), source


def _topics() -> dict[str, str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # stripped-down interpreters
        return {}
    return dict(topics)


def _background(text: str) -> list[str]:
    """Sentences of a prose document an agent could quote as background: plain English, one line, no code."""
    return [s for s in sentences(text) if 30 <= len(s) <= 200 and s[0].isupper() and ">>>" not in s
            and not any(c in s for c in "{}[]=`")]


def _snippets(source: str, lines: int = 6, most: int = 8) -> list[str]:
    """Up to ``most`` snippets of a source file an agent could show: a ``def`` line and the code after it
    (at most ``lines`` lines in all, stopping at a blank line; functions that open with a docstring are
    skipped), dedented."""
    rows = source.splitlines()
    out = []
    for i, row in enumerate(rows):
        if row.lstrip().startswith("def ") and len(out) < most:
            block = []
            for line in rows[i : i + lines]:
                if not line.strip():
                    break
                block.append(line)
            if len(block) >= 3 and block[1].lstrip()[:1] not in ("'", '"'):  # code, not a docstring
                out.append(textwrap.dedent("\n".join(block)))
    return out


SHARES = ("agent_code_excerpts", "agent_explanations", "chat_prose", "validation_fraction", "test_fraction")
"""The corpus options that are shares of something, each a number from 0 to 1."""


def check_shares(cfg: CorpusConfig) -> None:
    """Refuse a share option that is not a number from 0 to 1 (an override such as
    ``corpus.agent_explanations=half`` would otherwise fail deep inside a generator, or silently mean 0 or 1)."""
    for name in SHARES:
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ValueError(f"corpus.{name}={value!r}: expected a share, a number from 0 to 1")


def collect_documents(cfg: CorpusConfig, root: Path | None = None, workers: int = 1) -> Iterator[Document]:
    """All documents of the corpus in a deterministic order (before splitting); the options are checked at the
    call, before anything is drawn or written. ``workers`` > 1 parses the library files in that many processes
    (the same documents in the same order)."""
    check_shares(cfg)
    return _documents(cfg, root or stdlib_root(), workers)


PARSE_WORKERS_MAX = 8
"""Most processes `write_corpus` parses with: each one imports the package (torch with it: seconds and ~0.4 GB), and
past a few workers the imports cost more than the parsing they share (the build passes its thread count, which is
every core of a GPU host)."""


def _documented_list(file: tuple[str, str]) -> list[Documented]:
    """The documented objects of one (relative path, source) file, as a list a worker process can send back."""
    return list(documented(*file))


def _library(cfg: CorpusConfig, root: Path, workers: int) -> Iterator[tuple[str, str, list[Documented]]]:
    """(relative path, source, its documented objects) of each library file in order. Parsing the files is most
    of the corpus stage, so with ``workers`` > 1 that many processes parse them; the results come back in file
    order."""
    files = _stdlib_files(root, cfg.max_file_chars, cfg.include_tests)
    workers = min(workers, PARSE_WORKERS_MAX)
    if workers <= 1:
        for rel, source in files:
            yield rel, source, _documented_list((rel, source))
        return
    files = list(files)
    # spawn: the build's process may hold CUDA or OpenMP threads, which a forked child must not inherit
    with spawnable_main(), ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for (rel, source), items in zip(files, pool.map(_documented_list, files, chunksize=16)):
            yield rel, source, items


def _documents(cfg: CorpusConfig, root: Path, workers: int) -> Iterator[Document]:
    n_files = 0
    pools: dict[str, list[str]] = {}  # split -> background sentences of its prose (agent transcripts quote them)
    code_pools: dict[str, list[str]] = {}  # split -> snippets of its code (when cfg.agent_code_excerpts > 0)
    explain_pools: dict[str, list[Documented]] = {}  # split -> objects agents explain (cfg.agent_explanations > 0)

    def prose(id_: str, group: str, text: str, chat: Callable[[random.Random], str]) -> Document:
        # agent transcripts quote the plain docstring; a seeded share of prose documents are chat exchanges
        pools.setdefault(assign_split(group, cfg), []).extend(_background(text))
        rng = random.Random(f"{cfg.seed}:{id_}")
        return Document(id_, "prose", group, _clean(chat(rng) if rng.random() < cfg.chat_prose else text))

    for rel, source, items in _library(cfg, root, workers):
        n_files += 1
        group = f"stdlib/{rel}"
        yield Document(f"code:{rel}", "code", group, _clean(source))
        if cfg.agent_code_excerpts > 0:
            code_pools.setdefault(assign_split(group, cfg), []).extend(_snippets(_clean(source)))
        for i, item in enumerate(items):
            if len(item.doc) >= cfg.min_docstring_chars:
                yield prose(f"prose:{rel}:{i}", group, item.doc, lambda rng, item=item: render(item, rng))
                if cfg.agent_explanations > 0 and explanation(item) is not None:
                    explain_pools.setdefault(assign_split(group, cfg), []).append(item)
    for name, text in sorted(_topics().items()):
        text = inspect.cleandoc(text)
        if len(text) >= cfg.min_docstring_chars:
            yield prose(f"prose:topic:{name}", f"topic/{name}", text,
                        lambda rng, name=name, text=text: render_topic(name, text, rng))
    for i, module in enumerate(generate_modules(cfg.code_modules, cfg.seed, cfg.code_names, cfg.code_examples,
                                                  cfg.code_module_data)):
        yield Document(f"code:generated:{i}", "code", f"codegen/{i}", module)
    for i, problem in enumerate(generate_problems(cfg.math_problems, cfg.seed, cfg.math_scale)):
        yield Document(f"math:{i}", "math", f"math/{i}", problem.text)
    # A transcript quotes the prose of its own split: held-out transcripts never quote training prose and
    # training transcripts never leak held-out prose.
    split_of = lambda i: assign_split(f"agentic/{i}", cfg)  # noqa: E731
    for i, text in enumerate(generate_transcripts(cfg.agent_transcripts, cfg.seed,
                                                  lambda i: pools.get(split_of(i), []),
                                                  lambda i: code_pools.get(split_of(i), []), cfg.agent_code_excerpts,
                                                  lambda i: explain_pools.get(split_of(i), []),
                                                  cfg.agent_explanations)):
        yield Document(f"agentic:{i}", "agentic", f"agentic/{i}", _clean(text))
    log.info("collected %d standard-library files from %s", n_files, root)


def assign_split(group: str, cfg: CorpusConfig) -> str:
    """Seeded, order-independent split of a group: the same on every machine and run."""
    digest = hashlib.sha256(f"{cfg.seed}:{group}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u < cfg.test_fraction:
        return "test"
    if u < cfg.test_fraction + cfg.validation_fraction:
        return "validation"
    return "train"


def write_corpus(cfg: CorpusConfig, out_dir: Path, root: Path | None = None, workers: int = 1) -> dict:
    """Write ``{split}.jsonl`` files into ``out_dir``; return statistics and the corpus hash. ``workers``: processes
    that parse the library files (``collect_documents``, at most ``PARSE_WORKERS_MAX``); the files written do not
    depend on it.

    The hash covers the ordered records of all splits, so it changes whenever the standard
    library, the generator or the split rule changes.
    """
    documents = collect_documents(cfg, root, workers)  # checks the options before a file is opened
    out_dir.mkdir(parents=True, exist_ok=True)
    handles = {s: open(out_dir / f"{s}.jsonl", "w", encoding="utf-8") for s in SPLITS}
    stats = {s: {c: {"documents": 0, "chars": 0} for c in CATEGORIES} for s in SPLITS}
    hasher = hashlib.sha256()
    try:
        for doc in documents:
            split = assign_split(doc.group, cfg)
            line = json.dumps({"id": doc.id, "category": doc.category, "group": doc.group, "text": doc.text},
                              ensure_ascii=False)
            handles[split].write(line + "\n")
            hasher.update(split.encode() + b"\0" + line.encode() + b"\n")
            stats[split][doc.category]["documents"] += 1
            stats[split][doc.category]["chars"] += len(doc.text)
    finally:
        for fh in handles.values():
            fh.close()
    for split in SPLITS:
        for cat in CATEGORIES:
            if stats[split][cat]["documents"] == 0:
                raise RuntimeError(f"corpus split {split!r} has no {cat!r} documents; adjust the fractions")
    return {"sha256": hasher.hexdigest(), "stats": stats, "python": platform.python_version(),
            "stdlib": str(root or stdlib_root())}


def read_corpus(corpus_dir: Path, split: str, category: str | None = None) -> Iterator[dict]:
    """Records of one split (optionally one category), in file order; a line that is not a corpus document (a JSON
    object with ``category`` and ``text``) is refused, naming the file and line."""
    path = Path(corpus_dir) / f"{split}.jsonl"
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                rec = None
            if not isinstance(rec, dict) or not isinstance(rec.get("text"), str) or "category" not in rec:
                raise ValueError(f"{path}:{number}: expected a corpus document (a JSON object with 'category' and "
                                 "'text')")
            if category is None or rec["category"] == category:
                yield rec
