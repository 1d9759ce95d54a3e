"""scripts/segment_tau.py: rounds labelled by the transcript segment they open in."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

_spec = importlib.util.spec_from_file_location("segment_tau", Path(__file__).parents[1] / "scripts/segment_tau.py")
segment_tau = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(segment_tau)
main, round_segments, segment, segment_table = (segment_tau.main, segment_tau.round_segments, segment_tau.segment,
                                                segment_tau.segment_table)


def _decode(ids: list[int]) -> str:  # one character a token
    return "".join(map(chr, ids))


def test_segments_follow_labels_and_explanations() -> None:
    assert segment("Thought: First I need x.") == "Thought"
    assert segment("Thought: First I need x. As asked, about `json.dumps`: `dumps` is") == "Thought/explain"
    assert segment("Thought: a\nCall: {\"name\"") == "Call"
    assert segment("Thought: a\nResult: 4\nThought: Now `a.b`: it\ndef f():\n    return") == "Thought/explain"
    assert segment("Thought: a `x` b\nAnswer: done") == "Answer"
    assert segment("Thought: a\nCall: {}", at=10) == "Call"  # a round that opens on a newline drafts the next line


def test_rounds_are_labelled_by_their_first_token_and_slots_counted(tmp_path, capsys) -> None:
    out = " I need f. As asked, about `m.f`: it adds.\nCall: {}\nResult: 3"
    ids = [ord(c) for c in out]
    cut = [10, out.index("`m.f`") + 7 - 10, out.index("\nCall") + 3 - out.index("`m.f`") - 7]
    cut.append(len(out) - sum(cut))
    assert round_segments(ids, cut, _decode) == ["Thought", "Thought", "Thought/explain", "Call"]
    rows = [{"category": "agentic", "method": "dflash", "taus": cut, "tokens": ids},
            {"category": "agentic", "method": "neural", "taus": cut, "tokens": ids, "slots": [0, 1, 1, 0],
             "slot_methods": ["dflash", "eagle3"]},
            {"category": "code", "method": "dflash", "taus": [len(ids)], "tokens": ids},
            {"category": "agentic", "method": "ar", "taus": [], "tokens": ids}]
    table = segment_table(rows, _decode)
    assert set(table) == {"Thought", "Thought/explain", "Call"}
    assert table["Thought"]["dflash"] == {"rounds": 2, "tokens": cut[0] + cut[1], "mean_tau": (cut[0] + cut[1]) / 2}
    assert table["Thought"]["neural"]["slot1_share"] == 0.5 and table["Call"]["neural"]["slot1_share"] == 0.0
    assert "slot1_share" not in table["Call"]["dflash"]
    # the CLI: a clear error for a missing file, the table otherwise
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    try:
        main([str(tmp_path), "--tokenizer", str(tmp_path / "nope")])
    except SystemExit as e:
        assert "tokenizer.json: not found" in str(e)
    else:
        raise AssertionError("a missing tokenizer must fail")
