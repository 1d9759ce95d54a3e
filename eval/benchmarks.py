"""The named benchmarks of `--dataset`: where each comes from and the prompt text it yields, as upstream builds them.

Every entry follows the upstream benchmark loaders (liranringel/ddtree `model/utils.py`
`load_and_process_dataset`; z-lab/dflash `benchmark.py` agrees where they overlap): the same Hub
repository, configuration, split and columns, and the same prompt text, character for character, so
that `--dataset gsm8k` here decodes the prompts upstream's figures were measured on. Canonical names
are upstream's (`gsm8k`, `math500`, `aime24`, `aime25`, `alpaca`, `mt-bench`, `humaneval`, `mbpp`,
`lbpp`, `swe-bench`, `livecodebench`); this toolkit's earlier spellings are aliases.

Two benchmarks are not plain Hub datasets: `livecodebench` is read from its `test*.jsonl` files with
the `json` builder (its repository's loading script is refused by `datasets` >= 4) and `lbpp` from
its Python test split's Parquet file. `fetch` loads the rows; `turns` renders one row.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BENCHMARKS", "Benchmark", "canonical", "check_columns", "fetch", "turns"]

_BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."
"""Upstream's instruction after every math problem (gsm8k, math500, aime24, aime25)."""

_LCB_SYSTEM = ("You are an expert Python programmer. You will be given a question (problem specification) "
               "and will generate a correct Python program that matches the specification and passes all tests. "
               "You will NOT return anything except for the program")
"""LiveCodeBench's system text, which upstream puts at the top of the one user turn."""

_LCB_FILES = ("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl", "test6.jsonl")
_LCB_BASE = "https://huggingface.co/datasets/livecodebench/code_generation_lite/resolve/main/"
_LBPP_FILE = "https://huggingface.co/datasets/CohereLabs/lbpp/resolve/main/python/test.parquet"


def _math(column: str) -> Callable[[dict[str, Any]], list[str]]:
    return lambda row: [f"{row[column]}{_BOXED}"]


def _alpaca(row: dict[str, Any]) -> list[str]:
    return [f"{row['instruction']}\n\nInput:\n{row['input']}" if row["input"] else str(row["instruction"])]


def _humaneval(row: dict[str, Any]) -> list[str]:
    return ["Write a solution to the following problem and make sure that it passes the tests:\n"
            f"```python\n{row['prompt']}\n```"]


def _swe_bench(row: dict[str, Any]) -> list[str]:
    return [f"Problem Statement:\n{row['problem_statement']}\nPlease fix the issue described above."]


def _livecodebench(row: dict[str, Any]) -> list[str]:
    question = f"### Question:\n{row['question_content']}"
    if row.get("starter_code"):
        fmt, code = "### Format: Use the following code structure:", f"```python\n{row['starter_code']}\n```"
    else:
        fmt, code = "### Format: Write your code in the following format:", "```python\n# YOUR CODE HERE\n```"
    return [f"{_LCB_SYSTEM}\n\n{question}\n\n{fmt}\n{code}\n\n### Answer: (use the provided format with backticks)"]


@dataclass(frozen=True)
class Benchmark:
    """One named benchmark: where its rows come from and how a row becomes the user turns of a sample.

    With `builder` None, `repo` is a Hub dataset loaded as `load_dataset(repo, config, split=split)`;
    otherwise `builder` (`json`, `parquet`) reads `data_files` as `load_dataset(builder,
    data_files={split: files}, split=split)` and `repo` is the Hub repository those files live in.
    """

    category: str
    repo: str
    split: str
    columns: tuple[str, ...]
    """Columns `render` reads: a dataset without one of them is refused with the columns it has."""
    render: Callable[[dict[str, Any]], list[str]]
    config: str | None = None
    builder: str | None = None
    data_files: tuple[str, ...] = ()
    subcategory: str | None = None
    """A column kept as each sample's `subcategory` (MT-Bench's "writing", "roleplay", ...)."""
    display: str = ""
    """The name upstream's tables print."""
    aliases: tuple[str, ...] = field(default_factory=tuple)

    def describe(self) -> str:
        """Where the rows come from, for messages: `repo (config X, split Y)` or the builder and its files."""
        if self.builder:
            return f"{self.builder} files {', '.join(self.data_files)} (split {self.split})"
        return f"{self.repo} ({f'config {self.config}, ' if self.config else ''}split {self.split})"


TESTBED_CATEGORY = {"chat": "prose", "coding": "code", "math": "math", "agentic": "agentic"}
"""The testbed category each benchmark category stands for: thresholds calibrated on a testbed apply to the
benchmark prompt files run through it by this map (chat prompts take prose's)."""

BENCHMARKS: dict[str, Benchmark] = {
    "gsm8k": Benchmark("math", "openai/gsm8k", "test", ("question",), _math("question"), config="main",
                       display="GSM8K"),
    "math500": Benchmark("math", "HuggingFaceH4/MATH-500", "test", ("problem",), _math("problem"),
                         display="MATH-500", aliases=("math-500",)),
    "aime24": Benchmark("math", "HuggingFaceH4/aime_2024", "train", ("problem",), _math("problem"),
                        display="AIME 2024", aliases=("aime", "aime-24", "aime2024")),
    "aime25": Benchmark("math", "MathArena/aime_2025", "train", ("problem",), _math("problem"),
                        display="AIME 2025", aliases=("aime-25", "aime2025")),
    "alpaca": Benchmark("chat", "tatsu-lab/alpaca", "train", ("instruction", "input"), _alpaca, display="Alpaca"),
    "mt-bench": Benchmark("chat", "HuggingFaceH4/mt_bench_prompts", "train", ("prompt",),
                          lambda row: [str(t) for t in row["prompt"]], subcategory="category",
                          display="MT-Bench", aliases=("mtbench",)),
    "humaneval": Benchmark("coding", "openai/openai_humaneval", "test", ("prompt",), _humaneval,
                           display="HumanEval", aliases=("human-eval",)),
    "mbpp": Benchmark("coding", "google-research-datasets/mbpp", "test", ("prompt",), lambda row: [str(row["prompt"])],
                      config="sanitized", display="MBPP"),
    "lbpp": Benchmark("coding", "CohereLabs/lbpp", "test", ("instruction",), lambda row: [str(row["instruction"])],
                      builder="parquet", data_files=(_LBPP_FILE,), display="LBPP"),
    "livecodebench": Benchmark("coding", "livecodebench/code_generation_lite", "test",
                               ("question_content",), _livecodebench, builder="json",
                               data_files=tuple(_LCB_BASE + f for f in _LCB_FILES), display="LiveCodeBench",
                               aliases=("lcb",)),
    "swe-bench": Benchmark("agentic", "princeton-nlp/SWE-bench_Lite", "test", ("problem_statement",), _swe_bench,
                           display="SWE-bench Lite", aliases=("swe-bench-lite", "swebench-lite", "swebench")),
}
"""Named benchmarks by upstream name: `--dataset NAME` (or an alias; `_` and `-` are the same)."""


def canonical(name: str) -> str | None:
    """The upstream name of benchmark `name` (itself, or an alias, in any case, `_` for `-`), or None."""
    key = name.strip().lower().replace("_", "-")
    for canon, bench in BENCHMARKS.items():
        if key == canon or key in bench.aliases:
            return canon
    return None


def turns(name: str, row: dict[str, Any]) -> list[str]:
    """The user turns upstream builds from one `row` of benchmark `name` (a canonical name)."""
    return BENCHMARKS[name].render(row)


def fetch(name: str) -> Any:
    """The rows of benchmark `name` (a canonical name) as a `datasets.Dataset`, loaded as upstream loads them."""
    import datasets
    from huggingface_hub import HfApi

    bench = BENCHMARKS[name]
    HfApi().dataset_info(bench.repo, timeout=10)  # an unreachable Hub fails here at once, not after retries
    if bench.builder:
        return datasets.load_dataset(bench.builder, data_files={bench.split: list(bench.data_files)},
                                     split=bench.split)
    return datasets.load_dataset(bench.repo, bench.config, split=bench.split)


def check_columns(name: str, columns: Sequence[str]) -> None:
    """Refuse rows of benchmark `name` that lack a column its prompt reads, naming what was found."""
    bench = BENCHMARKS[name]
    missing = [c for c in bench.columns if c not in columns]
    if missing:
        raise ValueError(f"--dataset {name}: {bench.describe()} has columns {sorted(columns)}; expected "
                         f"{', '.join(repr(c) for c in missing)} (the column(s) its prompt is built from)")
