"""The agentic category: transcripts of real standard-library calls that switch regime within a sequence."""

from __future__ import annotations

import inspect
import json
import random

import pytest

from whiflash.testbed.acceptance import switching
from whiflash.testbed.agentgen import generate_transcript, generate_transcripts, tools
from whiflash.testbed.prompts import cut_prompt


def _steps(text: str) -> list[tuple[dict, object]]:
    lines = text.splitlines()
    calls = [json.loads(line[len("Call: "):]) for line in lines if line.startswith("Call: ")]
    results = [json.loads(line[len("Result: "):]) for line in lines if line.startswith("Result: ")]
    assert len(calls) == len(results) >= 2
    return list(zip(calls, results))


def test_tools_have_real_signatures() -> None:
    offered = {t.name: t for t in tools()}
    assert len(offered) >= 20 and {"posixpath.join", "calendar.monthrange", "math.comb"} <= set(offered)
    # parameter names as the standard library spells them (a few fixed, independent of Tool's code)
    assert offered["posixpath.join"].params[:2] == ["a", "p"]
    assert offered["calendar.monthrange"].params == ["year", "month"]
    assert offered["math.comb"].params[:2] == ["n", "k"]
    rng = random.Random(0)
    for tool in offered.values():
        assert tool.signature == inspect.signature(tool.func)
        tool.signature.bind(*tool.make_args(rng))  # the arguments it draws fit the real signature
        assert tool.summary and "\n" not in tool.summary


def test_calls_name_real_parameters_and_results_are_the_librarys() -> None:
    offered = {t.name: t for t in tools()}
    for text in generate_transcripts(50, seed=3):
        assert text.startswith("Tools:\n") and "\nUser: " in text and "\nAnswer: " in text
        for call, result in _steps(text):
            tool = offered[call["name"]]
            assert set(call["arguments"]) <= set(tool.params)
            values: list = []  # positional values in signature order (*args spread out)
            for name, param in inspect.signature(tool.func).parameters.items():
                if name in call["arguments"]:
                    v = call["arguments"][name]
                    values += v if param.kind is inspect.Parameter.VAR_POSITIONAL else [v]
            assert json.loads(json.dumps(tool.func(*values), default=str)) == result
            # Every argument value was stated by the user: the call copies it (the structured span).
            user = next(line for line in text.splitlines() if line.startswith("User: "))
            for k, v in call["arguments"].items():
                assert f"{k}={json.dumps(v, ensure_ascii=False)}" in user


def test_transcripts_are_seeded() -> None:
    assert list(generate_transcripts(5, seed=1)) == list(generate_transcripts(5, seed=1))
    assert list(generate_transcripts(5, seed=1)) != list(generate_transcripts(5, seed=2))


def test_agentic_prompts_end_at_a_thought_label() -> None:
    text = generate_transcript(random.Random(0))
    cuts = set()
    for i in range(20):
        prompt, rest = cut_prompt("agentic", text, random.Random(i))
        assert prompt + rest == text and prompt.endswith("\nThought:") and "\nCall: " in rest
        cuts.add(len(prompt))
    assert len(cuts) >= 2  # any step but the closing one can be the cut


def test_switching_counts_wins_per_sequence() -> None:
    # slot 0 = DFlash, slot 1 = EAGLE-3; a tie is nobody's win.
    seqs = [[(5, 1), (1, 3), (2, 2), (6, 1), (1, 2)],  # both win >= 20%: switches
            [(4, 1), (4, 1), (4, 1), (1, 2), (3, 3), (3, 3)]]  # EAGLE-3 wins 1 of 6 rounds (< 20%)
    s = switching(seqs)
    assert s["switching_sequences"] == pytest.approx(0.5)
    assert s["dflash_wins"] == pytest.approx(5 / 11, abs=1e-3) and s["eagle3_wins"] == pytest.approx(3 / 11, abs=1e-3)
    assert s["ties"] == pytest.approx(3 / 11, abs=1e-3)
    assert switching([])["switching_sequences"] == 0.0


def test_thoughts_quote_their_own_pool() -> None:
    pools = {0: ["Alpha sentence one is a quoted line.", "Alpha sentence two is another line."],
             1: ["Beta sentence one is a quoted line.", "Beta sentence two is another line."]}
    texts = list(generate_transcripts(20, seed=0, pool_of=lambda i: pools[i % 2]))
    for i, text in enumerate(texts):
        own, other = ("Alpha", "Beta") if i % 2 == 0 else ("Beta", "Alpha")
        assert f"{own} sentence" in text and f"{other} sentence" not in text


def _by_split(docs: list, cfg, category: str, pieces) -> dict[str, set[str]]:
    """What agent transcripts of each split may quote: `pieces(text)` of that split's `category` documents."""
    from whiflash.testbed.corpus import assign_split

    out: dict[str, set[str]] = {}
    for d in docs:
        if d.category == category:
            out.setdefault(assign_split(d.group, cfg), set()).update(pieces(d.text))
    return out


@pytest.fixture(scope="module")
def micro_docs() -> list:
    """The documents of ``micro``'s corpus, collected once (seconds each time) for the tests that only read them."""
    from whiflash.testbed.corpus import collect_documents
    from whiflash.testbed.presets import get_preset

    return list(collect_documents(get_preset("micro").corpus))


def test_held_out_transcripts_quote_only_held_out_prose(micro_docs: list) -> None:
    """A transcript quotes prose of its own split: none leaks held-out docstrings into training or back."""
    from whiflash.testbed.agentgen import sentences
    from whiflash.testbed.corpus import _background, assign_split
    from whiflash.testbed.presets import get_preset

    cfg = get_preset("micro").corpus
    docs = micro_docs
    by_split = _by_split(docs, cfg, "prose", _background)
    quoted = 0
    for d in (d for d in docs if d.category == "agentic"):
        split = assign_split(d.group, cfg)
        foreign = set().union(*(v for k, v in by_split.items() if k != split)) - by_split[split]
        for line in d.text.splitlines():
            if line.startswith("Thought: "):
                found = set(sentences(line[len("Thought: "):]))
                assert not found & foreign, (d.id, found & foreign)
                quoted += len(found & by_split[split])
    assert quoted > 100


def test_code_excerpts_come_from_the_transcripts_own_split(micro_docs: list) -> None:
    """With `agent_code_excerpts`, thoughts end with library code of their own split (off: no code at all)."""
    from whiflash.testbed.agentgen import _CODE_INTROS
    from whiflash.testbed.corpus import _snippets, assign_split, collect_documents
    from whiflash.testbed.presets import apply_overrides, get_preset

    cfg = apply_overrides(get_preset("micro"), ["corpus.agent_code_excerpts=1.0"]).corpus
    docs = list(collect_documents(cfg))
    by_split = _by_split(docs, cfg, "code", _snippets)
    shown = 0
    for d in (d for d in docs if d.category == "agentic"):
        split = assign_split(d.group, cfg)
        for block in d.text.split("\nThought: ")[1:-1]:  # every step's thought, up to its call
            snippet = block.split("\nCall: ")[0].split("\n", 2)[2]
            assert snippet in by_split[split], (d.id, snippet)
            shown += 1
    assert shown > 1000
    plain = [d for d in micro_docs if d.category == "agentic"]
    assert not any(intro in d.text for d in plain for intro in _CODE_INTROS)


def test_explanations_answer_names_the_task_gives_from_the_transcripts_own_split(micro_docs: list) -> None:
    """With `agent_explanations`, each step's thought explains, in the chat house style, an object the task
    names, documented in a library file of the transcript's own split (off: no task asks for one)."""
    import re

    from whiflash.testbed.agentgen import explanation
    from whiflash.testbed.chatgen import documented
    from whiflash.testbed.corpus import _stdlib_files, assign_split, collect_documents, stdlib_root
    from whiflash.testbed.presets import apply_overrides, get_preset

    cfg = apply_overrides(get_preset("micro"), ["corpus.agent_explanations=1.0"]).corpus
    said: dict[str, dict[str, str]] = {}  # split -> dotted name -> what a thought says about it
    for rel, source in _stdlib_files(stdlib_root(), cfg.max_file_chars, cfg.include_tests):
        for item in documented(rel, source):
            if len(item.doc) >= cfg.min_docstring_chars and explanation(item):
                said.setdefault(assign_split(f"stdlib/{rel}", cfg), {})[item.dotted] = explanation(item)
    explained = 0
    for d in (d for d in collect_documents(cfg) if d.category == "agentic"):
        split = assign_split(d.group, cfg)
        task = next(line for line in d.text.splitlines() if line.startswith("User: "))
        names = re.findall(r"`([^`]+)`", task.split("Along the way, explain ")[1].split(". Summarise")[0])
        thoughts = d.text.split("\nThought: ")[1:-1]
        assert len(names) == len(thoughts)  # one per step, in step order
        for name, thought in zip(names, thoughts):
            assert f"`{name}`: {said[split][name]}" in thought, (d.id, name)
            explained += 1
    assert explained > 1000
    plain = [d for d in micro_docs if d.category == "agentic"]
    assert not any("Along the way, explain" in d.text for d in plain)
