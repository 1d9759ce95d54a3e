"""Seeded generator of multi-step arithmetic word problems with worked solutions.

The problems have the shape of GSM8K: a ``Question:`` line, then an ``Answer:`` with one
sentence per step, each carrying a calculator annotation ``<<expr=value>>``, and a final
``#### value`` line. Every template draws its numbers so that every intermediate value is a
non-negative integer, which keeps the worked solutions exactly checkable
(``check_solution``) and makes the answer text highly predictable for a target that has
learned the templates, which is the regime where a block-diffusion drafter shines.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["MathProblem", "TEMPLATES", "generate_problem", "generate_problems", "check_solution"]

NAMES = (
    "Ada", "Ben", "Carla", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kira",
    "Liam", "Maya", "Noor", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tara", "Umar", "Vera",
    "Wen", "Xavi", "Yara", "Zane", "Aiko", "Bruno", "Chloe", "Diego", "Emma", "Felix", "Gita",
    "Hugo", "Ivy", "Jonas", "Lena", "Mateo", "Nina", "Oscar",
)
ITEMS = (
    ("notebook", "notebooks"), ("pencil", "pencils"), ("apple", "apples"), ("cookie", "cookies"),
    ("ticket", "tickets"), ("book", "books"), ("candle", "candles"), ("marble", "marbles"),
    ("sticker", "stickers"), ("muffin", "muffins"), ("shirt", "shirts"), ("plant", "plants"),
)
PLACES = ("the market", "the bakery", "the bookstore", "the fair", "the garden shop", "the school store")


@dataclass(frozen=True)
class MathProblem:
    """One word problem: the question, the worked solution text and the final answer."""

    template: str
    """Name of the template that produced it."""
    question: str
    """The problem statement (no ``Question:`` prefix)."""
    solution: str
    """Worked solution: step lines with ``<<expr=value>>`` annotations and a ``#### value`` line."""
    answer: int
    """The final answer, computed independently of the solution text."""

    @property
    def text(self) -> str:
        """The document as it appears in the corpus."""
        return f"Question: {self.question}\nAnswer: {self.solution}"


def _step(text: str, expr: str, value: int) -> str:
    """One solution sentence: ``text`` followed by ``expr = <<expr=value>>value``."""
    return f"{text} {expr} = <<{expr}={value}>>{value}"


def _two_people(rng: random.Random) -> tuple[str, str]:
    a, b = rng.sample(NAMES, 2)
    return a, b


def _shopping(rng: random.Random, scale: int = 1) -> tuple[str, list[str], int]:
    name = rng.choice(NAMES)
    (s1, p1), (s2, p2) = rng.sample(ITEMS, 2)
    n1, c1, n2, c2 = rng.randint(2, 9), rng.randint(2, 15 * scale), rng.randint(2, 9), rng.randint(2, 15 * scale)
    t1, t2 = n1 * c1, n2 * c2
    total = t1 + t2
    bill = (total // 50 + 1) * 50
    change = bill - total
    q = (f"{name} buys {n1} {p1} at ${c1} each and {n2} {p2} at ${c2} each at {rng.choice(PLACES)}. "
         f"{name} pays with ${bill}. How much change does {name} get?")
    steps = [
        _step(f"The {p1} cost", f"{n1}*{c1}", t1) + " dollars.",
        _step(f"The {p2} cost", f"{n2}*{c2}", t2) + " dollars.",
        _step("Together they cost", f"{t1}+{t2}", total) + " dollars.",
        _step(f"{name} gets back", f"{bill}-{total}", change) + " dollars.",
    ]
    return q, steps, change


def _sharing(rng: random.Random, scale: int = 1) -> tuple[str, list[str], int]:
    name = rng.choice(NAMES)
    s, p = rng.choice(ITEMS)
    friends, each = rng.randint(2, 8), rng.randint(2, 9 * scale)
    given = friends * each
    start = given + rng.randint(3, 60 * scale)
    bought = rng.randint(5, 40 * scale)
    left = start - given
    end = left + bought
    q = (f"{name} has {start} {p}. {name} gives {each} {p} to each of {friends} friends and then buys "
         f"{bought} more {p}. How many {p} does {name} have now?")
    steps = [
        _step(f"{name} gives away", f"{friends}*{each}", given) + f" {p}.",
        _step(f"{name} has", f"{start}-{given}", left) + f" {p} left.",
        _step("After buying more,", f"{left}+{bought}", end) + f" {p}.",
    ]
    return q, steps, end


def _reading(rng: random.Random, scale: int = 1) -> tuple[str, list[str], int]:
    name = rng.choice(NAMES)
    per_day, days, weekend = rng.randint(5, 30 * scale), rng.randint(3, 12), rng.randint(10, 50 * scale)
    read = per_day * days
    total_read = read + weekend
    pages = total_read + rng.randint(10, 300 * scale)
    left = pages - total_read
    q = (f"A book has {pages} pages. {name} reads {per_day} pages every day for {days} days and then "
         f"{weekend} pages on the weekend. How many pages are left to read?")
    steps = [
        _step(f"On weekdays {name} reads", f"{per_day}*{days}", read) + " pages.",
        _step("In total that is", f"{read}+{weekend}", total_read) + " pages.",
        _step("The pages left are", f"{pages}-{total_read}", left) + " pages.",
    ]
    return q, steps, left


def _wages(rng: random.Random, scale: int = 1) -> tuple[str, list[str], int]:
    name = rng.choice(NAMES)
    rate, hours, days = rng.randint(8, 30 * scale), rng.randint(2, 8), rng.randint(2, 6)
    daily = rate * hours
    earned = daily * days
    spent = rng.randint(1, earned - 1)
    saved = earned - spent
    q = (f"{name} earns ${rate} an hour and works {hours} hours a day for {days} days. "
         f"{name} spends ${spent} on groceries. How much money does {name} save?")
    steps = [
        _step(f"Each day {name} earns", f"{rate}*{hours}", daily) + " dollars.",
        _step(f"Over {days} days {name} earns", f"{daily}*{days}", earned) + " dollars.",
        _step(f"{name} saves", f"{earned}-{spent}", saved) + " dollars.",
    ]
    return q, steps, saved


def _comparison(rng: random.Random, scale: int = 1) -> tuple[str, list[str], int]:
    a, b = _two_people(rng)
    c = rng.choice([n for n in NAMES if n not in (a, b)])
    s, p = rng.choice(ITEMS)
    x, k = rng.randint(3, 40 * scale), rng.randint(2, 5)
    bx = k * x
    fewer = rng.randint(1, bx - 1)
    cx = bx - fewer
    ab = x + bx
    total = ab + cx
    q = (f"{a} has {x} {p}. {b} has {k} times as many {p} as {a}, and {c} has {fewer} fewer {p} than {b}. "
         f"How many {p} do they have altogether?")
    steps = [
        _step(f"{b} has", f"{k}*{x}", bx) + f" {p}.",
        _step(f"{c} has", f"{bx}-{fewer}", cx) + f" {p}.",
        _step(f"{a} and {b} have", f"{x}+{bx}", ab) + f" {p}.",
        _step("Altogether they have", f"{ab}+{cx}", total) + f" {p}.",
    ]
    return q, steps, total


def _discount(rng: random.Random, scale: int = 1) -> tuple[str, list[str], int]:
    name = rng.choice(NAMES)
    s, p = rng.choice(ITEMS)
    pct = rng.choice((10, 20, 25, 50))
    price = rng.randint(1, 40 * scale) * (100 // _gcd(pct, 100))
    off = price * pct // 100
    sale = price - off
    n = rng.randint(2, 9)
    total = sale * n
    article = "An" if s[0] in "aeiou" else "A"
    q = (f"{article} {s} costs ${price}. It is on sale for {pct}% off. {name} buys {n} {p} at the sale price. "
         f"How much does {name} pay?")
    steps = [
        _step("The discount is", f"{price}*{pct}/100", off) + " dollars.",
        _step(f"One {s} costs", f"{price}-{off}", sale) + " dollars on sale.",
        _step(f"{name} pays", f"{sale}*{n}", total) + " dollars.",
    ]
    return q, steps, total


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _classroom(rng: random.Random, scale: int = 1) -> tuple[str, list[str], int]:
    k = rng.choice((2, 3, 4, 5))
    groups = rng.randint(2, 30 * scale)
    students = k * 2 * groups
    club = students // k
    rest = students - club
    half = rest // 2
    q = (f"A class has {students} students. One in every {k} students joins the chess club, and half of "
         f"the remaining students join the choir. How many students join the choir?")
    steps = [
        _step("The chess club gets", f"{students}/{k}", club) + " students.",
        _step("The remaining students are", f"{students}-{club}", rest) + ".",
        _step("The choir gets", f"{rest}/2", half) + " students.",
    ]
    return q, steps, half


def _travel(rng: random.Random, scale: int = 1) -> tuple[str, list[str], int]:
    name = rng.choice(NAMES)
    v1, h1, v2, h2 = rng.randint(20, 90 * scale), rng.randint(2, 6), rng.randint(10, 60 * scale), rng.randint(2, 5)
    d1, d2 = v1 * h1, v2 * h2
    total = d1 + d2
    q = (f"{name} drives at {v1} miles per hour for {h1} hours, then at {v2} miles per hour for {h2} hours. "
         f"How many miles does {name} travel in total?")
    steps = [
        _step("The first part is", f"{v1}*{h1}", d1) + " miles.",
        _step("The second part is", f"{v2}*{h2}", d2) + " miles.",
        _step(f"In total {name} travels", f"{d1}+{d2}", total) + " miles.",
    ]
    return q, steps, total


TEMPLATES: dict[str, Callable[[random.Random, int], tuple[str, list[str], int]]] = {
    "shopping": _shopping,
    "sharing": _sharing,
    "reading": _reading,
    "wages": _wages,
    "comparison": _comparison,
    "discount": _discount,
    "classroom": _classroom,
    "travel": _travel,
}
"""Template name -> generator `(rng, scale)` returning (question, solution step lines, answer); `scale` multiplies
the upper bound of each independently drawn magnitude (prices, rates, speeds, page and item counts), so the
worked products take more digits than a target recalls from a table."""


def generate_problem(rng: random.Random, scale: int = 1) -> MathProblem:
    """Draw one problem from a uniformly chosen template, its magnitudes drawn up to `scale` times the default
    bounds (1: the default problems, draw for draw)."""
    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise ValueError(f"corpus.math_scale: expected an integer >= 1, got {scale!r}")
    name = rng.choice(sorted(TEMPLATES))
    question, steps, answer = TEMPLATES[name](rng, scale)
    solution = "\n".join(steps) + f"\n#### {answer}"
    return MathProblem(template=name, question=question, solution=solution, answer=answer)


def generate_problems(n: int, seed: int, scale: int = 1) -> Iterator[MathProblem]:
    """``n`` problems from one seeded stream (the same seed and scale always give the same problems)."""
    rng = random.Random(seed)
    for _ in range(n):
        yield generate_problem(rng, scale)


_ANNOT = re.compile(r"<<([0-9+\-*/ ]+)=(-?\d+)>>(-?\d+)")
_FINAL = re.compile(r"^#### (-?\d+)$", re.MULTILINE)


def _eval_arith(expr: str) -> int:
    """Evaluate ``a op b op c ...`` left to right with * and / binding tighter (exact integers only)."""
    tokens = re.findall(r"\d+|[+\-*/]", expr)
    # Reduce * and / first, then + and -; division must be exact.
    stack: list[int | str] = [int(tokens[0])]
    for op, num in zip(tokens[1::2], tokens[2::2]):
        n = int(num)
        if op in "*/":
            left = stack.pop()
            assert isinstance(left, int)
            if op == "/" and (n == 0 or left % n):
                raise ValueError(f"inexact division in {expr!r}")
            stack.append(left * n if op == "*" else left // n)
        else:
            stack.extend([op, n])
    value = stack[0]
    assert isinstance(value, int)
    for op, n in zip(stack[1::2], stack[2::2]):
        assert isinstance(n, int)
        value = value + n if op == "+" else value - n
    return value


def check_solution(text: str) -> int:
    """Verify every ``<<expr=value>>value`` annotation numerically; return the ``####`` answer.

    Raises ``ValueError`` on a wrong step, a missing final answer, or a final answer that is
    not the last step's value.
    """
    steps = _ANNOT.findall(text)
    if not steps:
        raise ValueError("no calculator annotations")
    for expr, value, shown in steps:
        if _eval_arith(expr) != int(value) or value != shown:
            raise ValueError(f"wrong step {expr}={value} (shown {shown})")
    final = _FINAL.findall(text)
    if len(final) != 1:
        raise ValueError("expected exactly one '#### answer' line")
    if int(final[0]) != int(steps[-1][1]):
        raise ValueError("final answer differs from the last step")
    return int(final[0])
