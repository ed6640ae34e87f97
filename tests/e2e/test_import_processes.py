"""Zero-copy import with real processes: the four services as `quarry serve` children, the
CLI (`quarry import`, `import status`, `quarry cat`; its entry point run as a child would
see it, support.cli), and a committer killed with SIGKILL in the middle of an import: the
branch is unchanged or fully imported, never in between; staged changes are never lost; the
status reads FAILED once the heartbeat is stale, and the import runs again.

The module's tests share the services (each works in a repository of its own); the kill
test, last, restarts them all."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from quarry.client import Client
from quarry.v1 import committer_pb2 as cm
from support.cli import run_quarry
from support.processes import free_port, quarry_env, quarry_serve, wait_serving
from support.wait import wait_until

SERVICES = ("kv-gateway", "range-writer", "branch-manager", "committer")


class Processes:
    def __init__(self, home: Path) -> None:
        self.ports = {name: free_port() for name in SERVICES}
        extra = {"QUARRY_AUTH_ENABLED": "false", "QUARRY_COMPACTOR_ENABLED": "false"}
        for name, port in self.ports.items():
            key = name.upper().replace("-", "_")
            extra[f"QUARRY_{key}_PORT"] = str(port)
            extra[f"QUARRY_{key}_ADDRESS"] = f"127.0.0.1:{port}"
        extra["QUARRY_IMPORT_HEARTBEAT_SECONDS"] = "0.2"
        # A killed import reads FAILED this long after its last heartbeat (the test waits it
        # out once); a running import must never go this long without one, on a loaded
        # machine too (3 s was 15 heartbeats: too close for an import walking 40,000 files
        # beside other busy processes).
        extra["QUARRY_IMPORT_STALE_SECONDS"] = "10"
        self.env = quarry_env(home, **extra)
        self.stack = contextlib.ExitStack()
        self.children: dict[str, subprocess.Popen] = {}

    def start(self, name: str) -> None:
        self.children[name] = self.stack.enter_context(quarry_serve(name, self.env))
        wait_serving(f"127.0.0.1:{self.ports[name]}")

    def client(self) -> Client:
        return Client(
            branch_manager=f"127.0.0.1:{self.ports['branch-manager']}",
            committer=f"127.0.0.1:{self.ports['committer']}",
        )

    def quarry(self, *args: str) -> subprocess.CompletedProcess:
        return run_quarry(args, self.env)

    def restart(self) -> None:
        """Stop every service (those still running) and start them all again on the same
        store."""
        self.stack.close()
        self.stack = contextlib.ExitStack()
        for name in SERVICES:
            self.start(name)


@pytest.fixture(scope="module")
def processes(tmp_path_factory):
    running = Processes(tmp_path_factory.mktemp("import-processes") / "home")
    try:
        for name in SERVICES:
            running.start(name)
        yield running
    finally:
        running.stack.close()  # the services running now (the kill test restarts them)


def _ended(client: Client, repo: str, import_id: str, timeout: float, what: str):
    """The import's status once it no longer reads as running."""

    def status():
        got = client.get_import_status(repo, import_id)
        return got if got.state != cm.IMPORT_STATE_RUNNING else None

    # An RPC per poll, for as long as the stale time: every 0.25 s, not every 20 ms.
    return wait_until(status, timeout=timeout, interval=0.25, what=what)


def _files(root: Path, n: int, per_dir: int = 1000) -> Path:
    for i in range(n):
        directory = root / f"part={i // per_dir:03d}"
        if i % per_dir == 0:
            directory.mkdir(parents=True)
        (directory / f"f {i:06d}.csv").write_bytes(b"x" * (i % 7))
    return root


def test_the_cli_imports_shows_status_and_cat_reads_the_source(processes, tmp_path):
    source = tmp_path / "lake"
    (source / "t\u00e9").mkdir(parents=True)
    (source / "t\u00e9" / "a b.csv").write_bytes("id,name\n1,caf\u00e9\n".encode())
    (source / "zero").write_bytes(b"")
    with processes.client() as client:
        client.create_repository("demo", str(tmp_path / "ns"))
    done = processes.quarry(
        "import", "--from", f"file://{source}", "--to", "quarry://demo/main/raw", "-m", "adopt"
    )
    assert done.returncode == 0, done.stderr
    assert "COMPLETED" in done.stdout and re.search(r"commit:\s+\w{8,}", done.stdout)
    import_id = re.search(r"import demo/(\w+) started", done.stderr).group(1)
    status = processes.quarry("import", "status", f"demo/{import_id}")
    assert status.returncode == 0 and "COMPLETED" in status.stdout
    assert re.search(r"objects:\s+2 ", status.stdout), status.stdout
    cat = processes.quarry("cat", "demo", "main", "raw/t\u00e9/a b.csv")
    assert cat.returncode == 0, cat.stderr
    assert cat.stdout == "id,name\n1,caf\u00e9\n"
    listed = processes.quarry("ls", "demo", "main", "--recursive")
    assert "raw/t\u00e9/a b.csv" in listed.stdout and "raw/zero" in listed.stdout, listed
    started = processes.quarry(
        "import", "--from", str(source), "--to", "quarry://demo/main/again", "--no-wait"
    )
    assert started.returncode == 0 and "started" in started.stderr
    # stdout is the id `import status` takes, as docs/import.md says (it printed a sentence).
    status = processes.quarry("import", "status", started.stdout.strip())
    assert status.returncode in (0, 1) and "INVALID_NAME" not in status.stderr, status
    unknown = processes.quarry("import", "status", "demo/" + "0" * 32)
    assert unknown.returncode == 1 and "IMPORT_NOT_FOUND" in unknown.stderr
    bad = processes.quarry("import", "--from", "ftp://x/y", "--to", "quarry://demo/main/x")
    assert bad.returncode == 1 and "INVALID_IMPORT_SOURCE" in bad.stderr
    # The services' QUARRY_IMPORT_LOCAL_PREFIXES (the temporary directory, support.processes)
    # and their home, as `quarry serve` read them: outside, and Quarry's own, refused.
    home = processes.env["QUARRY_HOME"]
    for outside in ("/etc", home):
        refused = processes.quarry("import", "--from", outside, "--to", "quarry://demo/main/x")
        assert refused.returncode == 1 and "ADDRESS_NOT_ALLOWED" in refused.stderr, refused


def test_a_committer_killed_mid_import_leaves_the_branch_whole(processes, tmp_path):
    source = _files(tmp_path / "lake", 40_000)
    with processes.client() as client:
        client.create_repository("kill", str(tmp_path / "ns"))
        client.put_object("kill", "main", path="data/old", physical_address="s3://x/old")
        client.put_object("kill", "main", path="keep", physical_address="s3://x/keep")
        before = client.commit("kill", "main", "before").commit
        client.put_object("kill", "main", path="staged/a", physical_address="s3://x/a")
        started = client.start_import("kill", "main", [(str(source), "data")])

        def listing_started():
            status = client.get_import_status("kill", started.id)
            return status.objects_listed > 0 or status.state != cm.IMPORT_STATE_RUNNING

        wait_until(listing_started, timeout=60, interval=0.1, what="the import to list objects")
    os.kill(processes.children["committer"].pid, signal.SIGKILL)
    processes.children["committer"].wait(30)
    processes.restart()  # the other services stop too; all start again on the same store
    with processes.client() as client:
        status = _ended(client, "kill", started.id, 60, "the killed import to read as ended")
        head = client.get_branch("kill", "main").commit_id
        paths = [o.path for o in client.iter_objects("kill", "main@", prefix="")]
        data = [p for p in paths if p.startswith("data/")]
        if status.state == cm.IMPORT_STATE_COMPLETED:  # it had swapped before the kill
            assert len(data) == 40_000 and head == status.commit.id
        else:
            assert status.state == cm.IMPORT_STATE_FAILED and "stopped" in status.error
            assert head == before.id and data == ["data/old"]
        assert "keep" in paths
        # The staged change is still staged.
        assert [c.path for c in client.iter_uncommitted("kill", "main")] == ["staged/a"]
        again = client.start_import("kill", "main", [(str(source), "data")])
        final = _ended(client, "kill", again.id, 120, "the import run again")
        assert final.state == cm.IMPORT_STATE_COMPLETED, final.error
        assert final.objects_listed == 40_000
        paths = [o.path for o in client.iter_objects("kill", "main", prefix="")]
        assert len([p for p in paths if p.startswith("data/")]) == 40_000
        assert "staged/a" in paths and "keep" in paths
