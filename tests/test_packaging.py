"""Packaging: every third-party import is declared in pyproject.toml, and `import whiflash` stays light.

A fresh `pip install -e .` must be enough to run every module, script and test, so each imported
distribution has to be listed (in `dependencies`, or for tests also in the `test` extra). And
`import whiflash` is what a decoding user pays for: the data, training and plotting stacks load
only when datagen or train is used.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # the test extra installs tomli on Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = {"whiflash"}
PACKAGE_FOLDERS = ("whiflash", "datagen", "train", "eval", "scripts")
"""Folders whose imports `dependencies` must cover (the installed package, its CLIs and the scripts)."""
IMPORT_TO_DISTRIBUTION = {"sklearn": "scikit-learn", "yaml": "pyyaml", "PIL": "pillow"}
"""Import names that differ from their distribution's name; every other name is its own distribution."""
NOT_ON_IMPORT = ("datasets", "pyarrow", "lightning", "sklearn", "matplotlib", "scipy", "whiflash.testing")
"""Modules `import whiflash` (decoding) must not load."""


def normalise(name: str) -> str:
    """A distribution name in PEP 503 form (`Huggingface_Hub` -> `huggingface-hub`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(requirements: list[str]) -> set[str]:
    """Normalised distribution names of PEP 508 requirement strings (extras, versions and markers dropped)."""
    names = set()
    for req in requirements:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
        assert match, f"pyproject.toml: cannot read the requirement {req!r}"
        names.add(normalise(match.group(1)))
    return names


def declared(*extras: str) -> set[str]:
    """Distributions pyproject.toml declares: `dependencies` plus the named optional extras."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    return requirement_names(requirements)


def third_party_imports(file: Path) -> dict[str, int]:
    """Top-level names of the absolute imports in `file` (function-level ones included) that are
    neither the standard library, nor first party, nor a module next to `file`; name -> first line."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        for module in modules:
            top = module.split(".")[0]
            local = (file.parent / f"{top}.py").is_file() or (file.parent / top / "__init__.py").is_file()
            if top in sys.stdlib_module_names or top in FIRST_PARTY or local:
                continue
            found.setdefault(top, node.lineno)
    return found


def undeclared(folders: tuple[str, ...], allowed: set[str]) -> list[str]:
    """`file:line: name (distribution)` for every import in `folders` whose distribution is not in `allowed`."""
    problems = []
    for folder in folders:
        for file in sorted((ROOT / folder).rglob("*.py")):
            for name, line in third_party_imports(file).items():
                dist = normalise(IMPORT_TO_DISTRIBUTION.get(name, name))
                if dist not in allowed:
                    problems.append(f"{file.relative_to(ROOT)}:{line}: {name} (distribution {dist})")
    return problems


def test_package_imports_are_declared_dependencies() -> None:
    # the `gpu` extra (triton) is optional: the module that imports it falls back to SDPA without it
    problems = undeclared(PACKAGE_FOLDERS, declared("gpu"))
    assert not problems, "imported but not in pyproject.toml [project] dependencies:\n" + "\n".join(problems)


def test_test_imports_are_declared() -> None:
    problems = undeclared(("tests",), declared("test"))
    assert not problems, "imported by tests but not in dependencies or the test extra:\n" + "\n".join(problems)


def test_the_checks_see_what_they_guard(tmp_path: Path) -> None:
    """The import scan finds nested and aliased imports and maps names to distributions."""
    (tmp_path / "sibling.py").write_text("")
    file = tmp_path / "mod.py"
    file.write_text("import os\nimport sklearn.metrics as m\nimport sibling\nimport whiflash\n"
                    "def f():\n    from yaml import safe_load\n")
    assert third_party_imports(file) == {"sklearn": 2, "yaml": 6}
    assert requirement_names(["jsonargparse[signatures]>=4.32", "tomli>=2; python_version < '3.11'",
                              "huggingface_hub>=0.34"]) == {"jsonargparse", "tomli", "huggingface-hub"}


BOUNDED = ("torch", "transformers", "datasets", "lightning", "jsonargparse")
"""Dependencies whose API the toolkit leans on: each needs an upper bound that admits what was tested."""
TESTED = {"torch": ["2.11"], "transformers": ["5.17"]}
"""Versions tested elsewhere than this venv: the GPU image."""


def _release(version: str) -> tuple[int, ...]:
    """(2, 13, 0) of `2.13.0+cpu`: the numeric release part, which is all the bounds here compare."""
    return tuple(int(p) for p in re.match(r"\d+(?:\.\d+)*", version).group().split("."))


def _admits(spec: str, version: str) -> bool:
    """Whether `version` satisfies every `>=X` / `<X` clause of `spec` (the only operators used for these)."""
    ops = {">=": lambda v, b: v >= b, "<": lambda v, b: v < b}
    clauses = re.findall(r"(>=|<)\s*([\d.]+)", spec)
    return all(ops[op](_release(version), _release(bound)) for op, bound in clauses)


def test_bounded_dependencies_admit_the_tested_versions() -> None:
    from importlib.metadata import version

    specs = {normalise(re.match(r"[A-Za-z0-9._-]+", r).group()): r.split(";")[0]
             for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    for name in BOUNDED:
        spec = specs[name]
        assert re.search(r"<\s*[\d.]+", spec), f"pyproject.toml: {spec!r} has no upper bound"
        for tested in [version(name), *TESTED.get(name, [])]:
            assert _admits(spec, tested), f"pyproject.toml: {spec!r} excludes the tested {name} {tested}"
    assert _admits("x>=4.56,<5.40", "5.24.0") and not _admits("x>=4.56,<5.40", "5.40.1")


@pytest.fixture(scope="module")
def modules_after_import() -> list[str]:
    """`sys.modules` of a fresh interpreter after `import whiflash`."""
    code = "import json, sys, whiflash; print(json.dumps(sorted(sys.modules)))"
    run = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(run.stdout)


@pytest.mark.parametrize("module", NOT_ON_IMPORT)
def test_import_whiflash_loads_decoding_only(modules_after_import: list[str], module: str) -> None:
    loaded = [m for m in modules_after_import if m == module or m.startswith(module + ".")]
    assert not loaded, f"`import whiflash` imports {loaded}; import them inside the functions that need them"


def test_the_clis_run_from_a_checkout_that_is_not_installed() -> None:
    """A GPU machine without setuptools or an index runs the checkout on PYTHONPATH: `python -m whiflash.eval`
    must find eval/ there as the install's package-dir mapping does (here the editable install's finder is
    dropped, so only the checkout's path can)."""
    code = ("import sys\n"
            "sys.meta_path = [f for f in sys.meta_path if 'editable' not in getattr(f, '__module__', '')]\n"
            f"sys.path.insert(0, {str(ROOT)!r})\n"
            "import whiflash.datagen.cli, whiflash.train.cli, whiflash.eval.cli\n"
            "print(whiflash.eval.cli.__file__)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert run.returncode == 0, run.stderr[-2000:]
    assert Path(run.stdout.strip()) == ROOT / "eval" / "cli.py"
