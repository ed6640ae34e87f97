"""The layout of quarry.committed (docs/architecture.md §5): each part a module over the
others' public functions, no import cycle, no module over ~500 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import quarry.committed

PACKAGE = Path(quarry.committed.__file__).parent
MODULES = {path.stem: ast.parse(path.read_text()) for path in PACKAGE.glob("*.py")}


def _imports(tree: ast.Module) -> set[str]:
    """The sibling modules a module imports at any level."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "quarry.committed":
            found.update(alias.name for alias in node.names if alias.name in MODULES)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "quarry.committed."
        ):
            found.add(node.module.split(".")[2])
    return found


def test_no_import_cycles():
    graph = {name: _imports(tree) - {name} for name, tree in MODULES.items() if name != "__init__"}
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import cycle: {' -> '.join((*path, name))}"
        if name in done:
            return
        for imported in graph.get(name, ()):
            visit(imported, (*path, name))
        done.add(name)

    for name in graph:
        visit(name, ())
    assert {"loader", "writer", "apply", "diff", "merge"} <= graph["manager"]
    assert "manager" not in set().union(
        *(deps for name, deps in graph.items() if name != "manager")
    )


# rangedata builds Entry objects without Entry.__init__ on the hot read path, filling the
# identity slot it would compute (quarry.graveler.model.Entry: "_identity").
# processes ends an orphaned worker with os._exit (the standard library's exit without
# clean-up, not a private name).
ALLOWED = {("rangedata", "_identity"), ("processes", "_exit")}


def test_no_module_reaches_into_another_objects_private_names():
    offenders = []
    for name, tree in MODULES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("quarry."):
                offenders += [
                    f"{name}: imports {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ) and (name, node.attr) not in ALLOWED:
                offenders.append(f"{name}:{node.lineno} .{node.attr}")
    assert offenders == []


def test_modules_stay_small():
    sizes = {path.name: len(path.read_text().splitlines()) for path in PACKAGE.glob("*.py")}
    assert {name: size for name, size in sizes.items() if size > 500} == {}
