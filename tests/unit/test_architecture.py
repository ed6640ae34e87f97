"""The core's shape (docs/architecture.md §2, ENGINEERING.md): read from the source (AST),
so a change that breaks it fails here, not in a review.

- The core (graveler, committed, kv, blob, auth, retention, errors) imports no CLI, no
  Spark, no service and no gRPC, except the named modules that are its network edges; it
  has no wiring (that is quarry.runtime.wiring) and of quarry.runtime uses only helpers
  that build no server or channel.
- Every key shape of a storage namespace (`_quarry/…`, `data/…`) is built in one module,
  quarry.blob.layout (GC's safety depends on every writer agreeing with what it collects).
- A branch record is written only through the CAS primitive (RefManager.update_branch, and
  insert_branch for a new branch), which alone calls the raw set_branch_if.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import quarry

LIBS = Path(quarry.__file__).parent
SERVICES = LIBS.parents[1] / "services"
CORE = ("graveler", "committed", "kv", "blob", "auth", "retention.py", "errors.py")
FORBIDDEN = ("quarry.cli", "quarry.spark", "quarry.services", "services", "grpc")
# The core's network edges: gRPC clients and the server-side interceptor of its own
# remote interfaces. Each is the one module of its package that speaks gRPC.
EDGES = {
    "kv/remote.py": "the KV store over the kv-gateway (a gRPC client)",
    "committed/remote.py": "the range-writer over gRPC (a client)",
    "auth/interceptor.py": "the server interceptor that authenticates calls",
}
LAYOUT_OWNER = "blob/layout.py"
# Literal beginnings of object-store keys: only the layout owner writes them.
KEY_SHAPES = ("_quarry/", "data/")


def _modules(root: Path, parts: tuple[str, ...] = ("",)) -> dict[str, ast.Module]:
    found = {}
    for part in parts:
        base = root / part
        paths = [base] if base.suffix == ".py" else sorted(base.rglob("*.py"))
        for path in paths:
            if "/v1/" in path.as_posix():  # generated code
                continue
            found[path.relative_to(root).as_posix()] = ast.parse(path.read_text())
    return found


def _imported(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_core_imports_no_cli_spark_service_or_grpc():
    offenders = []
    for name, tree in _modules(LIBS, CORE).items():
        if name in EDGES:
            continue
        for imported in _imported(tree):
            if any(imported == f or imported.startswith(f + ".") for f in FORBIDDEN):
                offenders.append(f"{name} imports {imported}")
    assert not offenders, offenders


def _docstrings(tree: ast.Module) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                ids.add(id(value))
    return ids


def _key_literals(tree: ast.Module) -> list[str]:
    """String constants (and the first literal part of f-strings) that begin like a key of
    a storage namespace; docstrings are prose, not keys."""
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                text = first.value
                skip.add(id(first))
        elif (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
        ):
            text = node.value
        if text is not None and text.startswith(KEY_SHAPES):
            found.append(text)
    return found


def test_object_store_key_shapes_are_built_only_by_the_layout_owner():
    offenders = []
    for root in (LIBS, SERVICES):
        for name, tree in _modules(root).items():
            # The owner; and the contract suites, whose keys are test data a backend stores,
            # not the layout of a namespace.
            if root is LIBS and (name == LAYOUT_OWNER or name.startswith("testing/")):
                continue
            offenders += [f"{name}: {text!r}" for text in _key_literals(tree)]
    assert not offenders, offenders
    # The owner does define them (the check above looks at the right thing).
    assert _key_literals(_modules(LIBS, (LAYOUT_OWNER,))[LAYOUT_OWNER])


# A rebuild (quarry import) writes every record of a repository into an EMPTY store, where
# no writer can race it: the one writer of branch records besides the CAS primitive.
BRANCH_RECORD_WRITERS = {"graveler/refs.py", "exporting.py"}


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Attribute) and node.func.attr == name)
            or (isinstance(node.func, ast.Name) and node.func.id == name)
        )
    ]


def test_a_branch_record_is_written_only_through_the_cas_primitive():
    modules = {**_modules(LIBS), **{f"services/{k}": v for k, v in _modules(SERVICES).items()}}
    encoders = [name for name, tree in modules.items() if _calls(tree, "encode_branch")]
    assert set(encoders) <= BRANCH_RECORD_WRITERS, encoders
    raw = [name for name, tree in modules.items() if _calls(tree, "set_branch_if")]
    assert raw == ["graveler/refs.py"], raw
    refs = modules["graveler/refs.py"]
    callers = {
        function.name
        for function in ast.walk(refs)
        if isinstance(function, ast.FunctionDef) and _calls(function, "set_branch_if")
    }
    assert callers == {"insert_branch", "update_branch"}, callers
    # encode_branch in refs.py: only set_branch_if itself turns a branch into bytes.
    encoding = {
        function.name
        for function in ast.walk(refs)
        if isinstance(function, ast.FunctionDef) and _calls(function, "encode_branch")
    }
    assert encoding == {"set_branch_if"}, encoding


def test_importing_the_core_loads_no_cli_spark_or_grpc_server():
    """`import quarry.graveler` (and its facade, and GC's retention rules) in a fresh
    interpreter: count what it loaded."""
    probe = (
        "import sys\n"
        "import quarry.graveler, quarry.graveler.graveler, quarry.retention\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('quarry.cli', 'quarry.spark',"
        " 'quarry.services', 'grpc.aio._server', 'grpc._server', 'pyspark')))\n"
        "print(len(sys.modules), bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    count, bad = out.split(" ", 1)
    assert bad.strip() == "[]", f"importing the core loaded {bad.strip()} ({count} modules)"


def test_graveler_uses_no_request_or_response_messages():
    """gRPC stays at the edge: the servicers turn requests into domain calls; graveler
    takes and returns domain values (and the stored/shared messages), never an RPC's
    request or response type."""
    offenders = []
    for name, tree in _modules(LIBS, ("graveler",)).items():
        for node in ast.walk(tree):
            named = (
                node.attr
                if isinstance(node, ast.Attribute)
                else (node.name if isinstance(node, ast.alias) else "")
            )
            if named.endswith(("Request", "Response")) and named[:1].isupper():
                offenders.append(f"{name}: {named}")
    assert not offenders, offenders


# Wiring (channels to the kv-gateway and the range-writer, readiness dependencies, the
# dropper) lives with the process layer, quarry.runtime.wiring, which the services import;
# the core has none. Of quarry.runtime the core (but its network EDGES) may use only these
# helpers, which build no server or channel and import no gRPC.
CORE_RUNTIME_HELPERS = (
    "quarry.runtime.periodic",  # PeriodicWorker: a background thread
    "quarry.runtime.deadlines",  # the current call's deadline, a contextvar
    "quarry.runtime.format_version",  # the KV store's format stamp
)


def _runtime_imports(tree: ast.Module) -> set[str]:
    """The quarry.runtime modules a module imports (`from quarry.runtime import x` names
    the module quarry.runtime.x)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("quarry.runtime"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "quarry.runtime":
                names.update(f"quarry.runtime.{alias.name}" for alias in node.names)
            elif node.module.startswith("quarry.runtime."):
                names.add(node.module)
    return names


def test_the_core_has_no_wiring_and_uses_only_runtime_helpers():
    core = _modules(LIBS, CORE)
    offenders = [
        f"{name} imports {imported}"
        for name, tree in core.items()
        if name not in EDGES
        for imported in _runtime_imports(tree)
        if imported not in CORE_RUNTIME_HELPERS
    ]
    assert not offenders, offenders
    assert not [name for name in core if Path(name).stem == "wiring"]
    # The helpers themselves stay free of gRPC and of the rest of the process layer.
    for helper in CORE_RUNTIME_HELPERS:
        path = helper.removeprefix("quarry.").replace(".", "/") + ".py"
        tree = _modules(LIBS, (path,))[path]
        assert _runtime_imports(tree) <= set(CORE_RUNTIME_HELPERS), helper
        assert not [i for i in _imported(tree) if i == "grpc" or i.startswith("grpc.")], helper
