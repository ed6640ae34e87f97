"""The test suite's own layout (issue 24): shared code lives in tests/support and is
imported as `support.*` - no test edits sys.path - and a module that wants the running suite
gets it from support.suite.suite_fixture instead of its own copy of the fixture."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def modules():
    for path in sorted(TESTS.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def test_no_test_module_edits_sys_path():
    offenders = []
    for path, tree in modules():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "path"
                and isinstance(node.value, ast.Name)
                and node.value.id == "sys"
            ):
                offenders.append(f"{path.relative_to(TESTS)}:{node.lineno}")
    assert offenders == []


def test_suite_fixtures_come_from_the_factory():
    """A fixture named `suite` that starts running_suite itself is a copy of
    support.suite.suite_fixture."""
    copies = []
    for path, tree in modules():
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "suite":
                calls = {
                    sub.func.id
                    for sub in ast.walk(node)
                    if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name)
                }
                if "running_suite" in calls:
                    copies.append(str(path.relative_to(TESTS)))
    assert copies == []
