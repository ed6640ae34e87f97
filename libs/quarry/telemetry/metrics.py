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

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.registry import Collector

from quarry import errors

log = logging.getLogger(__name__)


def start_metrics_endpoint(
    host: str, port: int, registry: CollectorRegistry = REGISTRY, *, any_port: bool = False
) -> int:
    """Serve /metrics on host:port; port 0 disables it (with `any_port`: picks a free one).
    Returns the bound port (0 if none)."""
    if port < 0 or (port == 0 and not any_port):
        return 0
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except (OSError, OverflowError) as exc:  # in use, a host that does not resolve
        raise errors.Unavailable(
            f"cannot serve metrics on {host}:{port} ({exc}); choose another with "
            "QUARRY_METRICS_BASE_PORT (0: off) or QUARRY_METRICS_HOST",
            metadata={"address": f"{host}:{port}"},
        ) from None
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
