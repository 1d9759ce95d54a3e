"""The named benchmarks: upstream's repositories, prompt texts and `--max-samples` selection, on in-memory
`datasets.Dataset` fixtures in each upstream schema (no network)."""
from __future__ import annotations

import pytest
from datasets import Dataset

from whiflash.eval import benchmarks
from whiflash.eval.benchmarks import BENCHMARKS, canonical
from whiflash.eval.datasets import load_selection
from whiflash.eval.selection import upstream_indices

BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."
LCB_SYSTEM = ("You are an expert Python programmer. You will be given a question (problem specification) and will "
              "generate a correct Python program that matches the specification and passes all tests. You will NOT "
              "return anything except for the program")


def _rows(n: int, make) -> Dataset:
    return Dataset.from_list([make(i) for i in range(n)])


# One fixture per upstream name, in the dataset's own columns (extra columns included, as the real ones have),
# and the prompt upstream builds from row i.
FIXTURES = {
    "gsm8k": (lambda i: {"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"},
              lambda i: [f"What is {i} + 1?{BOXED}"]),
    "math500": (lambda i: {"problem": f"Solve x = {i}.", "solution": "x", "answer": str(i), "subject": "Algebra",
                           "level": 1, "unique_id": f"test/{i}.json"},
                lambda i: [f"Solve x = {i}.{BOXED}"]),
    "aime24": (lambda i: {"id": i, "problem": f"AIME 2024 problem {i}", "solution": "s", "answer": "1",
                          "url": "u", "year": "2024"},
               lambda i: [f"AIME 2024 problem {i}{BOXED}"]),
    "aime25": (lambda i: {"problem_idx": i, "problem": f"AIME 2025 problem {i}", "answer": 7, "problem_type": ["x"]},
               lambda i: [f"AIME 2025 problem {i}{BOXED}"]),
    "alpaca": (lambda i: {"instruction": f"Do task {i}.", "input": "" if i % 2 else f"data {i}", "output": "o",
                          "text": "t"},
               lambda i: [f"Do task {i}." if i % 2 else f"Do task {i}.\n\nInput:\ndata {i}"]),
    "mt-bench": (lambda i: {"prompt": [f"Turn one {i}", f"Turn two {i}"], "prompt_id": 81 + i, "category": "writing",
                            "reference": []},
                 lambda i: [f"Turn one {i}", f"Turn two {i}"]),
    "humaneval": (lambda i: {"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    \"\"\"doc\"\"\"\n",
                             "canonical_solution": "    return x\n", "test": "def check(c): pass", "entry_point": "f"},
                  lambda i: ["Write a solution to the following problem and make sure that it passes the tests:\n"
                             f"```python\ndef f{i}(x):\n    \"\"\"doc\"\"\"\n\n```"]),
    # the `sanitized` config: `prompt`, no `text` (the full config's column)
    "mbpp": (lambda i: {"source_file": "f.py", "task_id": 600 + i, "prompt": f"Write a function {i}.", "code": "c",
                        "test_imports": [], "test_list": ["assert True"]},
             lambda i: [f"Write a function {i}."]),
    "lbpp": (lambda i: {"task_id": f"lbpp/{i}", "language": "python", "title": "t", "instruction": f"Implement {i}.",
                        "completion": "c", "test_file": "t", "test_list": "[]", "signature": "s", "categories": "[]",
                        "test_setup": ""},
             lambda i: [f"Implement {i}."]),
    "swe-bench": (lambda i: {"repo": "r/r", "instance_id": f"r__r-{i}", "base_commit": "abc", "patch": "p",
                             "test_patch": "tp", "problem_statement": f"Bug {i} crashes.", "hints_text": "",
                             "created_at": "2023", "version": "1", "FAIL_TO_PASS": "[]", "PASS_TO_PASS": "[]",
                             "environment_setup_commit": "e"},
                  lambda i: [f"Problem Statement:\nBug {i} crashes.\nPlease fix the issue described above."]),
    # the test*.jsonl layout: starter code on some rows, an empty string on others
    "livecodebench": (lambda i: {"question_title": "t", "question_content": f"Read N and print N * {i}.",
                                 "platform": "atcoder", "question_id": str(i), "contest_id": "c",
                                 "contest_date": "2024-01-01", "starter_code": "class Solution:\n    def f(self):\n"
                                 if i % 2 else "", "difficulty": "easy", "public_test_cases": "[]",
                                 "private_test_cases": "x", "metadata": "{}"},
                      lambda i: [f"{LCB_SYSTEM}\n\n### Question:\nRead N and print N * {i}.\n\n"
                                 + ("### Format: Use the following code structure:\n```python\nclass Solution:\n"
                                    "    def f(self):\n\n```" if i % 2 else
                                    "### Format: Write your code in the following format:\n```python\n# YOUR CODE "
                                    "HERE\n```")
                                 + "\n\n### Answer: (use the provided format with backticks)"]),
}

CATEGORIES = {"gsm8k": "math", "math500": "math", "aime24": "math", "aime25": "math", "alpaca": "chat",
              "mt-bench": "chat", "humaneval": "coding", "mbpp": "coding", "lbpp": "coding", "livecodebench": "coding",
              "swe-bench": "agentic"}


def test_every_upstream_name_is_known_with_its_category() -> None:
    assert set(BENCHMARKS) == set(FIXTURES) == set(CATEGORIES)
    assert {n: b.category for n, b in BENCHMARKS.items()} == CATEGORIES
    for alias, name in {"aime": "aime24", "swe-bench-lite": "swe-bench", "SWE_bench_lite": "swe-bench",
                        "mt_bench": "mt-bench", "math-500": "math500", "MBPP": "mbpp"}.items():
        assert canonical(alias) == name


@pytest.mark.parametrize("name", list(FIXTURES))
def test_upstream_prompt_text_and_selection(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    make, expect = FIXTURES[name]
    rows = _rows(23, make)
    monkeypatch.setattr(benchmarks, "fetch", lambda n: rows if n == name else pytest.fail(n))
    samples, (sel,) = load_selection(name, max_samples=5)
    # upstream: dataset.shuffle(seed=0).select(range(N)), in that order
    picked = rows.shuffle(seed=0).select(range(5))
    assert [s.turns for s in samples] == [tuple(expect(i)) for i in sel.indices]  # upstream's text, to the byte
    assert [list(s.turns) for s in samples] == [benchmarks.turns(name, r) for r in picked]
    assert sel.indices == upstream_indices(23, 5) and sel.rows == 23 and sel.rule == "upstream"
    assert [s.id for s in samples] == [f"{name}-{i}" for i in sel.indices] == sel.ids
    assert {s.category for s in samples} == {CATEGORIES[name]} and {s.dataset for s in samples} == {name}
    everything, (all_sel,) = load_selection(name)  # no --max-samples: every row in its order
    assert all_sel.indices == list(range(23)) and everything[3].turns == tuple(expect(3))


def test_selection_is_datasets_shuffle_select() -> None:
    for n, k, seed in ((10, 3, 0), (1319, 128, 0), (80, 10, 0), (500, 499, 1), (30, 30, 0), (5, 8, 0)):
        rows = Dataset.from_dict({"i": list(range(n))})
        expected = rows.shuffle(seed=seed).select(range(k))["i"] if n > k else list(range(n))
        assert upstream_indices(n, k, seed) == expected
    with pytest.raises(ValueError, match="--max-samples: expected an integer >= 1, got 0"):
        upstream_indices(5, 0)


def test_mt_bench_keeps_its_category_as_subcategory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchmarks, "fetch", lambda n: _rows(3, FIXTURES["mt-bench"][0]))
    (s, *_), _ = load_selection("mt_bench")
    assert s.subcategory == "writing" and s.n_turns == 2 and s.category == "chat"


def test_a_missing_column_is_named_with_the_columns_found(monkeypatch: pytest.MonkeyPatch) -> None:
    # MBPP's `full` config has `text`, not the `prompt` the `sanitized` config (and upstream) reads
    full = Dataset.from_dict({"task_id": [1], "text": ["Write f."], "code": ["c"], "test_list": [["t"]]})
    monkeypatch.setattr(benchmarks, "fetch", lambda n: full)
    with pytest.raises(ValueError, match=r"--dataset mbpp: google-research-datasets/mbpp \(config sanitized, split "
                                         r"test\) has columns \['code', 'task_id', 'test_list', 'text'\]; expected "
                                         r"'prompt'"):
        load_selection("mbpp")


def test_fetch_loads_what_upstream_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets
    import huggingface_hub

    calls: list[tuple] = []
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", lambda self, repo, **kw: calls.append(("info", repo)))
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **kw: calls.append((a, kw)) or "rows")
    for name in ("gsm8k", "mbpp", "aime25", "swe-bench", "livecodebench", "lbpp"):
        assert benchmarks.fetch(name) == "rows"
    lcb = [f"https://huggingface.co/datasets/livecodebench/code_generation_lite/resolve/main/{f}" for f in
           ("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl", "test6.jsonl")]
    assert calls == [
        ("info", "openai/gsm8k"), (("openai/gsm8k", "main"), {"split": "test"}),
        ("info", "google-research-datasets/mbpp"), (("google-research-datasets/mbpp", "sanitized"), {"split": "test"}),
        ("info", "MathArena/aime_2025"), (("MathArena/aime_2025", None), {"split": "train"}),
        ("info", "princeton-nlp/SWE-bench_Lite"), (("princeton-nlp/SWE-bench_Lite", None), {"split": "test"}),
        ("info", "livecodebench/code_generation_lite"), (("json",), {"data_files": {"test": lcb}, "split": "test"}),
        ("info", "CohereLabs/lbpp"),
        (("parquet",), {"data_files": {"test": ["https://huggingface.co/datasets/CohereLabs/lbpp/resolve/main/python/"
                                                "test.parquet"]}, "split": "test"}),
    ]


def test_each_source_keeps_its_own_selection(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchmarks, "fetch", lambda n: _rows(40, FIXTURES[n][0]))
    mine = tmp_path / "mine.jsonl"
    mine.write_text("".join(f'{{"id": {i}, "prompt": "p{i}"}}\n' for i in range(12)))
    samples, sels = load_selection(f"gsm8k,{mine}@coding,humaneval", max_samples=4)
    assert [s.dataset for s in samples] == ["gsm8k"] * 4 + ["mine"] * 4 + ["humaneval"] * 4
    assert [sel.indices for sel in sels] == [upstream_indices(40, 4), upstream_indices(12, 4), upstream_indices(40, 4)]
    assert [s.turns[0] for s in samples[4:8]] == [f"p{i}" for i in upstream_indices(12, 4)]
    with pytest.raises(ValueError, match="both give sample id 'gsm8k-"):
        load_selection("gsm8k,aime24,gsm8k", max_samples=2)
