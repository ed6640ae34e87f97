"""create_server / serve: the gRPC server every Quarry service runs on.

Every server gets: per-RPC metrics (quarry.telemetry.rpc.RpcMetrics), the
OpenTelemetry interceptor, the error interceptor (domain exceptions → google.rpc.Status),
grpc.health.v1 health, server reflection (for grpcurl) and quarry.v1.ServerInfo. A service plugs in through a `ServiceSpec`: its name, a function that
registers its servicers on the server, the full names of the gRPC services it adds, the
dependencies it needs in order to serve and the start-up work that needs them.

Start order does not matter. A server binds its port and serves health, reflection and
ServerInfo at once; its health (overall "" and its own services) is NOT_SERVING until every
dependency answers — probed with jittered backoff — and its start-up work has run once, then
SERVING, and NOT_SERVING again whenever a dependency stops answering, so a Kubernetes
readiness probe follows reality. While not ready, calls to its own services are refused with
UNAVAILABLE / DEPENDENCY_UNAVAILABLE naming what it waits for, never INTERNAL or a hang.
Start-up work that fails for a reason retrying cannot fix (another storage format version)
still stops the service loudly.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import Gauge

import quarry
from quarry import errors, telemetry
from quarry.config import Settings, container_memory_limit, port_taken
from quarry.runtime.channels import MAX_MESSAGE_BYTES, open_channel
from quarry.runtime.deadline_interceptor import DeadlineInterceptor
from quarry.runtime.errors import RETRYABLE_CODES, ErrorInterceptor, from_rpc_error
from quarry.runtime.handlers import WrappedHandlers, wrap_behavior
from quarry.runtime.lifeline import watch_lifeline
from quarry.runtime.periodic import PeriodicWorker
from quarry.runtime.tls import (
    ChannelSecurity,
    ConnectionClosedAtSetup,
    TlsHandshakeFailed,
    check_listen,
    server_tls,
)
from quarry.runtime.workers import ready_line, start_serving_metrics, worker_role
from quarry.telemetry.logs import configure_logging
from quarry.telemetry.metrics import expose
from quarry.telemetry.rpc import RpcMetrics, server_interceptors
from quarry.v1 import server_info_pb2, server_info_pb2_grpc

log = logging.getLogger(__name__)

# Explicit message limits. Paged responses stay far below them (Settings.max_response_bytes);
# a larger response is refused by the ErrorInterceptor with MESSAGE_TOO_LARGE, a larger
# request by gRPC itself (clients rebuild that as MessageTooLarge, see runtime.errors).
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]


# Readiness: probe every second while ready; while not, retry from 0.1 s backing off to 2 s
# (jittered), each probe bounded by 1 s.
READINESS_INTERVAL_SECONDS = 1.0
READINESS_RETRY_INITIAL_SECONDS = 0.1
READINESS_RETRY_MAX_SECONDS = 2.0
PROBE_TIMEOUT_SECONDS = 1.0
# How much longer than its timeout a round waits for a probe (BoundedProbe), and how many
# probes that outlived it may still be running before a round starts no new one (rounds
# come every 1.5-2.5 s while not ready: 16 covers a 30 s read timeout, so a fresh probe
# sees a store that is back whatever its stuck connections do).
PROBE_SLACK_SECONDS = 0.5
MAX_STUCK_PROBES = 16
# A ready service turns NOT_SERVING after this many failed rounds in a row (the retries come
# within a fraction of a second): one slow health answer under load does not refuse calls.
LOST_AFTER_FAILED_ROUNDS = 2


# Each process's view of its dependencies, for alerts (a worker's gauges are summed on its
# service's metrics port: the number of its processes that see the dependency answer).
DEPENDENCY_UP = Gauge(
    "quarry_dependency_up",
    "1 while the dependency answered this process's last probe round, else 0 (summed over "
    "a service's worker processes)",
    ["dependency"],
    registry=None,
)
SERVING = Gauge(
    "quarry_serving",
    "1 while this process reports SERVING (its dependencies answer and its start-up work "
    "ran), else 0 (summed over a service's worker processes)",
    registry=None,
)


class DependencyUnavailable(errors.Unavailable):
    """The service cannot serve yet: a dependency does not answer (or the start-up work that
    needs it has not run). Retryable; metadata names the dependency."""

    reason = "DEPENDENCY_UNAVAILABLE"


@dataclass(frozen=True)
class Dependency:
    """Something a service needs in order to serve. `probe(timeout)` returns when it answers
    within `timeout` seconds and raises otherwise."""

    name: str  # e.g. "kv-gateway"
    address: str
    probe: Callable[[float], None]
    close: Callable[[], None] = lambda: None


def service_dependency(
    name: str,
    address: str,
    channel: grpc.Channel | None = None,
    security: ChannelSecurity | None = None,
) -> Dependency:
    """Another Quarry service: it answers when its overall grpc.health.v1 status is SERVING,
    so readiness chains (the compactor-sensor waits for a committer that waits for the
    kv-gateway). Probed on `channel` — pass the untraced channel the data calls use, so a
    successful probe also means that very channel is connected — or on a channel of its own
    secured as `security` says (open_channel)."""
    owned = channel is None
    if channel is None:
        # Not traced: a probe every second belongs to no request.
        channel = open_channel(address, traced=False, security=security)
    stub = health_pb2_grpc.HealthStub(channel)

    def probe(timeout: float) -> None:
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError as error:
            code = error.code().name if hasattr(error, "code") else "UNKNOWN"
            # A TLS failure says so (a wrong CA, a missing client certificate), else the code.
            cause = from_rpc_error(error)
            if isinstance(cause, TlsHandshakeFailed | ConnectionClosedAtSetup):
                code = f"{code}: {cause.message}"
            raise DependencyUnavailable(
                f"{name} at {address} does not answer ({code})",
                metadata={"dependency": name, "address": address},
            ) from None
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            raise DependencyUnavailable(
                f"{name} at {address} is {status}",
                metadata={"dependency": name, "address": address},
            )

    return Dependency(name, address, probe, channel.close if owned else (lambda: None))


@dataclass
class ServiceSpec:
    """What a service contributes to its server."""

    name: str  # e.g. "kv-gateway"
    register: Callable[[grpc.Server], None]
    # Full names of the gRPC services `register` adds, for reflection and health.
    grpc_service_names: Sequence[str]
    # Background work a stop lets finish: called with the seconds left of the stop's grace
    # once the server stopped taking calls, before on_stop closes the channels it needs.
    drain: list[Callable[[float], None]] = field(default_factory=list)
    # Called after the server has stopped (close stores, flush reporters).
    on_stop: list[Callable[[], None]] = field(default_factory=list)
    # What must answer before the service reports SERVING and takes calls.
    dependencies: Sequence[Dependency] = ()
    # Start-up work that needs the dependencies (format version check, background loops),
    # run once, in order, the first time they all answer. A retryable error (UNAVAILABLE,
    # ABORTED, ...) is tried again on the next probe; any other error stops the service.
    on_ready: Sequence[Callable[[], object]] = field(default_factory=list)  # results ignored
    # Auth (when settings.auth_enabled): the KV store holding the IAM data (users, policies)
    # the service checks user calls against; None for a service only services may call.
    iam_kv: Any = None
    # An authorizer the service shares with its own servicers (branch-manager's Auth
    # service invalidates its cache on IAM changes); None: one over `iam_kv`.
    authorizer: Any = None


def _is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, errors.QuarryError) and (
        exc.code in RETRYABLE_CODES or exc.code == grpc.StatusCode.DEADLINE_EXCEEDED
    )


@dataclass(frozen=True)
class ReadinessTiming:
    """How Readiness probes: each probe bounded by `probe_timeout`; every `interval` while
    ready; while not, retrying from `retry_initial` backing off to `retry_max` (seconds)."""

    probe_timeout: float = PROBE_TIMEOUT_SECONDS
    interval: float = READINESS_INTERVAL_SECONDS
    retry_initial: float = READINESS_RETRY_INITIAL_SECONDS
    retry_max: float = READINESS_RETRY_MAX_SECONDS


class BoundedProbe:
    """A dependency's probe held to its timeout whatever the probe does: it runs on a
    daemon thread of its own and the round waits at most the timeout for it. A probe that
    ignores its timeout (a DynamoDB read under boto3's 30 s read timeout, against a store
    that accepts connections and never answers) kept a service SERVING for a minute while
    every call waited 30 s. A round after one whose probe is still stuck starts a fresh
    probe (the stuck one's connection may be the only broken one: waiting it out kept the
    suite down for its 30 s after the store was back), at most MAX_STUCK_PROBES at once;
    a daemon thread never holds up the process's exit."""

    def __init__(self, dependency: Dependency) -> None:
        self.dependency = dependency
        self._stuck: list[threading.Thread] = []

    def __call__(self, timeout: float) -> None:
        dependency = self.dependency
        self._stuck = [t for t in self._stuck if t.is_alive()]
        if len(self._stuck) >= MAX_STUCK_PROBES:
            raise self._unanswered(timeout)
        outcome: list[BaseException | None] = []

        def probe() -> None:
            try:
                dependency.probe(timeout)
                outcome.append(None)
            except BaseException as exc:  # handed to the round that waits for it
                outcome.append(exc)

        thread = threading.Thread(target=probe, name=f"probe-{dependency.name}", daemon=True)
        thread.start()
        # A little past the timeout: a probe that keeps to it fails with its own reason (a
        # TLS handshake's, say), not this one.
        thread.join(timeout + PROBE_SLACK_SECONDS)
        if thread.is_alive():
            self._stuck.append(thread)
            raise self._unanswered(timeout)
        if outcome and outcome[0] is not None:
            raise outcome[0]

    def _unanswered(self, timeout: float) -> DependencyUnavailable:
        dependency = self.dependency
        return DependencyUnavailable(
            f"the {dependency.name} at {dependency.address} does not answer within {timeout:g}s",
            metadata={"dependency": dependency.name, "address": dependency.address},
        )


class Readiness:
    """Health follows the dependencies (see the module docstring). `check()` is one probe
    round; a PeriodicWorker repeats it."""

    def __init__(
        self,
        spec: ServiceSpec,
        health_servicer: health.HealthServicer,
        health_names: Sequence[str],
        timing: ReadinessTiming = ReadinessTiming(),
    ):
        self._service = spec.name
        self._dependencies = list(spec.dependencies)
        self._probes = [BoundedProbe(d) for d in self._dependencies]
        expose(DEPENDENCY_UP, SERVING)
        SERVING.set(0)
        self._pending_work = list(spec.on_ready)
        self._health = health_servicer
        self._health_names = list(health_names)
        self._probe_timeout = timing.probe_timeout
        self._lock = threading.Lock()  # one probe round at a time
        names = ",".join(d.name for d in self._dependencies)
        self._waiting_for = names or spec.name
        self._not_ready: DependencyUnavailable | None = DependencyUnavailable(
            f"{spec.name} is starting",
            metadata={"service": spec.name, "dependency": self._waiting_for},
        )
        self._logged: str | None = None
        self._failed_rounds = 0  # consecutive failed probe rounds while ready
        self.failure: BaseException | None = None  # start-up work refused: stop the service
        self.worker = PeriodicWorker(
            f"{spec.name}-readiness",
            self.check,
            timing.interval,
            retry_initial=timing.retry_initial,
            retry_max=timing.retry_max,
        )

    @property
    def ready(self) -> bool:
        return self._not_ready is None

    def refuse_unless_ready(self) -> None:
        """Raise DependencyUnavailable while the service is not ready (the call gate)."""
        refusal = self._not_ready
        if refusal is not None:
            raise refusal

    def check(self) -> bool:
        """Probe every dependency once; when all answer, run the pending start-up work;
        set health accordingly. True when ready."""
        with self._lock:
            if self.failure is not None:
                return False
            missing = []
            for probe in self._probes:
                dependency = probe.dependency
                try:
                    probe(self._probe_timeout)
                    DEPENDENCY_UP.labels(dependency.name).set(1)
                except Exception as exc:  # any failure means "not answering"
                    missing.append((dependency, exc))
                    DEPENDENCY_UP.labels(dependency.name).set(0)
            if missing and self.ready and self._failed_rounds + 1 < LOST_AFTER_FAILED_ROUNDS:
                self._failed_rounds += 1
                log.debug(
                    "%s: probe round failed (%s); still SERVING",
                    self._service,
                    ", ".join(d.name for d, _ in missing),
                )
                return False  # probed again soon, on the backoff schedule
            if missing:
                self._set_not_ready(
                    DependencyUnavailable(
                        f"{self._service} is waiting for its dependencies: "
                        + "; ".join(
                            getattr(exc, "message", None) or f"{d.name} ({exc})"
                            for d, exc in missing
                        ),
                        metadata={
                            "service": self._service,
                            "dependency": ",".join(d.name for d, _ in missing),
                            "address": ",".join(d.address for d, _ in missing),
                        },
                    ),
                    key="waiting for " + ",".join(d.name for d, _ in missing),
                )
                return False
            while self._pending_work:
                try:
                    self._pending_work[0]()
                except Exception as exc:
                    if not _is_retryable(exc):
                        self.failure = exc
                        self.worker.stopping.set()
                        self._set_not_ready(
                            DependencyUnavailable(
                                f"{self._service} refused to start: {exc}",
                                metadata={
                                    "service": self._service,
                                    "dependency": self._waiting_for,
                                },
                            ),
                            key="failed",
                        )
                        log.error("%s: start-up refused: %s", self._service, exc)
                        return False
                    self._set_not_ready(
                        DependencyUnavailable(
                            f"{self._service} is starting: {getattr(exc, 'message', exc)}",
                            metadata={"service": self._service, "dependency": self._waiting_for},
                        ),
                        key="starting",
                    )
                    return False
                self._pending_work.pop(0)
            self._set_ready()
            return True

    def _set_not_ready(self, refusal: DependencyUnavailable, key: str) -> None:
        self._not_ready = refusal
        self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        SERVING.set(0)
        # Logged again when the cause changes, not only the state: a dependency restarted
        # with an expired certificate was still logged as "does not answer" from before.
        logged = f"{key}: {refusal.message}"
        if self._logged != logged:
            self._logged = logged
            log.warning("%s: NOT_SERVING: %s", self._service, refusal.message)

    def _set_ready(self) -> None:
        self._not_ready = None
        self._failed_rounds = 0
        self._set_health(health_pb2.HealthCheckResponse.SERVING)
        SERVING.set(1)
        if self._logged != "ready":
            self._logged = "ready"
            log.info(
                "%s: SERVING%s",
                self._service,
                f" (dependencies answer: {', '.join(d.name for d in self._dependencies)})"
                if self._dependencies
                else "",
            )

    def _set_health(self, status: health_pb2.HealthCheckResponse.ServingStatus) -> None:
        for name in ["", *self._health_names]:
            self._health.set(name, status)

    def close(self) -> None:
        for probe in self._probes:
            try:
                probe.dependency.close()
            except Exception:
                log.debug("closing the probe of %s failed", probe.dependency.name, exc_info=True)


class ReadinessGate(grpc.ServerInterceptor):
    """Refuses calls to the service's own methods while it is not ready (health, reflection
    and ServerInfo always answer). Sits inside ErrorInterceptor, which turns the refusal into
    a rich UNAVAILABLE status."""

    def __init__(self, readiness: Readiness, service_names: Sequence[str]):
        self._readiness = readiness
        self._prefixes = tuple(f"/{name}/" for name in service_names)
        # Wrapped handlers by the handler they wrap: built once per method, not per call.
        self._wrapped = WrappedHandlers()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(self._prefixes):
            return handler
        return self._wrapped.of(handler, self._wrap)

    def _wrap(self, handler: Any) -> Any:
        """`handler`: a grpc RpcMethodHandler (a namedtuple in grpc's implementation)."""
        gate = self._readiness.refuse_unless_ready

        def unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(behavior)
            def wrapper(request: Any, context: grpc.ServicerContext) -> Any:
                gate()
                return behavior(request, context)

            return wrapper

        def streaming(behavior: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
            @functools.wraps(behavior)
            def wrapper(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                gate()
                yield from behavior(request, context)

            return wrapper

        return wrap_behavior(handler, unary, streaming)


class ServerInfoServicer(server_info_pb2_grpc.ServerInfoServicer):
    def __init__(self, service: str):
        self._service = service

    def GetServerInfo(
        self, request: server_info_pb2.GetServerInfoRequest, context: grpc.ServicerContext
    ) -> server_info_pb2.GetServerInfoResponse:
        return server_info_pb2.GetServerInfoResponse(
            service=self._service,
            version=quarry.__version__,
            format_version=quarry.FORMAT_VERSION,
            process_id=os.getpid(),
        )


@dataclass
class QuarryServer:
    """A started gRPC server with its health servicer, as returned by create_server."""

    grpc_server: grpc.Server
    port: int
    health: health.HealthServicer
    spec: ServiceSpec
    readiness: Readiness

    @property
    def failure(self) -> BaseException | None:
        """The error that refused the service's start-up work (it should exit), if any."""
        return self.readiness.failure

    def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING, let in-flight calls finish within `grace`, then clean up.

        Bounded whatever the dependencies do: the probe loop ends first (one probe is at
        most PROBE_TIMEOUT_SECONDS), calls still running after `grace` are cancelled, and
        the on_stop callbacks stop background loops with bounded waits and close the
        dependency channels, which cancels any call still blocked on a dead dependency."""
        # Not waited for: a probe still running is cancelled when on_stop closes its channel.
        started = time.monotonic()
        self.readiness.worker.stop(timeout=0.1)
        self.health.enter_graceful_shutdown()
        self.grpc_server.stop(grace).wait()
        left = max(0.0, (grace or 0.0) - (time.monotonic() - started))
        _run_stop_callbacks(self.spec.name, [functools.partial(d, left) for d in self.spec.drain])
        _run_stop_callbacks(self.spec.name, [*self.spec.on_stop, self.readiness.close])


def _run_stop_callbacks(service: str, callbacks: Sequence[Callable[[], None]]) -> None:
    for callback in callbacks:
        try:
            callback()
        except Exception:  # shutdown must go on
            log.exception("error while stopping %s", service)


def auth_interceptors(settings: Settings, spec: ServiceSpec) -> list[grpc.ServerInterceptor]:
    """[AuthInterceptor] when auth is on (every quarry.v1 call authenticated and authorized
    by the declaration table; health, reflection, ServerInfo, Login and Setup open), [] when
    off. SigningKeyMissing when auth is on and no signing key is configured: the service
    refuses to start rather than serve unauthenticated."""
    if not settings.auth_enabled:
        return []
    from quarry.auth.authorizer import Authorizer, ServicesOnlyAuthorizer
    from quarry.auth.interceptor import AuthInterceptor
    from quarry.auth.keys import resolve_signing_key
    from quarry.auth.store import IamStore
    from quarry.auth.tokens import TokenAuthority

    authority = TokenAuthority(resolve_signing_key(settings))
    authorizer = spec.authorizer
    if authorizer is None:
        authorizer = (
            Authorizer(IamStore(spec.iam_kv), settings.auth_cache_seconds)
            if spec.iam_kv is not None
            else ServicesOnlyAuthorizer()
        )
    return [AuthInterceptor(authority, authorizer)]


def create_server(
    settings: Settings,
    spec: ServiceSpec,
    port: int | None = None,
    host: str | None = None,
    reuse_port: bool = False,
    **readiness_options: float,
) -> tuple[QuarryServer, int]:
    """Build and start a server. `port=0` picks a free port (tests); None = the setting.
    `reuse_port`: bind with SO_REUSEPORT, sharing the port with the other worker processes
    of the service (quarry.runtime.workers); never otherwise, so a port in use is refused.

    Returns once the port is bound and one readiness round has run: a server whose
    dependencies already answer is SERVING on return; otherwise it keeps probing in the
    background. Raises the error of start-up work that refuses (e.g. FormatVersionMismatch).
    `readiness_options` tune the probing (ReadinessTiming fields; tests)."""
    bind_host = host if host is not None else settings.listen_host
    bind_port = settings.port_of(spec.name) if port is None else port
    # Before anything starts: unusable TLS settings, or plaintext beyond loopback, refuse
    # (and release what the spec holds, as stop() would).
    try:
        tls = server_tls(settings)
        check_listen(settings, spec.name, bind_host, tls)
    except errors.QuarryError:
        _run_stop_callbacks(spec.name, spec.on_stop)
        raise
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    info_name = server_info_pb2.DESCRIPTOR.services_by_name["ServerInfo"].full_name
    readiness = Readiness(
        spec, health_servicer, spec.grpc_service_names, ReadinessTiming(**readiness_options)
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=settings.max_workers, thread_name_prefix=spec.name),
        interceptors=[
            # Outermost: every call counted and timed with the code it ends with.
            RpcMetrics(spec.name),
            *server_interceptors(),
            ErrorInterceptor(MAX_MESSAGE_BYTES),
            # The call's deadline and cancellation, for every call the handler makes and
            # the loops of its long work (quarry.runtime.deadlines).
            DeadlineInterceptor(),
            ReadinessGate(readiness, spec.grpc_service_names),
            *auth_interceptors(settings, spec),
        ],
        options=[*SERVER_OPTIONS[:-1], ("grpc.so_reuseport", 1)] if reuse_port else SERVER_OPTIONS,
    )
    spec.register(server)
    server_info_pb2_grpc.add_ServerInfoServicer_to_server(ServerInfoServicer(spec.name), server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [*spec.grpc_service_names, info_name]
    reflection.enable_server_reflection(
        [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )

    address = f"{bind_host}:{bind_port}"
    try:
        if tls is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, tls.credentials())
    except RuntimeError:
        bound = 0
    if bound == 0:
        _run_stop_callbacks(spec.name, spec.on_stop)  # release what the spec holds, as above
        raise port_taken(spec.name, bind_host, bind_port)
    # ServerInfo always answers; "" and the service's own names follow readiness.
    health_servicer.set(info_name, health_pb2.HealthCheckResponse.SERVING)
    for name in ["", *spec.grpc_service_names]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    server.start()
    started = QuarryServer(
        grpc_server=server, port=bound, health=health_servicer, spec=spec, readiness=readiness
    )
    with telemetry.background():  # as every later round (a PeriodicWorker): no spans
        ready = readiness.check()
    if readiness.failure is not None:
        started.stop(0)
        raise readiness.failure
    readiness.worker.start(first_delay=None if ready else readiness.worker.next_delay(False))
    return started, bound


def serve(
    settings: Settings, spec_factory: Callable[[Settings], ServiceSpec], service: str = ""
) -> None:
    """Run one service until SIGTERM/SIGINT, then drain in-flight calls and exit.
    `service`: its name (default: the SERVICE_NAME of `spec_factory`'s module).

    Started by a supervisor as one of the service's worker processes (quarry.runtime.workers):
    it binds the supervisor's port with SO_REUSEPORT, its metrics on a loopback port of its
    own (the supervisor serves their sum), and reports both on its first line."""
    service = service or getattr(sys.modules[spec_factory.__module__], "SERVICE_NAME", "quarry")
    role = worker_role()
    configure_logging(service, settings.log_level, settings.log_format, worker=role is not None)
    # Before the spec builds its outgoing channels and background loops (the channels would
    # trace anyway: they decide per call; see quarry.telemetry).
    telemetry.configure_tracing(service, warn_when_off=False)  # off is a service's default
    stop_requested = threading.Event()
    # Started by `quarry up`: stop, as on SIGTERM, once it is gone (even killed outright).
    watch_lifeline(stop_requested.set)
    settings, fitted = settings.caches_fitted(
        container_memory_limit(), settings.cache_processes_of(service)
    )
    if fitted:
        log.warning("%s: %s", service, fitted)
    spec = spec_factory(settings)
    if role is None:
        server, port = create_server(settings, spec)
    else:
        server, port = create_server(settings, spec, port=role.port, reuse_port=True)
    metrics_port = start_serving_metrics(settings, spec.name, role)
    tls = server_tls(settings)
    log.info(
        "%s listening on %s:%d, %s (metrics port %s)",
        spec.name,
        settings.listen_host,
        port,
        "plaintext" if tls is None else ("mTLS" if tls.requires_client_auth else "TLS"),
        metrics_port or "off",
    )
    not_serving = (
        ""
        if server.readiness.ready
        else f" (NOT_SERVING until {', '.join(d.name for d in spec.dependencies)} answer)"
    )
    # `quarry up` (or the supervisor of a worker) reads this line: the port is bound (health
    # tells whether it is SERVING).
    line = ready_line(spec.name, settings.listen_host, port, metrics_port, not_serving, role)
    print(line, flush=True)

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        log.info(
            "%s: signal %d, draining (grace %.1fs)",
            spec.name,
            signum,
            settings.shutdown_grace_seconds,
        )
        stop_requested.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    while not stop_requested.wait(0.5) and server.failure is None:
        pass
    server.stop(settings.shutdown_grace_seconds)
    log.info("%s stopped", spec.name)
    if server.failure is not None:
        raise server.failure
