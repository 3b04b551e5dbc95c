"""The layout rules: every module of the package is short enough to read in one sitting (400 lines at most), the tests
mirror the package in folders that are packages (so that two test modules may share a name), and no test module
imports another (what they share lives in ``tests/helpers`` or a ``conftest.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
MAX_LINES = 400


def test_no_module_of_the_package_exceeds_400_lines() -> None:
    too_long = []
    for path in sorted((ROOT / "rlguard").rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            too_long.append(f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_LINES}): split it")
    assert not too_long, "\n".join(too_long)


def test_every_folder_of_tests_is_a_package() -> None:
    folders = {path.parent for path in TESTS.rglob("*.py") if "__pycache__" not in path.parts}
    missing = sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").exists())
    assert not missing, f"folders of tests without an __init__.py (their modules' names would clash): {missing}"


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``tree``, with each name of ``from x import a, b`` as ``x.a``, ``x.b``
    (``from tests.guards import test_guard`` imports a test module too)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):  # relative: from . import test_x, from .test_x import y
            found += [(node.lineno, f"{node.module or ''}.{alias.name}") for alias in node.names]
            if node.module:
                found.append((node.lineno, node.module))
    return found


def _is_test_module(name: str) -> bool:
    parts = [p for p in name.split(".") if p]
    return bool(parts) and (
        parts[0].startswith("test_") or (parts[0] == "tests" and any(p.startswith("test_") for p in parts[1:]))
    )


@pytest.mark.parametrize(
    ("source", "imports_a_test_module"),
    [
        ("import test_alerts", True),
        ("from test_verl_guard import FakeTrainer", True),
        ("from tests.adapters.trl.test_parity import config", True),
        ("from tests.guards import test_guard", True),
        ("from .test_parity import config", True),
        ("from tests.helpers.guards import ScriptedGuard", False),
        ("from rlguard.guards import Guard", False),
        ("import tests.helpers.trl_parity as h", False),
    ],
)
def test_the_import_check_tells_test_modules_from_helpers(source: str, imports_a_test_module: bool) -> None:
    assert any(_is_test_module(name) for _, name in _imported_modules(ast.parse(source))) is imports_a_test_module


def test_no_test_module_imports_another() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, name in _imported_modules(tree):
            if _is_test_module(name):
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not offenders, "move what they share into tests/helpers or a conftest.py:\n" + "\n".join(offenders)


#: the lines git writes around the two sides of a conflict it could not merge
_CONFLICT = ("<<<<<<< ", ">>>>>>> ")


def _texts() -> list[Path]:
    skip = {".git", ".venv", "site", "dist", "build", "node_modules", "__pycache__"}
    kinds = {".py", ".md", ".toml", ".yaml", ".yml", ".cfg", ".txt", ".json", ".jsonl", ".csv", ".sh"}
    return [
        p for p in ROOT.rglob("*") if p.is_file() and p.suffix in kinds and skip.isdisjoint(p.relative_to(ROOT).parts)
    ]


def test_no_file_holds_an_unresolved_merge_conflict() -> None:
    found = []
    for path in _texts():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if line.startswith(_CONFLICT) or (line == "=======" and path.suffix != ".md"):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line[:40]}")
    assert not found, "unresolved merge conflicts:\n" + "\n".join(found)
