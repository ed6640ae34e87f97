"""Running Quarry on this machine: `quarry up` (every service), `quarry serve SERVICE` (one),
and describing this installation: `quarry version`, `quarry settings`."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING

import quarry
from quarry import errors
from quarry.config import (
    SERVICES,
    Settings,
    load_settings,
    setting_given,
    settings_markdown,
    settings_text,
)
from quarry.runtime.lifeline import LIFELINE_FD_ENV

if TYPE_CHECKING:  # the client library: not loaded by a service's start
    from quarry.cli.base import Subparsers

# The services built so far. Each maps to the module whose `build(settings) -> ServiceSpec`
# wires it and whose DEPENDS_ON names the services it needs in order to serve.
SERVICE_MODULES = {
    "kv-gateway": "quarry.services.kv_gateway.service",
    "range-writer": "quarry.services.range_writer.service",
    "branch-manager": "quarry.services.branch_manager.service",
    "committer": "quarry.services.committer.service",
    "compactor-sensor": "quarry.services.compactor_sensor.service",
    # HTTP, not gRPC: its module has `serve(settings)` instead of `build` (cmd_serve).
    "s3-gateway": "quarry.services.s3_gateway.service",
    "console": "quarry.services.console.service",
}


def _service_builder(name: str) -> Callable:
    if name not in SERVICES:
        raise SystemExit(f"quarry: unknown service {name!r}; services: {', '.join(SERVICES)}")
    if name not in SERVICE_MODULES:
        raise SystemExit(
            f"quarry: service {name!r} is not built yet; available: {', '.join(SERVICE_MODULES)}"
        )
    return importlib.import_module(SERVICE_MODULES[name]).build


def start_order() -> list[str]:
    """The services with each after the ones it depends on (SERVICE_MODULES order among
    equals). Any order works — a service waits for its dependencies, NOT_SERVING — but this
    one makes `quarry up` ready soonest, and its reverse stops dependents first, so no
    service is left running without what it needs."""
    depends_on = {
        name: tuple(importlib.import_module(module).DEPENDS_ON)
        for name, module in SERVICE_MODULES.items()
    }
    order: list[str] = []
    while len(order) < len(depends_on):
        ready = [
            name
            for name in depends_on
            if name not in order and all(d in order for d in depends_on[name] if d in depends_on)
        ]
        if not ready:
            raise RuntimeError(f"dependency cycle among {sorted(set(depends_on) - set(order))}")
        order.append(ready[0])
    return order


def cmd_serve(args: argparse.Namespace) -> int:
    """One service in this process (or, with workers, a supervisor of its worker
    processes). A setting or environment mistake ends it with the reason, never a
    traceback."""
    try:
        return _serve(args.service)
    except errors.QuarryError as exc:
        print(f"quarry serve {args.service}: {exc.reason}: {exc}", file=sys.stderr)
        return 2


def _serve(service: str) -> int:
    from quarry.runtime.workers import supervise, worker_role

    module = importlib.import_module(SERVICE_MODULES.get(service, "quarry"))
    settings = load_settings()
    workers = settings.workers_of(service)
    if workers > 1 and worker_role() is None:
        # A supervisor of `workers` processes, each this very command (quarry.runtime.workers).
        return supervise(settings, service, workers)
    if hasattr(module, "serve"):  # the s3-gateway and the console: HTTP servers of their own
        module.serve(settings)
        return 0
    build = _service_builder(service)
    # Only a process that serves loads the gRPC server (a supervisor of workers does not).
    from quarry.runtime.server import serve

    serve(settings, build, service)
    return 0


def _command(name: str) -> str:
    """How to type a tool installed next to this Python: its bare name when that is what
    the PATH finds, else its path (e.g. .venv/bin/quarry after `make run`)."""
    installed = Path(sys.executable).parent / name
    found = shutil.which(name)
    if found and Path(found).resolve() == installed.resolve():
        return name
    try:
        return os.path.relpath(installed)
    except ValueError:
        return str(installed)


# A second stop signal within this many seconds of the first is the same request delivered
# twice (make forwards its group's SIGTERM to `quarry up`, which got it already): ignored.
# A later one hurries the stop: every service still running gets SIGTERM at once and is
# killed after HURRIED_GRACE_SECONDS.
REPEATED_SIGNAL_SECONDS = 1.0
HURRIED_GRACE_SECONDS = 2.0


class StopSignals:
    """`quarry up`'s SIGINT/SIGTERM/SIGHUP handler. The first signal raises
    KeyboardInterrupt (the orderly stop begins); later ones never raise — a second
    KeyboardInterrupt inside the stop would abandon it and orphan the services — but a
    repeated signal (past REPEATED_SIGNAL_SECONDS) sets `hurried`, which the stop obeys."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self.stopping_since: float | None = None
        self.hurried = threading.Event()

    def begin_stop(self) -> None:
        """The stop has begun (on a signal or otherwise): later signals only hurry it."""
        if self.stopping_since is None:
            self.stopping_since = self._clock()

    def __call__(self, _signum: int, _frame: FrameType | None) -> None:
        if self.stopping_since is None:
            self.begin_stop()
            raise KeyboardInterrupt
        if self._clock() - self.stopping_since >= REPEATED_SIGNAL_SECONDS:
            self.hurried.set()


def _say(text: str, stream: IO[str] | None = None) -> None:
    """Print a line of the stop; a closed terminal or pipe (EIO, EPIPE) never interrupts
    stopping the services."""
    with contextlib.suppress(OSError, ValueError):
        print(text, file=stream or sys.stdout, flush=True)


def stop_services(
    children: list[tuple[str, subprocess.Popen]],
    grace_seconds: float,
    signals: StopSignals,
    poll_seconds: float = 0.05,
) -> None:
    """Stop every child still running, dependents first (reverse start order), one at a
    time: each drains while what it calls is still up; one that outlives `grace_seconds`
    (plus slack) is killed. Once `signals.hurried`, every child still running gets SIGTERM
    at once and SIGKILL after HURRIED_GRACE_SECONDS.

    Never returns with a child running: it runs to the end whatever signals arrive
    (StopSignals never raises once the stop began) and kills what will not stop."""
    signals.begin_stop()
    kill_at: dict[int, float] = {}
    hurried_at: float | None = None
    for name, child in reversed(children):
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
        kill_at.setdefault(child.pid, time.monotonic() + grace_seconds + 5)
        while child.poll() is None:
            if signals.hurried.is_set() and hurried_at is None:
                hurried_at = time.monotonic()
                _say("  hurrying: stopping every service now", sys.stderr)
                for _, other in children:
                    if other.poll() is None:
                        other.send_signal(signal.SIGTERM)
                        kill_at[other.pid] = min(
                            kill_at.get(other.pid, float("inf")),
                            hurried_at + HURRIED_GRACE_SECONDS,
                        )
            if time.monotonic() >= kill_at[child.pid]:
                _say(f"  {name} did not stop in time; killing it", sys.stderr)
                child.kill()
                child.wait()
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=poll_seconds)
        _say(f"  {name} stopped (exit {child.returncode})")


def _forward(stream: IO[str]) -> None:
    """Keep a child's stdout drained (a full pipe would block it) and visible."""
    for line in stream:
        sys.stdout.write(line)


def _first_start_setup(settings: object, home: Path, wait_seconds: float = 30.0) -> None:
    """Once branch-manager is SERVING: the first admin and its credentials file, unless the
    file exists (quarry.cli.setup.first_start_setup). Never stops `quarry up`."""
    from quarry.cli.base import CLI_RETRY
    from quarry.cli.setup import first_start_setup, wait_for_branch_manager
    from quarry.client import Client
    from quarry.client.credentials import credentials_path

    if credentials_path(home).exists():
        print(f"  credentials: {credentials_path(home)}")
        return
    unreachable = wait_for_branch_manager(settings, wait_seconds)
    if unreachable:
        print(f"  admin setup skipped: {unreachable}", file=sys.stderr)
        return
    address = settings.branch_manager_address  # type: ignore[attr-defined]
    with Client(address, settings.committer_address, retry=CLI_RETRY) as client:  # type: ignore[attr-defined]
        first_start_setup(client, home)


def lost_store(settings: Settings, home: Path) -> str:
    """Why `quarry up` must not start, or "": the home's own SQLite KV file is missing while
    the home holds an earlier installation's admin credentials. Starting would silently
    make a new, empty installation (every repository gone, those credentials refused as
    INVALID_CREDENTIALS): the file was deleted or moved, and restoring it is the fix."""
    from quarry.client.credentials import credentials_path

    if settings.kv_url or (home / "kv.db").exists():
        return ""
    if not credentials_path(home).exists():
        return ""
    return (
        f"{home / 'kv.db'} (the KV store: every repository, branch and user) is missing, "
        f"but {credentials_path(home)} holds an earlier installation's admin credentials. "
        "Restore kv.db from a backup; to start a new, empty installation instead, remove "
        f"{credentials_path(home)}"
    )


def shared_caches(env: dict[str, str]) -> None:
    """In a container with a memory limit, the memory caches every service of `quarry up`
    may keep, together: each service fits its own processes' caches to the limit
    (Settings.caches_fitted), as if it had the container to itself, which it has in a pod;
    here all of them share it, so `quarry up` fits the sum and hands each service the
    sizes (QUARRY_RANGE_CACHE_BYTES, QUARRY_METARANGE_CACHE_BYTES in its environment)."""
    from quarry.config import container_memory_limit

    limit = container_memory_limit()
    if limit is None:
        return
    settings = load_settings(env)
    processes = sum(settings.cache_processes_of(service) for service in start_order())
    fitted, reason = settings.caches_fitted(limit, processes)
    if reason:
        print(f"quarry up: {reason}", file=sys.stderr)
        env["QUARRY_RANGE_CACHE_BYTES"] = str(fitted.range_cache_bytes)
        env["QUARRY_METARANGE_CACHE_BYTES"] = str(fitted.metarange_cache_bytes)


def cmd_up(args: argparse.Namespace) -> int:
    settings = load_settings()
    home = Path(settings.home).resolve()
    home.mkdir(mode=0o700, parents=True, exist_ok=True)  # owner only: the KV, the key
    lost = lost_store(settings, home)
    if lost:
        print(f"quarry up: {lost}", file=sys.stderr)
        return 1
    if settings.auth_enabled:
        from quarry.auth.keys import ensure_signing_key

        ensure_signing_key(settings)  # the key file (0600) every service reads, once
    from quarry.console.sessions import ensure_session_key

    ensure_session_key(settings)  # the console's session key file (0600), once
    env = dict(os.environ, QUARRY_HOME=str(home), PYTHONUNBUFFERED="1")
    if not setting_given("branch_manager_workers"):
        # branch-manager on every core unless told otherwise (quarry.runtime.workers).
        env["QUARRY_BRANCH_MANAGER_WORKERS"] = "0"
    shared_caches(env)
    print(f"Quarry {quarry.__version__} (storage format {quarry.FORMAT_VERSION})")
    print(f"  data:   {home}  (KV: {settings.effective_kv_url})")
    children: list[tuple[str, subprocess.Popen]] = []
    # Explicit handlers: a shell that starts us in the background sets SIGINT to "ignore",
    # which Python would otherwise keep. The services have their own process group (below),
    # so a closed terminal's SIGHUP reaches only us: stop them in order then too.
    signals = StopSignals()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signals)
    # The lifeline: every service holds the read end, only we hold the write end. When we
    # die outright (SIGKILL, OOM), the kernel closes it and each service, reading EOF, stops
    # (quarry.runtime.lifeline): a dead `quarry up` never leaves services serving.
    lifeline, lifeline_held = os.pipe()
    env[LIFELINE_FD_ENV] = str(lifeline)
    stopped = False

    def stop_all() -> None:
        nonlocal stopped
        signals.begin_stop()  # first: from here on a signal only hurries the stop
        if not stopped:
            stopped = True
            stop_services(children, settings.shutdown_grace_seconds, signals)

    try:
        for name in start_order():
            # Its own process group: Ctrl-C in the terminal reaches only `quarry up`, which
            # then stops the services in order (else all would stop at once, the kv-gateway
            # possibly first).
            child = subprocess.Popen(
                [sys.executable, "-m", "quarry.cli.main", "serve", name],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
                process_group=0,
                pass_fds=(lifeline,),
            )
            children.append((name, child))
            assert child.stdout is not None  # stdout=PIPE
            line = child.stdout.readline()
            if "ready" not in line:
                child.wait(timeout=10)
                print(
                    f"quarry up: {name} failed to start (exit {child.returncode})", file=sys.stderr
                )
                stop_all()
                return 1
            threading.Thread(target=_forward, args=(child.stdout,), daemon=True).start()
            port = settings.port_of(name)
            metrics = settings.metrics_port_of(name)
            workers = re.search(r"\((\d+ workers)\)", line)
            print(
                f"  {name:<17} {settings.listen_host}:{port}"
                + (f" ({workers[1]})" if workers else "")
                + (
                    f"   metrics http://{settings.metrics_host}:{metrics}/metrics"
                    if metrics
                    else ""
                )
            )
        _first_start_setup(settings, home)
        host = settings.listen_host
        lake = home / "lake" / "demo"
        q, grpcurl = _command("quarry"), _command("grpcurl")
        print("\nTry it from another terminal:")
        print(f"  {q} repo create demo {lake}")
        print(f"  {q} put demo main docs/ --from README.md")
        print(f"  {q} commit demo main -m 'first commit'")
        print(f"  {q} ls demo main --recursive && {q} log demo main")
        # Under TLS the printed commands verify the suite's certificate (and present the
        # client certificate under mTLS): each works as printed.
        tls = bool(settings.tls_cert_file)
        transport = "-plaintext"
        if tls:
            transport = f"-cacert {settings.tls_ca_file}" if settings.tls_ca_file else ""
            if settings.tls_client_auth:
                transport += f" -cert {settings.tls_cert_file} -key {settings.tls_key_file}"
        print("\nOr with grpcurl (every service serves reflection; other calls need a token):")
        print(f"  {grpcurl} {transport} {host}:{settings.branch_manager_port} list")
        auth = f'-H "authorization: Bearer $({q} auth token)" ' if settings.auth_enabled else ""
        print(
            f"  {grpcurl} {transport} {auth}"
            f'-d \'{{"repository":"demo","ref":"main"}}\' '
            f"{host}:{settings.branch_manager_port} quarry.v1.BranchManager/ListObjects"
        )
        print(
            f"  {grpcurl} {transport} {host}:{settings.kv_gateway_port} "
            "quarry.v1.ServerInfo/GetServerInfo"
        )
        # One line: the credentials' variables must reach the aws process that uses them.
        # The HTTP services serve HTTPS with the suite's certificate when it has one.
        scheme = "https" if tls else "http"
        ca_bundle = f" --ca-bundle {settings.tls_ca_file}" if tls and settings.tls_ca_file else ""
        print("\nOr with any S3 tool (the s3-gateway: bucket = repository, key = REF/PATH):")
        print(
            f'  eval "$({q} auth credentials env)" && {_command("aws")} --endpoint-url '
            f"{scheme}://{host}:{settings.s3_gateway_port}{ca_bundle} s3 ls --recursive "
            "s3://demo/main/"
        )
        from quarry.client.credentials import credentials_path

        # Not indented: the banner's indented lines are shell commands (tests run each one).
        stored = credentials_path(home)
        key_from = f"the access key in {stored}" if stored.exists() else "your access key"
        print(
            f"\nOr in a browser, the console: {scheme}://{host}:{settings.console_port}/ "
            f"(sign in with {key_from})"
        )
        print("\nOr from PySpark (README: Spark), and garbage-collect with Spark:")
        print(
            "  import quarry.spark as qs; "
            "qs.write(df, 'quarry://demo/main/tables/t', mode='append')"
        )
        print(f"  {q} gc run demo            # a dry run; --sweep deletes")
        print("\nPress Ctrl-C to stop.", flush=True)
        while True:
            for name, child in children:
                if child.poll() is not None:
                    print(f"quarry up: {name} exited with {child.returncode}", file=sys.stderr)
                    stop_all()
                    return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        _say("\nstopping...")
        stop_all()
        _say("stopped.")
        return 0
    finally:
        stop_all()  # whatever ended the run (an error included); a no-op after a stop
        os.close(lifeline)
        os.close(lifeline_held)


def cmd_version(args: argparse.Namespace) -> int:
    if getattr(args, "json", False):
        print(json.dumps({"version": quarry.__version__, "format_version": quarry.FORMAT_VERSION}))
        return 0
    print(f"quarry {quarry.__version__}")
    print(f"storage format version {quarry.FORMAT_VERSION}")
    return 0


def cmd_settings(args: argparse.Namespace) -> int:
    if getattr(args, "json", False):
        from quarry.config import describe_settings

        rows = [
            {
                "variable": s.env,
                "type": s.type.__name__,
                "default": s.default,
                "description": s.description,
            }
            for s in describe_settings()
        ]
        print(json.dumps(rows, indent=2))
        return 0
    print(settings_markdown() if args.markdown else settings_text(), end="")
    return 0


TRACES_FILE = "traces.jsonl"


def cmd_up_with_traces(args: argparse.Namespace) -> int:
    """`quarry up`, with `--traces`: a trace receiver (quarry.cli.traces) in this process,
    the services exporting to it; each trace printed as a tree among the services' output
    and appended to $QUARRY_HOME/traces.jsonl."""
    if not args.traces:
        return cmd_up(args)
    from quarry.cli.traces import serving_traces
    from quarry.telemetry import DEFAULT_SETTLE_SECONDS

    settings = load_settings()
    jsonl = Path(settings.home).resolve() / TRACES_FILE
    with contextlib.ExitStack() as stack:
        try:
            receiver = stack.enter_context(
                serving_traces(
                    settings.listen_host,
                    args.traces_port,
                    sys.stdout,
                    jsonl,
                    DEFAULT_SETTLE_SECONDS,
                )
            )
        except RuntimeError:  # gRPC could not bind: the port is taken
            print(
                f"quarry up: cannot receive traces on port {args.traces_port} (address in "
                "use?); choose another with --traces-port",
                file=sys.stderr,
            )
            return 1
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
        os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", "200")  # spans within 0.2 s
        print(f"  traces: {receiver.endpoint} (OTLP/gRPC), printed here and written to {jsonl}")
        print(
            f"          trace a command: OTEL_EXPORTER_OTLP_ENDPOINT={receiver.endpoint} "
            "quarry --trace ..."
        )
        return cmd_up(args)


def register_up(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    up = sub.add_parser("up", help="start every service on the embedded defaults")
    up.add_argument(
        "--traces",
        action="store_true",
        help=f"receive the services' traces: print each as a tree and append it to "
        f"$QUARRY_HOME/{TRACES_FILE}",
    )
    up.add_argument(
        "--traces-port",
        type=int,
        default=4317,
        metavar="PORT",
        help="with --traces: the receiver's port (default: 4317, where `quarry --trace` sends)",
    )
    up.set_defaults(func=cmd_up_with_traces)


def register_serve(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    serve = sub.add_parser("serve", help="run one service")
    serve.add_argument("service", choices=SERVICES)
    serve.set_defaults(func=cmd_serve)


def register_version(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    version = sub.add_parser("version", help="print the package and storage format versions")
    version.add_argument("--json", action="store_true", help="as one JSON object")
    version.set_defaults(func=cmd_version)


def register_settings(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    settings = sub.add_parser("settings", help="list every setting with its default")
    settings.add_argument("--json", action="store_true", help="as a JSON list")
    settings.add_argument("--markdown", action="store_true", help="as a Markdown table")
    settings.set_defaults(func=cmd_settings)


COMMANDS = {
    "up": register_up,
    "serve": register_serve,
    "version": register_version,
    "settings": register_settings,
}
