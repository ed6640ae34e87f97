"""Prometheus: one HTTP endpoint per service process, the per-RPC metrics every server
records, and the rules that keep each service's metrics its own and their cardinality bounded.

Each service runs in its own process (`quarry serve`, and `quarry up` starts one process per
service), so the process-wide registry is the service's registry. A metric that belongs to
one component is created unregistered (`registry=None`) and `expose`d when that component
is built: importing a module (branch-manager imports quarry.compaction for its reporter)
does not put another service's metrics on this one's endpoint.

Cardinality: labels are service, method, status code, operation, partition class, outcome —
all bounded by the code. The one user-chosen label, a branch (with its repository), goes
through `BranchLabels`: ephemeral branches (`_quarry-*`, e.g. each Spark write's
`_quarry-spark-<time>-<random>`) share one value, and only the first MAX_BRANCH_LABELS other
branches a process sees keep their names; later ones are counted under "other".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.registry import Collector

from quarry.runtime.handlers import wrap_behavior

log = logging.getLogger(__name__)


def start_metrics_endpoint(host: str, port: int, registry: CollectorRegistry = REGISTRY) -> int:
    """Serve /metrics on host:port; port 0 disables it. Returns the bound port (0 if none)."""
    if port <= 0:
        return 0
    server, _thread = start_http_server(port, addr=host, registry=registry)
    bound = server.server_address[1]
    log.info("metrics on http://%s:%d/metrics", host, bound)
    return bound


_exposed_lock = threading.Lock()
_exposed: set[int] = set()


def expose(*collectors: Collector, registry: CollectorRegistry = REGISTRY) -> None:
    """Register `collectors` (created with registry=None) in the process's registry, once
    each: called by the component that records them, when it is built."""
    with _exposed_lock:
        for collector in collectors:
            if id(collector) not in _exposed:
                registry.register(collector)
                _exposed.add(id(collector))


# ---- labels ---------------------------------------------------------------------------------

MAX_BRANCH_LABELS = 100
EPHEMERAL_BRANCH_PREFIX = "_quarry-"
EPHEMERAL_LABEL = "_ephemeral"
OTHER_LABEL = "other"


class BranchLabels:
    """(repository, branch) label values with bounded cardinality (see the module docstring):
    at most `limit` named pairs, plus one ephemeral value per named repository, plus
    ("other", "other"). A lookup is one dict hit once a branch has been seen."""

    def __init__(self, limit: int = MAX_BRANCH_LABELS) -> None:
        self._limit = limit
        self._known: dict[tuple[str, str], tuple[str, str]] = {}
        self._repositories: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, repository: str, branch: str) -> tuple[str, str]:
        key = (repository, branch)
        found = self._known.get(key)
        if found is not None:
            return found
        if branch.startswith(EPHEMERAL_BRANCH_PREFIX):
            # Not remembered one by one: there is a new one per Spark write.
            named = repository in self._repositories
            return (repository if named else OTHER_LABEL, EPHEMERAL_LABEL)
        with self._lock:
            found = self._known.get(key)
            if found is None:
                if len(self._known) >= self._limit:
                    return (OTHER_LABEL, OTHER_LABEL)
                found = self._known[key] = key
                self._repositories.add(repository)
            return found


branch_labels = BranchLabels()


# ---- per-RPC metrics ------------------------------------------------------------------------

RPC_REQUESTS = Counter(
    "quarry_rpc_requests",
    "RPCs this service handled, by service, method (quarry.v1.Service/Method) and status code",
    ["service", "method", "code"],
    registry=None,
)
RPC_DURATION = Histogram(
    "quarry_rpc_duration_seconds",
    "Time from a call's arrival to its response (streams: to the last message), by service, "
    "method and status code",
    ["service", "method", "code"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=None,
)


class RpcMetrics(grpc.ServerInterceptor):
    """Counts and times every call (the outermost interceptor, so refusals by the others are
    counted with their codes). Per call: two clock reads and two cached-child updates."""

    def __init__(self, service: str) -> None:
        expose(RPC_REQUESTS, RPC_DURATION)
        self._service = service
        # Wrapped handlers by method: (the handler wrapped, the wrapper).
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(handler, method.lstrip("/"))
        # One entry per method: a handler rebuilt per call (tracing on) replaces it.
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _recorder(self, method: str) -> Callable[[grpc.StatusCode | None, float], None]:
        children: dict[grpc.StatusCode | None, tuple[Any, Any]] = {}
        service = self._service

        def record(code: grpc.StatusCode | None, started: float) -> None:
            elapsed = time.perf_counter() - started
            pair = children.get(code)
            if pair is None:
                name = (code or grpc.StatusCode.OK).name
                pair = children[code] = (
                    RPC_REQUESTS.labels(service, method, name),
                    RPC_DURATION.labels(service, method, name),
                )
            pair[0].inc()
            pair[1].observe(elapsed)

        return record

    def _wrap(self, handler: Any, method: str) -> Any:
        """`handler`: a grpc RpcMethodHandler (a namedtuple in grpc's implementation)."""
        record = self._recorder(method)

        def unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(request: Any, context: grpc.ServicerContext) -> Any:
                started = time.perf_counter()
                try:
                    response = behavior(request, context)
                except BaseException:
                    record(_code_of(context), started)
                    raise
                record(context.code(), started)  # type: ignore[attr-defined]
                return response

            return wrapper

        def streaming(behavior: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
            def wrapper(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                started = time.perf_counter()
                try:
                    yield from behavior(request, context)
                except BaseException:
                    record(_code_of(context), started)
                    raise
                record(context.code(), started)  # type: ignore[attr-defined]

            return wrapper

        return wrap_behavior(handler, unary, streaming)


def _code_of(context: grpc.ServicerContext) -> grpc.StatusCode:
    """The status of a call that raised: the code it aborted with, else UNKNOWN (what gRPC
    answers for an uncaught exception); CANCELLED for a call the client gave up on."""
    code = context.code()  # type: ignore[attr-defined]  # (grpc has it; the stubs lack it)
    if code is not None:
        return code
    return grpc.StatusCode.UNKNOWN if context.is_active() else grpc.StatusCode.CANCELLED
