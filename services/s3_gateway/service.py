"""s3-gateway wiring: an HTTP (ASGI) service, not a gRPC one. uvicorn (httptools parser)
serves quarry.s3gateway.app.S3App; the app calls branch-manager and committer over gRPC
with each caller's own token, and the Auth service (on branch-manager) with the gateway's
service token to check SigV4 signatures. Metrics on QUARRY_METRICS_BASE_PORT + 5 (9406),
JSON or text logs like every service, a trace per request when OTEL_* asks for one."""

from __future__ import annotations

import logging
import signal
import socket

from quarry.config import Settings

SERVICE_NAME = "s3-gateway"
# Not gRPC dependencies of a readiness gate: the gateway answers S3 errors (503
# ServiceUnavailable) while branch-manager or committer are away; `quarry up` starts it last.
DEPENDS_ON: tuple[str, ...] = ("branch-manager", "committer")

log = logging.getLogger(__name__)
# The lifecycle lines ("signal N, draining", "stopped") under the logger every service's
# server logs them with, so one search (and tests/e2e/test_start_order.py) finds them all.
lifecycle = logging.getLogger("quarry.runtime.server")


def build_gateway(settings: Settings):
    from quarry.auth.service_tokens import token_source
    from quarry.runtime.channels import open_service_channel
    from quarry.runtime.tls import channel_security
    from quarry.s3gateway.app import Gateway
    from quarry.v1 import auth_pb2_grpc

    security = channel_security(settings)
    tokens = token_source(settings, SERVICE_NAME)
    bm_raw, bm = open_service_channel(settings.branch_manager_address, None, security)
    cm_raw, cm = open_service_channel(settings.committer_address, None, security)
    auth = None
    closers = [bm_raw.close, cm_raw.close]
    # The gateway's own calls (not a user's): over a channel carrying its service token
    # when auth is on.
    service_bm = bm
    if tokens is not None:
        auth_raw, auth_channel = open_service_channel(
            settings.branch_manager_address, tokens, security
        )
        auth = auth_pb2_grpc.AuthStub(auth_channel)
        service_bm = auth_channel
        closers.append(auth_raw.close)
    gateway = Gateway(settings, bm, cm, auth, workers=settings.max_workers)
    return gateway, closers, service_bm


def multipart_sweep_worker(settings: Settings, service_channel):
    """The background sweep of abandoned multipart uploads over every repository
    (operations.AbandonedUploadSweeper), every QUARRY_S3_GATEWAY_MULTIPART_SWEEP_SECONDS;
    None when that or QUARRY_S3_GATEWAY_MULTIPART_EXPIRY_SECONDS is 0 (no sweep)."""
    from quarry.client import Client
    from quarry.runtime.periodic import PeriodicWorker
    from quarry.s3gateway.operations import AbandonedUploadSweeper

    interval = float(settings.s3_gateway_multipart_sweep_seconds)
    expiry = float(settings.s3_gateway_multipart_expiry_seconds)
    if interval <= 0 or expiry <= 0:
        return None
    # The repositories are listed as the gateway's service principal (every repository,
    # whoever's); the channel is the gateway's, the client owns none.
    client = Client(branch_manager=service_channel, committer=service_channel, token="")
    sweeper = AbandonedUploadSweeper(client.iter_repositories, settings, expiry)
    return PeriodicWorker("s3-multipart-sweep", sweeper.sweep, interval)


def _tls_options(settings: Settings, enabled: bool) -> dict:
    if not enabled:
        return {}
    import ssl

    options: dict[str, object] = {
        "ssl_certfile": settings.tls_cert_file,
        "ssl_keyfile": settings.tls_key_file,
    }
    if settings.tls_client_auth:
        options.update(ssl_ca_certs=settings.tls_ca_file, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return options


def http_listener(host: str, port: int) -> socket.socket:
    """The bound (not yet listening) socket of an HTTP service run by uvicorn (the gateway,
    the console). TCP_NODELAY is set on it, and Linux gives it to every accepted
    connection: asyncio sets it on a transport's socket only when the socket says
    IPPROTO_TCP, which a socket made like this one (protocol 0) does not, so without it a
    small answer's last segment waits on Nagle's algorithm for the client's delayed ACK
    (up to ~40 ms on a kept-alive connection: a 4 KiB PUT's answer after its headers)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


def serve(settings: Settings) -> None:
    """Run the gateway until SIGTERM/SIGINT (uvicorn drains open requests)."""
    import uvicorn

    from quarry import telemetry
    from quarry.runtime.lifeline import watch_lifeline
    from quarry.runtime.tls import check_listen, server_tls
    from quarry.s3gateway.app import S3App
    from quarry.telemetry.logs import configure_logging
    from quarry.telemetry.metrics import start_metrics_endpoint

    configure_logging(SERVICE_NAME, settings.log_level, settings.log_format)
    telemetry.configure_tracing(SERVICE_NAME, warn_when_off=False)  # off is a service's default
    host, port = settings.listen_host, settings.port_of(SERVICE_NAME)
    # HTTPS with the certificate every service serves (QUARRY_TLS_CERT_FILE/KEY_FILE, checked
    # as they do; QUARRY_TLS_CLIENT_AUTH asks clients for one from QUARRY_TLS_CA_FILE);
    # plaintext beyond loopback is refused unless allowed, as for every service.
    tls = server_tls(settings)
    check_listen(settings, SERVICE_NAME, host, tls)
    gateway, closers, service_channel = build_gateway(settings)
    app = S3App(gateway)
    sweep = multipart_sweep_worker(settings, service_channel)
    sock = http_listener(host, port)
    bound = sock.getsockname()[1]
    metrics_port = start_metrics_endpoint(
        settings.metrics_host, settings.metrics_port_of(SERVICE_NAME)
    )
    config = uvicorn.Config(
        app,
        http="httptools",
        lifespan="off",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=int(settings.shutdown_grace_seconds),
        server_header=False,
        date_header=True,
        **_tls_options(settings, tls is not None),
    )

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame) -> None:
            lifecycle.info(
                "%s: signal %d, draining (grace %.1fs)",
                SERVICE_NAME,
                sig,
                settings.shutdown_grace_seconds,
            )
            if not self.should_exit:
                super().handle_exit(sig, frame)

    server = _Server(config)
    log.info(
        "%s listening on %s:%d, %s (metrics port %s)",
        SERVICE_NAME,
        host,
        bound,
        "plaintext" if tls is None else ("mTLS" if settings.tls_client_auth else "TLS"),
        metrics_port or "off",
    )
    # `quarry up` reads this line: the port is bound.
    print(f"{SERVICE_NAME} ready on {host}:{bound}", flush=True)
    # Ours until uvicorn installs its own, and again after it restores them: a SIGTERM before
    # or after the serving loop stops it the same way (uvicorn re-raises the signal it caught
    # once it has drained; the default action would end the process with -15, not 0).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, frame: server.handle_exit(number, frame))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # Started by `quarry up`: stop, as on SIGTERM, once it is gone (even killed outright).
    # uvicorn's loop polls should_exit, so setting it from the watcher thread is enough.
    watch_lifeline(lambda: server.handle_exit(signal.SIGTERM, None))
    if sweep is not None:
        sweep.start()
    try:
        server.run(sockets=[sock])
    finally:
        if sweep is not None:
            sweep.stop()
        app.close()
        for close in closers:
            close()
        lifecycle.info("%s stopped", SERVICE_NAME)
