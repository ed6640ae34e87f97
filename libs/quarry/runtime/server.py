"""create_server / serve: the gRPC server every Quarry service runs on.

Every server gets: the error interceptor (domain exceptions → google.rpc.Status), the
OpenTelemetry interceptor, grpc.health.v1 health, server reflection (for grpcurl) and
quarry.v1.ServerInfo. A service plugs in through a `ServiceSpec`: its name, a function that
registers its servicers on the server, and the full names of the gRPC services it adds.
"""

from __future__ import annotations

import logging
import signal
import threading
from concurrent import futures
from dataclasses import dataclass, field
from typing import Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

import quarry
from quarry import errors, telemetry
from quarry.config import Settings
from quarry.runtime.channels import MAX_MESSAGE_BYTES
from quarry.runtime.errors import ErrorInterceptor
from quarry.telemetry.metrics import start_metrics_endpoint
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


@dataclass
class ServiceSpec:
    """What a service contributes to its server."""

    name: str  # e.g. "kv-gateway"
    register: Callable[[grpc.Server], None]
    # Full names of the gRPC services `register` adds, for reflection and health.
    grpc_service_names: Sequence[str]
    # Called after the server has stopped (close stores, flush reporters).
    on_stop: list[Callable[[], None]] = field(default_factory=list)


class ServerInfoServicer(server_info_pb2_grpc.ServerInfoServicer):
    def __init__(self, service: str):
        self._service = service

    def GetServerInfo(self, request, context):
        return server_info_pb2.GetServerInfoResponse(
            service=self._service, version=quarry.__version__,
            format_version=quarry.FORMAT_VERSION)


@dataclass
class QuarryServer:
    """A started gRPC server with its health servicer, as returned by create_server."""

    grpc_server: grpc.Server
    port: int
    health: health.HealthServicer
    spec: ServiceSpec

    def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING, let in-flight calls finish within `grace`, then clean up."""
        self.health.enter_graceful_shutdown()
        self.grpc_server.stop(grace).wait()
        for callback in self.spec.on_stop:
            try:
                callback()
            except Exception:  # noqa: BLE001 — shutdown must go on
                log.exception("error while stopping %s", self.spec.name)


def create_server(settings: Settings, spec: ServiceSpec, port: int | None = None,
                  host: str | None = None) -> tuple[QuarryServer, int]:
    """Build and start a server. `port=0` picks a free port (tests); None = the setting."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=settings.max_workers,
                                   thread_name_prefix=spec.name),
        interceptors=[*telemetry.server_interceptors(),
                      ErrorInterceptor(MAX_MESSAGE_BYTES)],
        options=SERVER_OPTIONS,
    )
    spec.register(server)
    server_info_pb2_grpc.add_ServerInfoServicer_to_server(ServerInfoServicer(spec.name), server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [*spec.grpc_service_names, server_info_pb2.DESCRIPTOR.services_by_name[
        "ServerInfo"].full_name]
    reflection.enable_server_reflection(
        [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)

    bind_host = host if host is not None else settings.listen_host
    bind_port = settings.port_of(spec.name) if port is None else port
    try:
        bound = server.add_insecure_port(f"{bind_host}:{bind_port}")
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise errors.Unavailable(
            f"{spec.name} cannot listen on {bind_host}:{bind_port} (address in use?); "
            f"choose another with QUARRY_{spec.name.upper().replace('-', '_')}_PORT",
            metadata={"address": f"{bind_host}:{bind_port}"})
    server.start()
    for name in ["", *names]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return QuarryServer(grpc_server=server, port=bound, health=health_servicer, spec=spec), bound


def serve(settings: Settings, spec_factory: Callable[[Settings], ServiceSpec]) -> None:
    """Run one service until SIGTERM/SIGINT, then drain in-flight calls and exit."""
    logging.basicConfig(level=settings.log_level.upper(),
                        format=f"%(asctime)s {spec_factory.__module__.split('.')[0]} "
                               "%(levelname)s %(name)s: %(message)s")
    spec = spec_factory(settings)
    telemetry.configure_tracing(spec.name)
    server, port = create_server(settings, spec)
    metrics_port = start_metrics_endpoint(settings.metrics_host,
                                          settings.metrics_port_of(spec.name))
    log.info("%s serving on %s:%d (metrics port %s)", spec.name, settings.listen_host, port,
             metrics_port or "off")
    print(f"{spec.name} ready on {settings.listen_host}:{port}", flush=True)

    stop_requested = threading.Event()

    def request_stop(signum, _frame):
        log.info("%s: signal %d, draining (grace %.1fs)", spec.name, signum,
                 settings.shutdown_grace_seconds)
        stop_requested.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    while not stop_requested.wait(1.0):
        pass
    server.stop(settings.shutdown_grace_seconds)
    log.info("%s stopped", spec.name)
