"""Multi-process serving: one service as N worker processes on one port.

A CPython process serves gRPC on about one core whatever its thread count, so a hot branch
read by many clients is bound by one process (issue 29). With `QUARRY_BRANCH_MANAGER_WORKERS`
above 1, `quarry serve branch-manager` becomes a supervisor that serves nothing itself: it
reserves the port, starts N workers — each `quarry serve branch-manager` again, a whole
service with its own caches, threads and gRPC server — that all bind that port with
SO_REUSEPORT (the kernel spreads connections over them), sums their metrics on the
service's one metrics port, and stops them all when it stops. This is grpcio's
multiprocessing pattern: the workers are new interpreters (spawned, not forked), so no
gRPC state of the supervisor is ever copied into them; the supervisor creates no gRPC
server or channel at all. The committer (QUARRY_COMMITTER_WORKERS) and the s3-gateway
(QUARRY_S3_GATEWAY_WORKERS; its workers run quarry.runtime.asgi_server) are supervised the
same way.

What stays correct across workers is what already holds across replicas (every service
keeps no state the KV store does not have; tests/e2e/test_workers.py): branch reads are
never served from a read issued before the request arrived, in any worker; commits are
immutable; the idempotency log is in the KV store. Two per-process caches may lag another
worker's change exactly as they lag another replica's: a repository deleted through one
worker may still be read through another for up to the repository cache (2 s), and an IAM
change through one worker reaches the others' authorization caches within
QUARRY_AUTH_CACHE_SECONDS. Per-process limits meant for the service — the Auth/Login
throttle — are divided among the workers (`share_of_workers`).

Safety rules:
- A worker must NEVER outlive its supervisor: each holds the read end of a lifeline pipe
  whose write end only the supervisor holds (quarry.runtime.lifeline), so a supervisor
  that ends any way — SIGKILL and the OOM killer included — stops every worker.
- The supervisor must NEVER join a port another process already listens on: it binds the
  port without SO_REUSEPORT first, and refuses (address in use) if that fails.
- One worker ending ends the service: the supervisor stops the others and exits non-zero,
  so whatever supervises it (`quarry up`, Kubernetes) sees one failed service, never a
  service quietly running at part of its capacity.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import IO

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from quarry.config import Settings, port_taken
from quarry.runtime.lifeline import LIFELINE_FD_ENV, watch_lifeline
from quarry.telemetry.logs import configure_logging
from quarry.telemetry.metrics import start_metrics_endpoint

log = logging.getLogger(__name__)

# Set by the supervisor in each worker's environment: "INDEX:COUNT:PORT" — which of how many
# workers, and the port every worker binds with SO_REUSEPORT. Not a setting: a worker is
# never started by hand.
WORKER_ENV = "QUARRY_SERVING_WORKER"
# A worker's first stdout line, read by its supervisor: it is bound, and where its own
# metrics are (loopback, for the supervisor's sum).
_READY = re.compile(r" ready on \S+ metrics (?P<metrics>\d+)(?P<rest>.*)$")
# How long a scrape of one worker's metrics may take.
SCRAPE_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class WorkerRole:
    """What a worker process was told by its supervisor."""

    index: int
    count: int  # how many workers serve the port
    port: int


def worker_role(env: dict[str, str] | None = None) -> WorkerRole | None:
    """The role of this process when its supervisor started it as a worker, else None."""
    raw = (os.environ if env is None else env).get(WORKER_ENV, "")
    if not raw:
        return None
    index, count, port = raw.split(":")
    return WorkerRole(int(index), int(count), int(port))


def share_of_workers(limit: int) -> int:
    """This process's share of a limit meant for the whole service (at least 1): the limit
    divided by the number of workers in a worker process, the limit itself otherwise. A
    per-process limit enforced in each of N workers would otherwise admit N times as much
    to a caller whose connections land on every worker."""
    role = worker_role()
    return limit if role is None else max(1, limit // role.count)


def start_serving_metrics(settings: Settings, service: str, role: WorkerRole | None) -> int:
    """The metrics endpoint of a process that serves `service`: the service's metrics port,
    or for a worker a loopback port of its own that only its supervisor reads (to serve the
    workers' sum on the service's port). Returns the bound port (0 when metrics are off)."""
    if role is None:
        return start_metrics_endpoint(settings.metrics_host, settings.metrics_port_of(service))
    if settings.metrics_base_port <= 0:
        return 0
    return start_metrics_endpoint("127.0.0.1", 0, any_port=True)


def ready_line(
    service: str, host: str, port: int, metrics_port: int, rest: str, role: WorkerRole | None
) -> str:
    """The line a serving process prints once bound: read by `quarry up`, or for a worker by
    its supervisor (parsed by `_READY`: it also names the worker's metrics port)."""
    if role is None:
        return f"{service} ready on {host}:{port}{rest}"
    return f"{service} worker {os.getpid()} ready on {host}:{port} metrics {metrics_port}{rest}"


@contextlib.contextmanager
def reserved_port(host: str, port: int, service: str) -> Iterator[int]:
    """Hold `host:port` (0: a free one) for the workers: a socket bound with SO_REUSEPORT and
    never listening, so it takes no connection and the workers can bind the same port.
    Unavailable (address in use) if something else holds the port: checked first with a
    bind WITHOUT SO_REUSEPORT, which any listener fails, even one that set SO_REUSEPORT."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC: TIME_WAIT is fine
        try:
            probe.bind(address)
        except OSError:
            raise port_taken(service, host, port) from None
        if port == 0:
            port = probe.getsockname()[1]
    # A free port picked above may be taken between the two binds: then this bind fails.
    reservation = socket.socket(family, kind, proto)
    try:
        reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            reservation.bind((address[0], port, *address[2:]))
        except OSError:
            raise port_taken(service, host, port) from None
        yield port
    finally:
        reservation.close()


# ---- metrics: the workers' sum ----------------------------------------------------------

# Samples whose sum means nothing: the earliest stands for all (a counter's creation time,
# the process start) or they are the same in every worker (constants, limits).
_EARLIEST = ("_created", "process_start_time_seconds")
_SAME = ("python_info", "process_max_fds")


def _combine(sample_name: str, values: list[float]) -> float:
    if sample_name.endswith(_EARLIEST[0]) or sample_name == _EARLIEST[1]:
        return min(values)
    if sample_name in _SAME:
        return max(values)
    return sum(values)


def sum_metrics(texts: list[str]) -> list[Metric]:
    """The workers' metrics (Prometheus text exposition, one text per worker) as one
    process's: every sample with the same name and labels summed — counters, histograms'
    buckets, sums and counts, and gauges (the cache sizes, in-flight calls) are totals over
    the workers — except creation and start times (the earliest) and constants."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], list[float]]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                values[family.name].setdefault(key, []).append(sample.value)
    merged = []
    for name, family in families.items():
        for (sample_name, labels), found in values[name].items():
            family.add_sample(sample_name, dict(labels), _combine(sample_name, found))
        merged.append(family)
    return merged


class WorkersMetrics(Collector):
    """The supervisor's /metrics: each scrape reads every live worker's endpoint (on
    loopback) and reports their sum (`sum_metrics`), plus quarry_workers — how many workers
    answered, so a sum missing one shows (its counters then dip until it answers again)."""

    def __init__(self, service: str, ports: list[int]) -> None:
        self._service = service
        self._ports = list(ports)

    def collect(self) -> Iterator[Metric]:
        texts = []
        for port in self._ports:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/metrics", timeout=SCRAPE_TIMEOUT_SECONDS
                ) as reply:
                    texts.append(reply.read().decode())
            except OSError as exc:
                log.warning(
                    "%s: worker metrics on port %d did not answer: %s", self._service, port, exc
                )
        yield from sum_metrics(texts)
        answered = GaugeMetricFamily(
            "quarry_workers",
            "Worker processes of this service whose metrics are summed here (those that "
            "answered this scrape)",
            labels=["service"],
        )
        answered.add_metric([self._service], len(texts))
        yield answered


# ---- the supervisor ---------------------------------------------------------------------


def _forward(stream: IO[str]) -> None:
    """Keep a worker's stdout drained (a full pipe would block it) and visible."""
    for line in stream:
        sys.stdout.write(line)
        sys.stdout.flush()


def _stop_workers(workers: list[subprocess.Popen], grace_seconds: float) -> None:
    """SIGTERM every worker (each drains its in-flight calls, as a single process would),
    then wait; one still running after the grace (plus slack) is killed."""
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds + 5
    for worker in workers:
        try:
            worker.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("worker %d did not stop in time; killing it", worker.pid)
            worker.kill()
            worker.wait()


def supervise(settings: Settings, service: str, count: int) -> int:
    """Run `service` as `count` worker processes on its port until SIGTERM/SIGINT (or the
    lifeline of `quarry up`), then drain them all. Returns the exit status: 0 after a
    requested stop, non-zero when a worker failed to start or ended on its own."""
    configure_logging(service, settings.log_level, settings.log_format)
    stop_requested = threading.Event()
    watch_lifeline(stop_requested.set)  # our own supervisor (`quarry up`), if any

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("%s: signal %d, draining %d workers", service, signum, count)
        stop_requested.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    host = settings.listen_host
    with reserved_port(host, settings.port_of(service), service) as port:
        # The workers' lifeline: they hold the read end, only we hold the write end.
        lifeline, lifeline_held = os.pipe()
        workers: list[subprocess.Popen] = []
        try:
            for index in range(count):
                env = dict(os.environ, PYTHONUNBUFFERED="1")
                env[WORKER_ENV] = f"{index}:{count}:{port}"
                env[LIFELINE_FD_ENV] = str(lifeline)
                workers.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "quarry.cli.main", "serve", service],
                        env=env,
                        stdout=subprocess.PIPE,
                        text=True,
                        pass_fds=(lifeline,),
                    )
                )
            os.close(lifeline)  # the workers hold it; ours would keep no one alive
            lifeline = -1
            metrics_ports, not_serving = [], ""
            for worker in workers:
                assert worker.stdout is not None
                line = worker.stdout.readline()
                ready = _READY.search(line)
                if ready is None:
                    worker.wait()
                    log.error(
                        "%s: worker %d failed to start (exit %s)",
                        service,
                        worker.pid,
                        worker.returncode,
                    )
                    return worker.returncode or 1
                metrics_ports.append(int(ready["metrics"]))
                not_serving = not_serving or ready["rest"]
                threading.Thread(target=_forward, args=(worker.stdout,), daemon=True).start()
            registry = CollectorRegistry(auto_describe=False)
            registry.register(WorkersMetrics(service, metrics_ports))
            metrics_port = start_metrics_endpoint(
                settings.metrics_host, settings.metrics_port_of(service), registry
            )
            log.info(
                "%s: %d workers (pids %s) on %s:%d (metrics port %s, their sum)",
                service,
                count,
                ", ".join(str(w.pid) for w in workers),
                host,
                port,
                metrics_port or "off",
            )
            # `quarry up` reads this line, as a single process's.
            print(f"{service} ready on {host}:{port} ({count} workers){not_serving}", flush=True)
            while not stop_requested.wait(0.2):
                ended = [w for w in workers if w.poll() is not None]
                if ended:
                    log.error(
                        "%s: worker %d ended (exit %s); stopping the others",
                        service,
                        ended[0].pid,
                        ended[0].returncode,
                    )
                    return ended[0].returncode or 1
            return 0
        finally:
            _stop_workers(workers, settings.shutdown_grace_seconds)
            if lifeline >= 0:
                os.close(lifeline)
            os.close(lifeline_held)
            log.info("%s stopped", service)
