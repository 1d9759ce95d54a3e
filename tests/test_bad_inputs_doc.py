"""docs/bad_inputs.md stays true: every test it cites as `tests/FILE.py::TEST` exists."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "bad_inputs.md"
CITATION = re.compile(r"`(tests/test_\w+\.py)::(test_\w+)`")


def defined_tests(file: Path) -> set[str]:
    """Names of the test functions defined at the top level of ``file``."""
    tree = ast.parse(file.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_every_cited_test_exists() -> None:
    citations = CITATION.findall(DOC.read_text())
    assert len(citations) >= 20, f"{DOC}: expected a table citing tests as `tests/FILE.py::TEST`"
    missing = [f"{file}::{name}" for file, name in citations
               if not (ROOT / file).is_file() or name not in defined_tests(ROOT / file)]
    assert not missing, f"{DOC} cites tests that do not exist: {missing}"
