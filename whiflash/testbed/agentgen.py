"""Seeded generator of agent transcripts: free prose interleaved with JSON tool calls.

An agentic sequence switches regime within itself, which is what a per-round router exists
for: ``Thought:`` lines are free English (the tool's documentation, background sentences drawn from
the corpus's own prose, reasoning) where every next word is uncertain, while ``Call:`` lines are JSON whose tool
name and argument names come from ``inspect.signature`` of real standard-library functions and
whose values were already stated in the task, and ``Result:`` lines hold what calling the
function really returned. A transcript looks like::

    Tools:
    {"name": "calendar.monthrange", "parameters": ["year", "month"], "description": "Return ..."}
    ...
    User: Find calendar.monthrange with year=1994, month=7, then ...
    Thought: <prose>
    Call: {"name": "calendar.monthrange", "arguments": {"year": 1994, "month": 7}}
    Result: [4, 31]
    ...
    Thought: The numbers add up: 4 + 31 = 35.
    Answer: calendar.monthrange gave [4, 31]; ...

Only pure, deterministic functions are offered as tools (arithmetic, paths, calendars, text
escaping); the generator calls each one, so every result is the library's own.

Background sentences come from a pool per transcript (``pool_of``): the corpus hands each transcript
the docstring sentences of its own split, so held-out transcripts quote held-out prose and stay as
uncertain as the prose category for a target that has learned the templates around them (without a
pool the sentences come from the tools' module documentation, a small set a deep target memorises).
Optionally (``code_share``: half the thoughts in ``small``, none in the other presets) a thought ends
with a few lines of its split's library code (``code_of``): held-out code stays uncertain even for a
deep target, a regime a strong target's greedy thoughts otherwise lack (docs/testbed.md).

A greedy target answers background it cannot know with its modal sentences, which every drafter learns.
With ``explain_share`` (``explain_of``: documented objects of the transcript's own split) the task also asks
the agent to explain some objects by name, and the step's thought does so in the chat house style
(``chatgen.introduce`` and the docstring's first paragraph) instead of quoting background: what the target
writes there depends on a name in the prompt, as a chat answer does, so it stays as uncertain as the chat
prose category for as long as the explanation lasts, between the JSON regimes before and after it.
"""

from __future__ import annotations

import importlib
import inspect
import json
import random
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from .chatgen import Documented, introduce

__all__ = ["Tool", "tools", "explanation", "generate_transcript", "generate_transcripts", "sentences"]

WORDS = ("alpha", "report", "budget", "notes", "draft", "summary", "orders", "archive", "config", "invoice",
         "backup", "photos", "music", "ledger", "schedule", "inventory", "results", "metrics", "readme", "index")
ROOTS = ("home/ada", "srv/data", "var/log", "opt/app", "tmp/work", "usr/share/doc", "mnt/disk", "etc/site")
EXTS = ("txt", "csv", "json", "py", "md", "log", "tar.gz", "html")
HOSTS = ("https://example.org", "https://docs.example.com", "http://intranet.local", "https://api.example.net")
PHRASES = ("the quick brown fox", "hello world again", "fish and chips", "a tale of two cities",
           "rock & roll <live>", "tom's \"best\" recipes", "one small step", "zen of python", "read the docs first")


def _path(rng: random.Random) -> str:
    return f"/{rng.choice(ROOTS)}/{rng.choice(WORDS)}/{rng.choice(WORDS)}.{rng.choice(EXTS)}"


def _ints(rng: random.Random, k: int, lo: int = 1, hi: int = 99) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(k)]


# Qualified name -> positional argument values for one call. Names resolve by import, so a
# function missing from an interpreter is simply not offered.
_ARGS: dict[str, Callable[[random.Random], list[Any]]] = {
    "math.comb": lambda r: [r.randint(5, 30), r.randint(1, 5)],
    "math.perm": lambda r: [r.randint(4, 15), r.randint(1, 4)],
    "math.factorial": lambda r: [r.randint(3, 12)],
    "math.isqrt": lambda r: [r.randint(10, 50_000)],
    "math.gcd": lambda r: [r.randint(2, 30) * r.randint(2, 12), r.randint(2, 30) * r.randint(2, 12)],
    "operator.add": lambda r: _ints(r, 2, 10, 999),
    "operator.sub": lambda r: sorted(_ints(r, 2, 10, 999), reverse=True),
    "operator.mul": lambda r: _ints(r, 2, 2, 99),
    "operator.floordiv": lambda r: [r.randint(100, 9999), r.randint(2, 40)],
    "operator.mod": lambda r: [r.randint(100, 9999), r.randint(2, 40)],
    "posixpath.join": lambda r: [f"/{r.choice(ROOTS)}", r.choice(WORDS), f"{r.choice(WORDS)}.{r.choice(EXTS)}"],
    "posixpath.basename": lambda r: [_path(r)],
    "posixpath.dirname": lambda r: [_path(r)],
    "posixpath.splitext": lambda r: [_path(r)],
    "posixpath.normpath": lambda r: [f"/{r.choice(ROOTS)}//{r.choice(WORDS)}/../{r.choice(WORDS)}/./x.{r.choice(EXTS)}"],
    "calendar.isleap": lambda r: [r.randint(1890, 2030)],
    "calendar.monthrange": lambda r: [r.randint(1950, 2030), r.randint(1, 12)],
    "calendar.weekday": lambda r: [r.randint(1950, 2030), r.randint(1, 12), r.randint(1, 28)],
    "string.capwords": lambda r: [r.choice(PHRASES)],
    "textwrap.shorten": lambda r: [" ".join(r.sample(PHRASES, 3)), r.randint(15, 40)],
    "shlex.quote": lambda r: [f"{r.choice(WORDS)} {r.choice(WORDS)}.{r.choice(EXTS)}"],
    "html.escape": lambda r: [r.choice(PHRASES)],
    "urllib.parse.quote": lambda r: [f"/{r.choice(WORDS)}/{r.choice(PHRASES)}"],
    "urllib.parse.urljoin": lambda r: [f"{r.choice(HOSTS)}/{r.choice(WORDS)}/", f"{r.choice(WORDS)}.html"],
    "statistics.median": lambda r: [_ints(r, r.choice((3, 5, 7)))],
    "statistics.mean": lambda r: [_ints(r, 4, 2, 50)],
    "heapq.nlargest": lambda r: [r.randint(2, 3), _ints(r, 6)],
    "bisect.bisect_left": lambda r: [sorted(_ints(r, 6)), r.randint(1, 99)],
    "fnmatch.fnmatch": lambda r: [f"{r.choice(WORDS)}.{r.choice(EXTS)}", f"*.{r.choice(EXTS)}"],
    "difflib.get_close_matches": lambda r: [r.choice(WORDS)[:-1] + "e", list(r.sample(WORDS, 6))],
    "re.escape": lambda r: [f"{r.choice(WORDS)}.{r.choice(EXTS)} (v{r.randint(1, 9)})"],
}

_THOUGHTS = (
    "I should break this into steps and do them one at a time.",
    "Before answering I want the exact value rather than a guess.",
    "It is easy to get this wrong by hand, so I will let the library do it.",
    "That settles the first part.",
    "The user asked for several things, so I will keep track of each result.",
    "Nothing here needs a network call; everything can be computed locally.",
    "I will double-check the arguments against the request before calling anything.",
    "The earlier result looks reasonable, so I can move on.",
    "This is a pure function, so calling it twice would give the same answer.",
    "A quick sanity check: the value has the type I expected.",
    "Let me look at what the documentation promises before relying on it.",
    "The order of the arguments matters here.",
    "I can reuse the value I already have instead of asking again.",
    "Once this is done only the summary is left.",
    "There is a subtle point about edge cases, but the inputs are ordinary.",
    "If this fails I will report the error instead of inventing a value.",
)
_BACKGROUND = ("Some background first:", "From what I remember of the documentation:", "Worth keeping in mind:",
               "A related note:", "For context:", "I also recall this:")
_CODE_INTROS = ("A similar piece of library code:", "For comparison, code that does something related:",
                "This is how related code in the library reads:")
_OPENERS = ("Next I need", "Now I want", "The next step is", "I still need", "Then I have to", "After that I need")
_EXPLAIN_INTROS = ("As asked, about", "The user also wants to know about", "Now the explanation of",
                   "Before the call, as requested:")


@dataclass(frozen=True)
class Tool:
    """A standard-library function offered to the agent."""

    name: str
    """Qualified name, e.g. ``posixpath.join``."""
    func: Callable[..., Any]
    """The function itself."""
    signature: inspect.Signature
    """Its real signature (parameter names in calls come from here)."""
    make_args: Callable[[random.Random], list[Any]]
    """Positional argument values for one call."""

    @property
    def params(self) -> list[str]:
        """Parameter names that a call can fill (``*args`` included, ``**kwargs`` not)."""
        return [p.name for p in self.signature.parameters.values() if p.kind is not p.VAR_KEYWORD]

    @property
    def summary(self) -> str:
        """First sentence of the function's docstring."""
        found = sentences(inspect.getdoc(self.func) or "")
        return found[0] if found else self.name

    def arguments(self, values: list[Any]) -> dict[str, Any]:
        """Bound arguments as a JSON object (``*args`` as a list)."""
        bound = self.signature.bind(*values)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in bound.arguments.items()}

    def call(self, values: list[Any]) -> Any:
        """The real result, made JSON-able (tuples become lists)."""
        return json.loads(json.dumps(self.func(*values), default=str))


def sentences(text: str) -> list[str]:
    """The sentences of a docstring-like text, whitespace flattened (fragments of 12 characters or fewer dropped)."""
    flat = re.sub(r"\s+", " ", text).strip()
    return [s for s in re.split(r"(?<=[.!?])\s+", flat) if len(s) > 12]


def _resolve(name: str) -> Callable[..., Any] | None:
    module, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return None


@cache
def tools() -> tuple[Tool, ...]:
    """Every tool this interpreter offers (functions without an introspectable signature are skipped)."""
    out = []
    for name, make in _ARGS.items():
        func = _resolve(name)
        if func is None:
            continue
        try:
            sig = inspect.signature(func)
        except (TypeError, ValueError):
            continue
        out.append(Tool(name, func, sig, make))
    return tuple(out)


@cache
def _module_sentences(module: str) -> tuple[str, ...]:
    """Documentation sentences of a module and its public functions (the agent "reads the docs")."""
    mod = importlib.import_module(module)
    docs = [inspect.getdoc(mod) or ""]
    docs += [inspect.getdoc(getattr(mod, n)) or "" for n in sorted(dir(mod))
             if not n.startswith("_") and callable(getattr(mod, n, None))]
    return tuple(s for d in docs for s in sentences(d) if len(s) < 240)


def _fmt(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _ask(tool: Tool, args: dict[str, Any]) -> str:
    return f"{tool.name} with " + ", ".join(f"{k}={_fmt(v)}" for k, v in args.items())


def explanation(item: Documented) -> str | None:
    """What a thought says about a documented object: the chat house style's introduction and the docstring's
    first paragraph on one line; None where that paragraph is too short to say anything or too long for a thought."""
    first = " ".join(item.doc.split("\n\n")[0].split())
    return f"{introduce(item)} {first}" if 40 <= len(first) <= 400 else None


def _thought(rng: random.Random, tool: Tool, first: bool, pool: Sequence[str], code: Sequence[str] = (),
             code_share: float = 0.0, explain: Documented | None = None) -> str:
    parts = [f"{'First I need' if first else rng.choice(_OPENERS)} {tool.name}. Its documentation says: "
             f"{tool.summary}"]
    if explain is not None:  # in place of background: an answer about a name the task gave
        parts.append(f"{rng.choice(_EXPLAIN_INTROS)} `{explain.dotted}`: {explanation(explain)}")
    elif pool:
        parts.append(f"{rng.choice(_BACKGROUND)} " + " ".join(rng.choice(pool) for _ in range(rng.randint(1, 3))))
    else:
        module = tool.name.rpartition(".")[0]
        extra = _module_sentences(module)
        if extra and rng.random() < 0.6:
            parts.append(f"The {module} documentation also notes: {rng.choice(extra)}")
    parts += rng.sample(_THOUGHTS, rng.randint(1, 2))
    text = " ".join(parts)
    if code and code_share > 0 and rng.random() < code_share:  # draws nothing when off: corpora stay the same
        text += f"\n{rng.choice(_CODE_INTROS)}\n{rng.choice(code)}"
    return text


def generate_transcript(rng: random.Random, pool: Sequence[str] = (), code: Sequence[str] = (),
                        code_share: float = 0.0, explain: Sequence[Documented] = (), explain_share: float = 0.0) -> str:
    """One transcript: a tool list, a task, 2-4 thought/call/result steps, arithmetic, an answer; thoughts
    quote background sentences from ``pool`` when given, and a share ``code_share`` of them end with a snippet
    from ``code``; with ``explain``, a share ``explain_share`` of the steps explain an object of it that the
    task names (``explanation``) in place of the background."""
    offered = tools()
    chosen = rng.sample(offered, rng.randint(2, min(4, len(offered))))
    values = [t.make_args(rng) for t in chosen]
    args = [t.arguments(v) for t, v in zip(chosen, values)]
    results = [t.call(v) for t, v in zip(chosen, values)]
    listed = rng.sample(offered, min(len(offered), len(chosen) + 2))
    listed = list(dict.fromkeys([*chosen, *listed]))[: len(chosen) + 2]
    rng.shuffle(listed)
    # draws nothing when off, so corpora without explanations stay the same
    asked = [rng.choice(explain) if explain and explain_share > 0 and rng.random() < explain_share else None
             for _ in chosen]
    named = [f"`{d.dotted}`" for d in asked if d is not None]
    lines = ["Tools:"]
    lines += [_fmt({"name": t.name, "parameters": t.params, "description": t.summary}) for t in listed]
    lines.append("User: Use " + ", then ".join(_ask(t, a) for t, a in zip(chosen, args)) + ". "
                 + (f"Along the way, explain {' and '.join(named)}. " if named else "") + "Summarise the results.")
    for i, (tool, a, res) in enumerate(zip(chosen, args, results)):
        lines.append(f"Thought: {_thought(rng, tool, i == 0, pool, code, code_share, asked[i])}")
        lines.append("Call: " + _fmt({"name": tool.name, "arguments": a}))
        lines.append(f"Result: {_fmt(res)}")
    numbers = [r for r in results if isinstance(r, int) and not isinstance(r, bool)]
    if len(numbers) >= 2:
        lines.append(f"Thought: The numeric results add up to {' + '.join(map(str, numbers))} = {sum(numbers)}.")
    else:
        lines.append(f"Thought: {rng.choice(_THOUGHTS)}")
    lines.append("Answer: " + "; ".join(f"{t.name} gave {_fmt(r)}" for t, r in zip(chosen, results)) + ".")
    return "\n".join(lines)


def generate_transcripts(n: int, seed: int, pool_of: Callable[[int], Sequence[str]] | None = None,
                         code_of: Callable[[int], Sequence[str]] | None = None, code_share: float = 0.0,
                         explain_of: Callable[[int], Sequence[Documented]] | None = None,
                         explain_share: float = 0.0) -> Iterator[str]:
    """``n`` transcripts, deterministic for a seed (and an interpreter version); transcript ``i`` quotes
    background sentences from ``pool_of(i)``, code snippets from ``code_of(i)`` and explains objects of
    ``explain_of(i)`` when given."""
    rng = random.Random(f"agentic:{seed}")
    for i in range(n):
        yield generate_transcript(rng, pool_of(i) if pool_of else (), code_of(i) if code_of else (), code_share,
                                  explain_of(i) if explain_of else (), explain_share)
