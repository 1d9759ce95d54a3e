"""Seeded generator of small Python modules of HumanEval-shaped functions.

Each function has a typed signature, a one-line docstring that says what it returns, and a body in one
house style. It stands for the code an instruction-tuned model writes when asked for a function, as
``mathgen`` stands for worked arithmetic: the name says what the docstring will say and the docstring
what the body will be, so after a ``def`` header the continuation is predictable for a target that has
learned the style. It is no copy machine: predicates, operations, constants, parameter names and two
equivalent body styles (a loop or a comprehension, a choice the header does not reveal) combine freely,
and the code prompts cut at any header of a module, with the module's earlier functions as context.
With ``names`` the local names are free too (``x`` may be ``n`` or ``value``, ``result`` ``out``): a choice no
header or docstring decides, which a real model's code is full of, and where a drafter that follows the target
everywhere else must guess.
With ``examples`` each docstring ends with that many doctest examples, a call on drawn arguments and the value
it returns, as HumanEval's prompts carry them: the value is computed by running the function, so a target
writing its own examples must work them out (as ``mathgen``'s results) and a drafter cannot copy them.
Every generated module is valid Python whose functions return what their docstrings say, examples included
(``tests/test_testbed_codegen.py`` executes them and runs their doctests).
A greedy target writing its own examples calls a few modal arguments, whose values a drafter learns with them;
with ``module_data`` a module opens with its own sample data (``NUMBERS_1 = [...]``, ``TEXT_1 = '...'``) and every
example calls its function on that data by name, so the values depend on what the prompt holds, not on a mode.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator

__all__ = ["DATA_FUNCTIONS", "FAMILIES", "generate_function", "generate_module", "generate_modules", "has_module_data"]

# (name part, docstring phrase, condition on x); "{k}" is a drawn constant
_NUMBER_TESTS = (
    ("even", "even", "x % 2 == 0"),
    ("odd", "odd", "x % 2 == 1"),
    ("positive", "positive", "x > 0"),
    ("negative", "negative", "x < 0"),
    ("above_{k}", "greater than {k}", "x > {k}"),
    ("below_{k}", "less than {k}", "x < {k}"),
    ("multiples_of_{k}", "divisible by {k}", "x % {k} == 0"),
)
# (name part, docstring phrase, expression of x)
_NUMBER_MAPS = (
    ("double", "doubled", "x * 2"),
    ("square", "squared", "x * x"),
    ("negate", "negated", "-x"),
    ("add_{k}", "increased by {k}", "x + {k}"),
    ("scale_by_{k}", "multiplied by {k}", "x * {k}"),
)
# (name part, docstring phrase, condition on ch)
_CHAR_TESTS = (
    ("vowels", "a vowel", 'ch in "aeiou"'),
    ("digits", "a digit", "ch.isdigit()"),
    ("uppercase", "an uppercase letter", "ch.isupper()"),
    ("spaces", "a space", 'ch == " "'),
    ("letters", "a letter", "ch.isalpha()"),
)
# (name part, docstring phrase, expression of word)
_WORD_MAPS = (
    ("capitalize_words", "every word capitalized", "word.capitalize()"),
    ("reverse_words", "every word reversed", "word[::-1]"),
    ("upper_words", "every word in upper case", "word.upper()"),
    ("strip_words", "every word stripped of punctuation", 'word.strip(".,;:!?")'),
)
_LISTS = ("numbers", "values", "items", "scores")
# example arguments: lists of a few small ints, texts of a few words with the capitals, digits and punctuation
# the character and word families test for
_EXAMPLE_INTS = (-9, 30)
_EXAMPLE_WORDS = ("apple", "Bread", "cat", "dog", "Eagle", "sky,", "moon.", "Tea", "river", "stone!", "owl",
                  "42", "7", "blue", "Green", "rain;", "sun", "ice")
_TEXTS = ("text", "line", "sentence")

# every local name a body uses -> the names a function may use in its place (``names``); the sets are disjoint
# and none is a parameter name or a builtin the bodies call
_LOCALS = {
    "x": ("x", "n", "v", "value", "num"), "ch": ("ch", "c", "char"), "word": ("word", "w", "token"),
    "count": ("count", "hits", "found"), "result": ("result", "out", "kept"), "total": ("total", "acc", "running"),
    "best": ("best", "top", "largest"), "words": ("words", "parts", "pieces"), "counts": ("counts", "freq", "tally"),
}
_LOCAL = re.compile(r"\b(" + "|".join(_LOCALS) + r")\b")

Function = tuple[str, str, list[str]]
"""(header line, docstring line, body lines), all unindented."""


def _filled(rng: random.Random, table: tuple[tuple[str, str, str], ...]) -> tuple[str, str, str]:
    name, phrase, expr = rng.choice(table)
    k = str(rng.randint(2, 20))
    return name.replace("{k}", k), phrase.replace("{k}", k), expr.replace("{k}", k)


def _either(rng: random.Random, short: str, loop: list[str]) -> list[str]:
    """One body or the other at a coin's toss: the header does not say which style a function is in."""
    return [short] if rng.random() < 0.5 else loop


def _count(rng: random.Random) -> Function:
    name, phrase, cond = _filled(rng, _NUMBER_TESTS)
    xs = rng.choice(_LISTS)
    body = _either(rng, f"return sum(1 for x in {xs} if {cond})",
                   ["count = 0", f"for x in {xs}:", f"    if {cond}:", "        count += 1", "return count"])
    return f"def count_{name}({xs}: list[int]) -> int:", f"Return how many of the {xs} are {phrase}.", body


def _keep(rng: random.Random) -> Function:
    name, phrase, cond = _filled(rng, _NUMBER_TESTS)
    xs = rng.choice(_LISTS)
    body = _either(rng, f"return [x for x in {xs} if {cond}]",
                   ["result = []", f"for x in {xs}:", f"    if {cond}:", "        result.append(x)", "return result"])
    return (f"def keep_{name}({xs}: list[int]) -> list[int]:", f"Return the {xs} that are {phrase}, in order.",
            body)


def _total(rng: random.Random) -> Function:
    name, phrase, cond = _filled(rng, _NUMBER_TESTS)
    xs = rng.choice(_LISTS)
    body = _either(rng, f"return sum(x for x in {xs} if {cond})",
                   ["total = 0", f"for x in {xs}:", f"    if {cond}:", "        total += x", "return total"])
    return f"def sum_{name}({xs}: list[int]) -> int:", f"Return the sum of the {xs} that are {phrase}.", body


def _first(rng: random.Random) -> Function:
    name, phrase, cond = _filled(rng, _NUMBER_TESTS)
    xs = rng.choice(_LISTS)
    body = [f"for i, x in enumerate({xs}):", f"    if {cond}:", "        return i", "return -1"]
    return (f"def first_{name}_index({xs}: list[int]) -> int:",
            f"Return the index of the first of the {xs} that is {phrase}, or -1 if there is none.", body)


def _every(rng: random.Random) -> Function:
    name, phrase, cond = _filled(rng, _NUMBER_TESTS)
    xs = rng.choice(_LISTS)
    if rng.random() < 0.5:
        return (f"def all_{name}({xs}: list[int]) -> bool:", f"Return True if all of the {xs} are {phrase}.",
                [f"return all({cond} for x in {xs})"])
    return (f"def any_{name}({xs}: list[int]) -> bool:", f"Return True if any of the {xs} is {phrase}.",
            [f"return any({cond} for x in {xs})"])


def _largest(rng: random.Random) -> Function:
    name, phrase, cond = _filled(rng, _NUMBER_TESTS)
    xs = rng.choice(_LISTS)
    body = ["best = None", f"for x in {xs}:", f"    if {cond} and (best is None or x > best):", "        best = x",
            "return best"]
    return (f"def largest_{name}({xs}: list[int]) -> int | None:",
            f"Return the largest of the {xs} that is {phrase}, or None if there is none.", body)


def _mapped(rng: random.Random) -> Function:
    name, phrase, expr = _filled(rng, _NUMBER_MAPS)
    xs = rng.choice(_LISTS)
    body = _either(rng, f"return [{expr} for x in {xs}]",
                   ["result = []", f"for x in {xs}:", f"    result.append({expr})", "return result"])
    return (f"def {name}_all({xs}: list[int]) -> list[int]:", f"Return a new list of the {xs}, each {phrase}.",
            body)


def _count_chars(rng: random.Random) -> Function:
    name, phrase, cond = rng.choice(_CHAR_TESTS)
    s = rng.choice(_TEXTS)
    body = _either(rng, f"return sum(1 for ch in {s} if {cond})",
                   ["count = 0", f"for ch in {s}:", f"    if {cond}:", "        count += 1", "return count"])
    return f"def count_{name}({s}: str) -> int:", f"Return how many characters of {s} are {phrase}.", body


def _remove_chars(rng: random.Random) -> Function:
    name, phrase, cond = rng.choice(_CHAR_TESTS)
    s = rng.choice(_TEXTS)
    return (f"def remove_{name}({s}: str) -> str:", f"Return {s} without the characters that are {phrase}.",
            [f'return "".join(ch for ch in {s} if not {cond})'])


def _map_words(rng: random.Random) -> Function:
    name, phrase, expr = rng.choice(_WORD_MAPS)
    s = rng.choice(_TEXTS)
    body = _either(rng, f'return " ".join({expr} for word in {s}.split())',
                   ["words = []", f"for word in {s}.split():", f"    words.append({expr})", 'return " ".join(words)'])
    return f"def {name}({s}: str) -> str:", f"Return {s} with {phrase}.", body


def _word_counts(rng: random.Random) -> Function:
    s = rng.choice(_TEXTS)
    body = ["counts = {}", f"for word in {s}.lower().split():", "    counts[word] = counts.get(word, 0) + 1",
            "return counts"]
    return (f"def word_counts({s}: str) -> dict[str, int]:",
            f"Return how many times each lower-cased word occurs in {s}.", body)


def _running_totals(rng: random.Random) -> Function:
    xs = rng.choice(_LISTS)
    body = ["result = []", "total = 0", f"for x in {xs}:", "    total += x", "    result.append(total)",
            "return result"]
    return (f"def running_totals({xs}: list[int]) -> list[int]:",
            f"Return the running totals of the {xs}: the i-th is the sum of the first i + 1.", body)


FAMILIES: tuple[Callable[[random.Random], Function], ...] = (
    _count, _keep, _total, _first, _every, _largest, _mapped, _count_chars, _remove_chars, _map_words,
    _word_counts, _running_totals,
)


def _renamed(rng: random.Random, body: list[str]) -> list[str]:
    """``body`` with each of its local names drawn anew, the same name at every use."""
    used = sorted({name for line in body for name in _LOCAL.findall(line)})
    pick = {name: rng.choice(_LOCALS[name]) for name in used}
    return [_LOCAL.sub(lambda m: pick[m.group(1)], line) for line in body]


DATA_FUNCTIONS = (1, 2)
"""Functions in a module that opens with its sample data: few, so that a prompt cut at any of its headers holds
the data and whole functions within the code prompts' context (``prompts.cut_prompt`` keeps such a module whole),
and a greedy answer ends soon after the asked-for function, as an instruction-tuned model's does."""
_DATA_START = "NUMBERS_1 = ["


def has_module_data(text: str) -> bool:
    """Whether ``text`` is a generated module that opens with its sample data (``module_data``)."""
    return text.startswith(_DATA_START)


def _takes_numbers(header: str) -> bool:
    return "list[int]" in header.split("->")[0]


def _numbers(rng: random.Random, lengths: tuple[int, int]) -> list[int]:
    return [rng.randint(*_EXAMPLE_INTS) for _ in range(rng.randint(*lengths))]


def _text(rng: random.Random, lengths: tuple[int, int]) -> str:
    return " ".join(rng.choice(_EXAMPLE_WORDS) for _ in range(rng.randint(*lengths)))


def _argument(rng: random.Random, header: str) -> list[int] | str:
    """One drawn argument of the type the function ``header`` takes (a list of ints, or a text)."""
    return _numbers(rng, (3, 6)) if _takes_numbers(header) else _text(rng, (2, 5))


def _module_data(rng: random.Random, n: int) -> dict[str, list[int] | str]:
    """The module's own sample data for ``n`` examples a function: ``NUMBERS_1``.. and ``TEXT_1``.. by name."""
    data: dict[str, list[int] | str] = {}
    for i in range(1, n + 1):
        data[f"NUMBERS_{i}"], data[f"TEXT_{i}"] = _numbers(rng, (5, 8)), _text(rng, (4, 7))
    return data


def _examples(rng: random.Random, header: str, body: list[str], n: int,
              data: dict[str, list[int] | str] | None = None) -> list[str]:
    """``n`` doctest examples, as line pairs (call, value), for the function ``header`` and ``body`` define, each
    value what running it returns. Drawn arguments: a call returning None (no doctest output line) is drawn
    again, up to 64 times. With ``data`` (the module's sample data) the i-th example calls the function on the
    module's i-th sample of its type by name, and a None is written as ``... is None`` / ``True``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"corpus.code_examples: expected an integer >= 0, got {n!r}")
    name = header[4:header.index("(")]
    namespace: dict[str, object] = {}
    exec("\n".join([header, *("    " + line for line in body)]), namespace)  # our own generated source
    run = lambda arg: namespace[name](arg.copy() if isinstance(arg, list) else arg)  # noqa: E731
    lines: list[str] = []
    for i in range(1, n + 1):
        if data is not None:
            var = f"{'NUMBERS' if _takes_numbers(header) else 'TEXT'}_{i}"
            value = run(data[var])
            lines += [f">>> {name}({var}) is None", "True"] if value is None else [f">>> {name}({var})", repr(value)]
            continue
        for _ in range(64):
            arg = _argument(rng, header)
            value = run(arg)
            if value is not None:
                lines += [f">>> {name}({arg!r})", repr(value)]
                break
    return lines


def generate_function(rng: random.Random, names: bool = False, examples: int = 0,
                      data: dict[str, list[int] | str] | None = None) -> str:
    """One function's source: its header, its docstring and its body, at module level. ``names``: local
    names drawn per function (``_LOCALS``) instead of the house style's fixed ones; ``examples``: doctest
    examples at the end of the docstring (none: the docstring is its one line), on drawn arguments or, with
    ``data``, on the module's sample data."""
    header, doc, body = rng.choice(FAMILIES)(rng)
    if names:
        body = _renamed(rng, body)
    docstring = [f'    """{doc}"""']
    if examples:
        lines = _examples(rng, header, body, examples, data)
        docstring = [f'    """{doc}', "", *("    " + line for line in lines), '    """']
    return "\n".join([header, *docstring, *("    " + line for line in body)]) + "\n"


def generate_module(rng: random.Random, functions: tuple[int, int] = (3, 6), names: bool = False,
                    examples: int = 0, module_data: bool = False) -> str:
    """A module of a few functions with distinct names, two blank lines apart (PEP 8). ``module_data`` (with
    ``examples``): the module opens with its sample data, which every example calls its function on, and holds
    ``DATA_FUNCTIONS`` functions instead of ``functions``."""
    data = _module_data(rng, examples) if module_data and examples else None
    seen, parts = set(), []
    if data:
        parts.append("".join(f"{var} = {value!r}\n" for var, value in data.items()))
        functions = DATA_FUNCTIONS
    for _ in range(rng.randint(*functions)):
        source = generate_function(rng, names, examples, data)
        name = source[4:source.index("(")]
        if name not in seen:
            seen.add(name)
            parts.append(source)
    return "\n\n".join(parts)


def generate_modules(n: int, seed: int, names: bool = False, examples: int = 0,
                     module_data: bool = False) -> Iterator[str]:
    """``n`` modules; module ``i`` depends only on ``seed``, ``i``, ``names``, ``examples`` and ``module_data``, so
    any prefix of a run is the same (without these options the draws, and so the modules, are those of a
    generator that has none of them)."""
    for i in range(n):
        yield generate_module(random.Random(f"{seed}:codegen:{i}"), names=names, examples=examples,
                              module_data=module_data)
