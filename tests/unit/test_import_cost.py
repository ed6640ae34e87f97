"""What a Quarry process loads before it does its work (issue 24: a test run starts hundreds
of service and CLI processes, and each pays for every module it imports).

- `quarry up` imports every service module for its DEPENDS_ON, and a worker supervisor its
  service's module: a service module imports its implementation in build(), never at the top.
- The CLI (`quarry --help`, every client command) loads no server side, no Arrow, no
  Prometheus (the client rebuilds CorruptRecord from quarry.graveler.errors).
- The versioning core loads Arrow only for an import, PyYAML only for an action file; the
  console loads Jinja2 for its first page.
- A worker supervisor (`quarry serve branch-manager` with workers) loads no gRPC server.
- `quarry serve` (every service process) loads neither the client library nor the other
  commands' modules: quarry.cli.main builds its parser alone (LOCAL_COMMANDS).
- A branch-manager or committer starts without Arrow: committed storage and the range-writer's
  client are built on their first use (quarry.runtime.wiring.BuiltOnFirstUse).

Each probe runs in a fresh interpreter and names what it found loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# Heavy to import (numpy and pyarrow ~0.4 CPU-s, PyJWT with cryptography ~0.2, ...), and
# needed only by the paths that use them.
ARROW = ("pyarrow", "numpy")
HEAVY = (*ARROW, "yaml", "jwt", "cryptography", "jinja2", "uvicorn", "pandas", "pyspark")
# (grpc's own server modules come with `import grpc`, which every client needs.)
SERVER_SIDE = ("quarry.runtime.server", "quarry.runtime.workers", "prometheus_client")
IMPLEMENTATION = ("quarry.committed", "quarry.graveler.graveler", "quarry.services")

PROBE = """
import importlib, json, sys
watched = {watched!r}
found = {{}}
for name in {modules!r}:
    importlib.import_module(name)
    {after}
    loaded = sorted(m for m in sys.modules if m.startswith(watched) and m not in found.get('', ()))
    found[name] = loaded
    found[''] = sorted(set(found.get('', ())) | set(loaded))
del found['']
print(json.dumps(found))
"""


def loaded(modules: list[str], watched: tuple[str, ...], after: str = "pass") -> dict[str, list]:
    """For each of `modules`, imported in turn in one fresh interpreter: the modules whose
    names start with one of `watched` that importing it (and running `after`) loaded."""
    probe = PROBE.format(modules=modules, watched=watched, after=after)
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    return json.loads(out)


def _top(found: dict[str, list]) -> dict[str, list]:
    """Only the top-level names (pyarrow, not its 100 submodules), for short messages."""
    return {
        name: sorted({m if m.startswith("quarry.") else m.split(".")[0] for m in mods})
        for name, mods in found.items()
        if mods
    }


def last_json_line(probe: str, env: dict[str, str], *argv: str) -> Any:
    """Run `probe` (python -c, with argv) in `env`; the JSON of its last output line."""
    out = subprocess.run(
        [sys.executable, "-c", probe, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_service_modules_and_start_order_load_no_implementation():
    """What `quarry up` loads to learn the start order: the CLI, then every service module."""
    from quarry.cli.services import SERVICE_MODULES

    found = loaded(
        ["quarry.cli.main", *SERVICE_MODULES.values()],
        (*HEAVY, *SERVER_SIDE, "quarry.committed", "quarry.graveler.graveler"),
        after="if name == 'quarry.cli.main': from quarry.cli.services import start_order; "
        "start_order()",
    )
    assert _top(found) == {}


def test_a_service_module_imports_only_its_own_package():
    """A service module alone loads none of its servicer (nor another service's)."""
    from quarry.cli.services import SERVICE_MODULES

    for module in SERVICE_MODULES.values():
        found = loaded([module], ("quarry.services",))
        package = module.rsplit(".", 1)[0]
        assert sorted(found[module]) == sorted(["quarry.services", package, module]), found


def test_the_cli_loads_no_server_side_arrow_or_metrics():
    found = loaded(["quarry.cli.main"], (*HEAVY, *SERVER_SIDE))
    assert _top(found) == {}


def test_the_core_loads_arrow_only_for_an_import_and_yaml_only_for_action_files():
    """Graveler, and the branch-manager's servicer over it; then an action file parsed
    loads PyYAML (the probe sees the deferred import happen)."""
    found = loaded(
        [
            "quarry.graveler.graveler",
            "quarry.services.branch_manager.servicer",
            "quarry.actions.files",
        ],
        (*ARROW, "yaml", "quarry.committed"),
        after="if name == 'quarry.actions.files': sys.modules[name].parse("
        "'_quarry_actions/a.yaml', b'name: a\\non: {pre-commit: {}}\\nhooks: [{id: h, type: webhook,"
        " properties: {url: http://h}}]\\n')",
    )
    assert _top(found) == {
        "quarry.actions.files": ["yaml"],
    }


def test_the_console_loads_jinja2_on_its_first_page():
    """The console's app and templates load no Jinja2 until a page is rendered."""
    found = loaded(
        ["quarry.console.app", "quarry.console.templates", "json"],
        ("jinja2",),
        after="if name == 'json': print(len(sys.modules['quarry.console.templates'].Templates()"
        ".render('login.html', request=None, session=None, csrf='c', message='', next='/')),"
        " file=sys.stderr)",
    )
    assert _top(found) == {"json": ["jinja2"]}


def test_a_worker_supervisor_loads_no_grpc_server(tmp_path: Path):
    """`quarry serve branch-manager` with 2 workers, up to where it would supervise them
    (runtime.workers.supervise is replaced by one that reports what was loaded)."""
    probe = (
        "import json, sys\n"
        "import quarry.runtime.workers as workers\n"
        "def supervise(settings, service, count):\n"
        "    print(json.dumps([service, count, sorted(m for m in sys.modules if m.startswith("
        f"{(*HEAVY, *IMPLEMENTATION, 'quarry.runtime.server')!r}))]))\n"
        "    return 0\n"
        "workers.supervise = supervise\n"
        "from quarry.cli.main import main\n"
        "sys.exit(main(['serve', 'branch-manager']))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUARRY_")}
    env.update(QUARRY_HOME=str(tmp_path), QUARRY_BRANCH_MANAGER_WORKERS="2")
    service, count, found = last_json_line(probe, env)
    assert (service, count) == ("branch-manager", 2)
    # The service's own module only (for DEPENDS_ON): none of what its workers serve with.
    assert found == [
        "quarry.services",
        "quarry.services.branch_manager",
        "quarry.services.branch_manager.service",
    ]


def test_quarry_serve_loads_no_client_and_no_other_command(tmp_path: Path):
    """`quarry serve kv-gateway` up to where it would serve (runtime.server.serve is
    replaced by one that reports what was loaded); `quarry settings` likewise, at its end."""
    probe = (
        "import json, sys\n"
        "import quarry.runtime.server as server\n"
        "def report(*_args):\n"
        "    print(json.dumps(sorted(m for m in sys.modules if m.startswith("
        "('quarry.cli', 'quarry.client')))))\n"
        "server.serve = report\n"
        "from quarry.cli.main import main\n"
        "main(sys.argv[1:])\n"
        "report()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUARRY_")}
    env.update(QUARRY_HOME=str(tmp_path))
    local = ["quarry.cli", "quarry.cli.main", "quarry.cli.services"]
    for argv in (["serve", "kv-gateway"], ["settings"]):
        assert last_json_line(probe, env, *argv) == local, argv
    # What the probe sees otherwise: `quarry help` builds the whole parser.
    everything = last_json_line(probe, env, "help")
    assert {"quarry.cli.base", "quarry.cli.repos", "quarry.client"} <= set(everything)


def test_services_start_without_arrow_and_load_it_on_first_use(tmp_path: Path):
    """branch-manager's and committer's specs built as `quarry serve` builds them (their
    channels dial nothing yet) load no Arrow; the core's committed reader and range-writer
    client then import it when first used."""
    probe = (
        "import json, sys\n"
        "from quarry.config import load_settings\n"
        "from quarry.services.branch_manager.service import build as bm\n"
        "from quarry.services.committer.service import build as committer\n"
        "from quarry.kv.memory import MemoryStore\n"
        "from quarry.runtime.wiring import core_dependencies\n"
        f"arrow = {ARROW!r}\n"
        "def seen(): return sorted({m.split('.')[0] for m in sys.modules if m.startswith(arrow)})\n"
        "settings = load_settings()\n"
        "specs = [bm(settings), committer(settings)]\n"
        "deps = core_dependencies(settings, kv_store=MemoryStore(), start_dropper=False)\n"
        "built = seen()\n"
        "empty = deps.graveler.committed.count('file:///nowhere', '')\n"
        "read = seen()\n"
        "writer = type(deps.graveler.range_writer.write_columns.__self__).__name__\n"
        "print(json.dumps([built, read, writer]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUARRY_")}
    env.update(QUARRY_HOME=str(tmp_path), QUARRY_AUTH_SIGNING_KEY="k" * 40)
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    built, read, writer = json.loads(out.stdout.strip().splitlines()[-1])
    assert built == []
    assert read == ["numpy", "pyarrow"]
    assert writer == "RemoteRangeWriter"
