"""Chat-style prose: a documented standard-library object as one user-assistant exchange.

A real chat model is predictable on its own answers where it writes in its house style: it opens by
restating what it was asked, labels its sections, lists the names it was given, closes with a stock
offer. It is uncertain where it says something new. ``render`` writes a docstring that way::

    User: How do I use `json.dumps(obj, *, skipkeys=False)`?
    Assistant: Sure! `dumps` is a function in the `json` module. Its signature is `dumps(obj, *, skipkeys=False)`.

    Serialize ``obj`` to a JSON formatted ``str``.

    Some details:

    If ``skipkeys`` is true then ``dict`` keys that are not basic types ...

    The parameters are:
    - `obj`
    - `skipkeys`

    Let me know if you would like an example.

The docstring's own sentences stay as uncertain as the plain prose category; the frame around them
(opener, labels, the parameter list, when the question gave the signature) is what the target can
learn to say with confidence, in short spans, as an instruction-tuned model does. Templates are picked
by a seeded generator per document, so a corpus is a function of its seed.
"""

from __future__ import annotations

import ast
import copy
import random
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Documented", "documented", "introduce", "render", "render_topic", "ASSISTANT"]

ASSISTANT = "\nAssistant:"
"""Where a chat prompt ends: the answer is the continuation (`prompts.cut_prompt`)."""

_KIND_PHRASE = {"function": "a function in", "method": "a method of a class in", "class": "a class in",
                "module": "a module of"}
_QUESTIONS = {
    "function": ("What does `{name}` in `{module}` do?", "How do I use `{module}.{name}{sig}`?",
                 "Can you explain the `{name}` {kind} from the `{module}` module?",
                 "I found `{name}{sig}` in `{module}`. What is it for?"),
    "class": ("What is the `{name}` class in `{module}` for?", "How do I use `{module}.{name}{sig}`?",
              "Can you explain the `{name}` class from the `{module}` module?"),
    "module": ("What is the `{module}` module for?", "Give me an overview of the `{module}` module.",
               "Can you explain what `{module}` does?"),
}
_QUESTIONS["method"] = _QUESTIONS["function"]
_OPENERS = ("Sure! ", "Of course. ", "Good question. ", "")
_CLOSINGS = ("Let me know if you would like an example.", "I hope this helps!",
             "Feel free to ask if anything is unclear.", "")


@dataclass(frozen=True)
class Documented:
    """A module, class or function of a library file that has a docstring."""

    module: str
    """Dotted module name, e.g. ``json.decoder`` (``json`` for ``json/__init__.py``)."""
    name: str
    """Qualified name inside the module (``JSONDecoder.decode``); the module's own name for a module."""
    kind: str
    """``module``, ``class``, ``function`` or ``method``."""
    signature: str
    """``(a, b=1)`` for functions, the ``__init__`` arguments for classes, empty otherwise."""
    params: tuple[str, ...]
    """Argument names a caller passes (a method's receiver left out, as in ``signature``)."""
    doc: str
    """The cleaned docstring."""

    @property
    def dotted(self) -> str:
        """The name a user would ask about: ``json.decoder.JSONDecoder.decode``, a module's by its own name."""
        return self.module if self.kind == "module" else f"{self.module}.{self.name}"


def _module_name(rel: str) -> str:
    parts = rel.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def _arguments(args: ast.arguments) -> tuple[str, tuple[str, ...]]:
    """The signature text and argument names a caller sees: a method's receiver (a first positional ``self``
    or ``cls`` without a default) left out; a keyword ``cls=None`` is a real argument and stays."""
    shown = copy.copy(args)
    positional = [*args.posonlyargs, *args.args]
    if positional and positional[0].arg in ("self", "cls") and len(args.defaults) < len(positional):
        shown.posonlyargs, shown.args = (args.posonlyargs[1:], args.args) if args.posonlyargs else ([], args.args[1:])
    names = [a.arg for a in (*shown.posonlyargs, *shown.args, *shown.kwonlyargs)]
    names += [a.arg for a in (shown.vararg, shown.kwarg) if a is not None]
    return f"({ast.unparse(shown)})", tuple(names)


def documented(rel: str, source: str) -> Iterator[Documented]:
    """The documented objects of one library file (path ``rel`` relative to the library), in ``ast.walk``
    order: the order in which the corpus numbers its prose documents."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    module = _module_name(rel)
    qual: dict[ast.AST, str] = {}
    for node in ast.walk(tree):  # parents are visited before their children
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                qual[child] = f"{qual[node]}.{child.name}" if node in qual else child.name
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node, clean=True)
        if not doc:
            continue
        if isinstance(node, ast.Module):
            yield Documented(module, module, "module", "", (), doc)
        elif isinstance(node, ast.ClassDef):
            init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
            sig, params = _arguments(init.args) if init else ("", ())
            yield Documented(module, qual[node], "class", sig, params, doc)
        else:
            sig, params = _arguments(node.args)
            kind = "method" if "." in qual[node] else "function"
            yield Documented(module, qual[node], kind, sig, params, doc)


def _paragraphs(doc: str) -> list[str]:
    return [p.strip() for p in doc.split("\n\n") if p.strip()]


def _shown_signature(item: Documented) -> str:
    return item.signature if len(item.signature) <= 80 else ""


def introduce(item: Documented, opener: str = "") -> str:
    """The house style's first sentence(s) about ``item``: what it is, where it lives, its signature."""
    if item.kind == "module":
        package = item.module.rpartition(".")[0]
        where = f"the `{package}` package." if package else "the standard library."
    else:
        where = f"the `{item.module}` module."
    head = f"{opener}`{item.name}` is {_KIND_PHRASE[item.kind]} {where}"
    sig = _shown_signature(item)
    if sig:
        head += f" Its signature is `{item.name.rpartition('.')[2]}{sig}`."
    return head


def render(item: Documented, rng: random.Random) -> str:
    """One exchange: a question about ``item`` and an answer in a fixed house style around its docstring."""
    sig = _shown_signature(item)
    question = rng.choice(_QUESTIONS[item.kind]).format(name=item.name, module=item.module, sig=sig, kind=item.kind)
    head = introduce(item, rng.choice(_OPENERS))
    paras = _paragraphs(item.doc)
    lines = [f"User: {question}{ASSISTANT} {head}", "", paras[0]]
    if len(paras) > 1:
        lines += ["", "Some details:", "", "\n\n".join(paras[1:])]
    if item.params and sig:
        lines += ["", "The parameters are:", *(f"- `{p}`" for p in item.params)]
    closing = rng.choice(_CLOSINGS)
    if closing:
        lines += ["", closing]
    return "\n".join(lines)


def render_topic(title: str, text: str, rng: random.Random) -> str:
    """A reference topic of the language documentation (``pydoc_data``) as an exchange."""
    words = title.replace("-", " ").lower()
    question = rng.choice(("Can you explain {t} in Python?", "How does {t} work in Python?",
                           "Tell me about {t} in Python.")).format(t=words)
    return f"User: {question}{ASSISTANT} {rng.choice(_OPENERS)}Here is how {words} works in Python.\n\n{text}"
