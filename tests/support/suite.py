"""The whole suite in-process on loopback: kv-gateway, range-writer, branch-manager and
committer (plus, with `compactor_sensor=True`, the compactor-sensor, fed by
branch-manager's staging reporter), each a real gRPC server on a free port, wired to each
other over gRPC exactly as in production (only the processes are shared).

Without `compactor_sensor=True` branch-manager sends no staging reports
(compactor_enabled=False) unless the caller sets compactor_enabled itself."""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from quarry.config import load_settings
from quarry.kv.store import Store
from quarry.runtime.server import QuarryServer, create_server
from support.auth import TEST_SIGNING_KEY, setup_test_admin
from support.clocks import MovableClock


@dataclass
class Suite:
    home: Path
    settings: object
    servers: dict[str, QuarryServer] = field(default_factory=dict)
    targets: dict[str, str] = field(default_factory=dict)
    backend: Store | None = None
    sensor: object | None = None  # the CompactionSensor, when started
    # The staging droppers' wall clock: a test moves it past the grace period instead of
    # waiting the grace out.
    dropper_clock: MovableClock = field(default_factory=lambda: MovableClock(time.time))

    def age_cleanup_queue(self) -> None:
        """Let the droppers see every retired token as past its grace period."""
        self.dropper_clock.advance(self.settings.staging_drop_grace_seconds)  # type: ignore[attr-defined]

    def drain_cleanup_queue(self, timeout: float = 30.0) -> None:
        """Age the cleanup queue and wait until the droppers dropped it all. Until then a
        dropper reads the branch record of each token a commit queued ahead of its swap
        (StagingManager.queue_retiring_tokens): a test counting a call's KV reads drains
        first, so none of the dropper's falls in the call it measures."""
        from support.wait import wait_until

        assert self.backend is not None, "an in-process suite over a backend of the test's"
        self.age_cleanup_queue()
        wait_until(
            lambda: not list(self.backend.scan(b"cleanup")),  # type: ignore[union-attr]
            timeout=timeout,
            interval=0.05,
            what="the cleanup queue to drain",
        )

    def client(self, **kwargs):
        from quarry.client import Client

        if "compactor-sensor" in self.targets:
            kwargs.setdefault("compactor_sensor", self.targets["compactor-sensor"])
        return Client(
            branch_manager=self.targets["branch-manager"],
            committer=self.targets["committer"],
            **kwargs,
        )

    def stop(self, name: str) -> None:
        """Stop one service now (e.g. the compactor-sensor, to see writes go on)."""
        server = self.servers.pop(name, None)
        if server is not None:
            server.stop(grace=1.0)

    def namespace(self, name: str) -> str:
        path = self.home / "lake" / name
        path.mkdir(parents=True, exist_ok=True)
        return str(path)


def _start(settings, spec) -> tuple[QuarryServer, str]:
    server, port = create_server(settings, spec, port=0, host="127.0.0.1")
    return server, f"127.0.0.1:{port}"


@contextlib.contextmanager
def running_suite(
    home: Path, backend: Store | None = None, compactor_sensor: bool = False, **overrides
) -> Iterator[Suite]:
    """Start the services in dependency order; stop them in reverse."""
    from quarry.kv.memory import MemoryStore
    from quarry.services.branch_manager.service import build as build_branch_manager
    from quarry.services.committer.service import build as build_committer
    from quarry.services.kv_gateway.service import build as build_kv_gateway
    from quarry.services.range_writer.service import build as build_range_writer

    backend = backend if backend is not None else MemoryStore()
    if not compactor_sensor:
        overrides.setdefault("compactor_enabled", False)
    # Auth on (the default) with the test key; the fixed admin on the suite's own store.
    overrides.setdefault("auth_signing_key", TEST_SIGNING_KEY)
    # Tests import and link files of their own temporary directories (QUARRY_HOME is under
    # it too, and stays unreachable).
    overrides.setdefault("import_local_prefixes", tempfile.gettempdir())
    settings = load_settings(env={}, home=str(home), metrics_base_port=0, **overrides)
    suite = Suite(home=home, settings=settings, backend=backend)
    if settings.auth_enabled:
        setup_test_admin(backend)
    try:
        server, target = _start(settings, build_kv_gateway(settings, backend=backend))
        suite.servers["kv-gateway"], suite.targets["kv-gateway"] = server, target
        settings = settings.replace(kv_gateway_address=target)

        server, target = _start(settings, build_range_writer(settings))
        suite.servers["range-writer"], suite.targets["range-writer"] = server, target
        settings = settings.replace(range_writer_address=target)

        if compactor_sensor:
            # The sensor dials the committer; branch-manager's reporter dials the sensor.
            from quarry.services.compactor_sensor.service import assemble

            server, target = _start(
                settings, build_committer(settings, dropper_clock=suite.dropper_clock)
            )
            suite.servers["committer"], suite.targets["committer"] = server, target
            settings = settings.replace(committer_address=target)
            assembled = assemble(settings)
            suite.sensor = assembled.sensor
            server, target = _start(settings, assembled.spec)
            suite.servers["compactor-sensor"], suite.targets["compactor-sensor"] = server, target
            settings = settings.replace(compactor_sensor_address=target)
            server, target = _start(
                settings, build_branch_manager(settings, dropper_clock=suite.dropper_clock)
            )
            suite.servers["branch-manager"], suite.targets["branch-manager"] = server, target
        else:
            for name, build in (
                ("branch-manager", build_branch_manager),
                ("committer", build_committer),
            ):
                server, target = _start(
                    settings, build(settings, dropper_clock=suite.dropper_clock)
                )
                suite.servers[name], suite.targets[name] = server, target
        suite.settings = settings.replace(
            branch_manager_address=suite.targets["branch-manager"],
            committer_address=suite.targets["committer"],
        )
        yield suite
    finally:
        for name in reversed(list(suite.servers)):
            suite.servers[name].stop(grace=1.0)


def suite_fixture(
    *,
    name: str = "suite",
    scope: str = "module",
    backend: str | None = None,
    fixture_options: dict[str, str] | None = None,
    **options,
):
    """The one way a test module gets a running suite: `suite = suite_fixture(...)` at module
    level makes a fixture (named `name`) that runs running_suite(**options) in a fresh
    temporary home for `scope` (the module by default: its tests share the servers and
    isolate themselves by repository). `backend` names a fixture giving the KV store (e.g.
    "counting_backend"); without it the suite has a fresh MemoryStore. `fixture_options`: options
    whose values are other fixtures' (option name -> fixture name, e.g. the moto endpoint)."""

    @pytest.fixture(scope=scope, name=name)
    def suite(request, tmp_path_factory) -> Iterator[Suite]:
        store = request.getfixturevalue(backend) if backend is not None else None
        given = {k: request.getfixturevalue(v) for k, v in (fixture_options or {}).items()}
        with running_suite(
            tmp_path_factory.mktemp("suite"), backend=store, **options, **given
        ) as running:
            yield running

    return suite
