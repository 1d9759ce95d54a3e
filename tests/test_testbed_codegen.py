"""Generated code modules (``codegen``): valid Python whose functions do what their docstrings say, seeded,
and in the corpus as code documents of their own groups (fast, no model training)."""

from __future__ import annotations

import doctest
import random
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from whiflash.testbed.codegen import FAMILIES, generate_module, generate_modules, has_module_data
from whiflash.testbed.corpus import SPLITS, read_corpus, write_corpus
from whiflash.testbed.presets import CorpusConfig
from whiflash.testbed.prompts import cut_prompt

NUMBERS = [[], [0], [3, -4, 10, 7, 12, -1, 20, 5, 0, 40], [-6, -3], [2, 4, 6], [11, 13, 17, 19, 21]]
TEXTS = ["", "Hello, World! 42 apples.", "the cat and THE hat, the end", "  spaced   out  "]


def _test(phrase: str) -> Callable[[int], bool]:
    """The docstring's number test, read from its words."""
    fixed = {"even": lambda x: x % 2 == 0, "odd": lambda x: x % 2 == 1, "positive": lambda x: x > 0,
             "negative": lambda x: x < 0}
    if phrase in fixed:
        return fixed[phrase]
    word, k = re.fullmatch(r"(greater than|less than|divisible by) (\d+)", phrase).groups()
    k = int(k)
    return {"greater than": lambda x: x > k, "less than": lambda x: x < k, "divisible by": lambda x: x % k == 0}[word]


def _map(phrase: str) -> Callable[[int], int]:
    fixed = {"doubled": lambda x: 2 * x, "squared": lambda x: x ** 2, "negated": lambda x: -x}
    if phrase in fixed:
        return fixed[phrase]
    word, k = re.fullmatch(r"(increased by|multiplied by) (\d+)", phrase).groups()
    return (lambda x: x + int(k)) if word == "increased by" else (lambda x: x * int(k))


CHARS = {"a vowel": lambda c: c in "aeiou", "a digit": str.isdigit, "an uppercase letter": str.isupper,
         "a space": lambda c: c == " ", "a letter": str.isalpha}
WORDS = {"every word capitalized": str.capitalize, "every word reversed": lambda w: w[::-1],
         "every word in upper case": str.upper, "every word stripped of punctuation": lambda w: w.strip(".,;:!?")}


# (docstring shape, what it promises for the shape's phrase and an argument)
RULES: list[tuple[str, Callable[[str, Any], Any]]] = [
    (r"Return how many of the \w+ are (.+)\.", lambda p, a: sum(map(_test(p), a))),
    (r"Return the \w+ that are (.+), in order\.", lambda p, a: [x for x in a if _test(p)(x)]),
    (r"Return the sum of the \w+ that are (.+)\.", lambda p, a: sum(x for x in a if _test(p)(x))),
    (r"Return the index of the first of the \w+ that is (.+), or -1 if there is none\.",
     lambda p, a: next((i for i, x in enumerate(a) if _test(p)(x)), -1)),
    (r"Return True if all of the \w+ are (.+)\.", lambda p, a: all(map(_test(p), a))),
    (r"Return True if any of the \w+ is (.+)\.", lambda p, a: any(map(_test(p), a))),
    (r"Return the largest of the \w+ that is (.+), or None if there is none\.",
     lambda p, a: max((x for x in a if _test(p)(x)), default=None)),
    (r"Return a new list of the \w+, each (.+)\.", lambda p, a: [_map(p)(x) for x in a]),
    (r"Return how many characters of \w+ are (.+)\.", lambda p, a: sum(map(CHARS[p], a))),
    (r"Return \w+ without the characters that are (.+)\.", lambda p, a: "".join(c for c in a if not CHARS[p](c))),
    (r"Return \w+ with (.+)\.", lambda p, a: " ".join(WORDS[p](w) for w in a.split())),
    (r"Return how many times each lower-cased word occurs in \w+\.()", lambda _, a: Counter(a.lower().split())),
    (r"Return the running totals of the \w+: .*()", lambda _, a: [sum(a[:i + 1]) for i in range(len(a))]),
]


def _expected(doc: str, arg: Any) -> tuple[str, Any]:
    """(the docstring's shape, what it promises for ``arg``), computed independently of the generated body."""
    for pattern, rule in RULES:
        if m := re.fullmatch(pattern, doc):
            return pattern, rule(m.group(1), arg)
    raise AssertionError(f"no rule reads the docstring {doc!r}")


@pytest.mark.parametrize(("names", "examples", "module_data"), [(False, 0, False), (True, 0, False), (True, 2, False),
                                                                  (True, 2, True)])
def test_generated_functions_do_what_their_docstrings_say(names: bool, examples: int, module_data: bool) -> None:
    shapes = set()
    for module in generate_modules(300, seed=3, names=names, examples=examples, module_data=module_data):
        namespace: dict[str, Any] = {}
        exec(compile(module, "<generated>", "exec", dont_inherit=True), namespace)  # valid Python, every module
        for fn in (v for k, v in namespace.items() if callable(v) and not k.startswith("__")):
            text_arg = next(iter(fn.__annotations__.values())) is str
            for arg in TEXTS if text_arg else NUMBERS:
                shape, promised = _expected(fn.__doc__.splitlines()[0], arg)
                assert fn(arg) == promised, (fn.__name__, arg)
                shapes.add(shape)
    assert shapes == {pattern for pattern, _ in RULES}  # every family, both all and any, was checked


def _doctests(modules: list[str]) -> tuple[doctest.TestResults, list[str]]:
    """Every generated function's doctest run in its module's namespace: (the results, the example calls)."""
    runner, finder, calls = doctest.DocTestRunner(verbose=False), doctest.DocTestFinder(), []
    for i, module in enumerate(modules):
        namespace: dict[str, Any] = {}
        exec(compile(module, f"<generated {i}>", "exec", dont_inherit=True), namespace)
        for fn in (v for k, v in namespace.items() if callable(v) and not k.startswith("__")):
            for test in finder.find(fn, fn.__name__, globs=namespace):
                assert len(test.examples) == 2 and all(e.want.strip() not in ("", "None") for e in test.examples)
                calls += [e.source for e in test.examples]
                runner.run(test)
    return runner.summarize(verbose=False), calls


def test_doctest_examples_hold_and_vary_and_leave_the_plain_modules_alone() -> None:
    results, calls = _doctests(list(generate_modules(200, seed=0, names=True, examples=2)))
    assert results.failed == 0 and results.attempted == len(calls)  # every written value is what it returns
    assert len(set(calls)) > 0.9 * len(calls)  # drawn arguments, not a few fixed calls
    assert list(generate_modules(50, seed=0, names=True, examples=0)) == list(generate_modules(50, seed=0, names=True))
    assert list(generate_modules(20, seed=0, examples=0, module_data=True)) == list(generate_modules(20, seed=0))
    with pytest.raises(ValueError, match=r"corpus.code_examples: expected an integer >= 0, got -1"):
        list(generate_modules(1, seed=0, examples=-1))


def test_modules_are_seeded_varied_and_pep8_spaced() -> None:
    first = list(generate_modules(50, seed=0))
    assert first == list(generate_modules(50, seed=0)) and first[:10] == list(generate_modules(10, seed=0))
    assert first != list(generate_modules(50, seed=1))
    assert len(set(first)) == 50
    module = generate_module(random.Random(0), functions=(5, 5))
    assert "\n\n\n\ndef " not in module and module.count("\n\n\ndef ") == module.count("def ") - 1
    headers = [line for m in first for line in m.splitlines() if line.startswith("def ")]
    assert len(set(headers)) > 100  # constants and parameter names vary, not a few fixed functions
    assert len({f.__name__ for f in FAMILIES}) == len(FAMILIES)


def test_drawn_names_vary_within_the_house_style() -> None:
    fixed, drawn = list(generate_modules(200, seed=0)), list(generate_modules(200, seed=0, names=True))
    loop_names = [set(re.findall(r"^    for (?:i, )?(\w+) in ", "\n".join(ms), re.M)) for ms in (fixed, drawn)]
    assert loop_names[0] == {"x", "ch", "word"}  # the house style
    assert {"n", "v", "value", "num", "c", "char", "w", "token"} <= loop_names[1]
    assert drawn == list(generate_modules(200, seed=0, names=True))
    for module in drawn:  # a name is drawn once per function and used at every place
        for function in module.split("\n\n\n"):
            loop = re.search(r"for (?:i, )?(\w+) in ", function)
            if loop:
                uses = re.findall(rf"\b{loop.group(1)}\b", function)
                assert len(uses) >= 2, function


def test_corpus_code_modules_are_code_documents_of_their_own_groups(tmp_path: Path) -> None:
    base = CorpusConfig(math_problems=100, agent_transcripts=100, max_file_chars=5_000, test_fraction=0.2)
    plain = write_corpus(base, tmp_path / "plain")
    mixed = write_corpus(CorpusConfig(**{**base.__dict__, "code_modules": 40, "code_examples": 2,
                                         "code_module_data": True}), tmp_path / "mixed")
    records = [(s, r) for s in SPLITS for r in read_corpus(tmp_path / "mixed", s)]
    generated = [(s, r) for s, r in records if r["group"].startswith("codegen/")]
    assert {r["category"] for _, r in generated} == {"code"}
    assert sorted(r["text"] for _, r in generated) == sorted(generate_modules(40, base.seed, examples=2,
                                                                              module_data=True))
    assert {s for s, _ in generated} == set(SPLITS)  # split by group, like every document
    rest = [r for _, r in records if not r["group"].startswith("codegen/")]
    assert rest == [r for s in SPLITS for r in read_corpus(tmp_path / "plain", s)]  # nothing else moves
    assert plain["sha256"] != mixed["sha256"]


def test_module_data_examples_call_the_modules_own_samples_by_name() -> None:
    modules = list(generate_modules(100, seed=0, names=True, examples=2, module_data=True))
    results, calls = _doctests(modules)
    assert results.failed == 0 and results.attempted == len(calls)
    assert all(re.fullmatch(r"\w+\((NUMBERS|TEXT)_[12]\)( is None)?\n", call) for call in calls)
    for module in modules:  # the data opens the module, two blank lines before its one or two functions
        head = module.split("\n\n\n")[0]
        assert re.fullmatch(r"NUMBERS_1 = \[.*\]\nTEXT_1 = '.*'\nNUMBERS_2 = \[.*\]\nTEXT_2 = '.*'", head)
        assert has_module_data(module) and module.count("\n\n\ndef ") == module.count("def ") in (1, 2)
        assert "\n\n\n\n" not in module
    assert len({m.split("\n\n\n")[0] for m in modules}) == len(modules)
    assert not any(has_module_data(m) for m in generate_modules(20, seed=0, examples=2))


def test_a_code_prompt_of_a_module_with_data_keeps_the_data() -> None:
    """Code prompts keep 600 characters of context, but a module whose examples call its data keeps it whole."""
    rng = random.Random(0)
    for module in generate_modules(200, seed=0, names=True, examples=2, module_data=True):
        cut = cut_prompt("code", module, rng, max_chars=100)
        if cut:
            prompt, rest = cut
            assert prompt.startswith("NUMBERS_1 = [") and prompt + rest == module
