"""console wiring: an HTTP (ASGI) service, not a gRPC one. uvicorn (httptools parser)
serves quarry.console.app.ConsoleApp; its pages call branch-manager, committer and the
compactor-sensor over gRPC with the signed-in user's token (the console has no token or
privilege of its own). Metrics on QUARRY_METRICS_BASE_PORT + 6 (9407), JSON or text logs like
every service, a trace per request when OTEL_* asks for one."""

from __future__ import annotations

import logging
import signal

from quarry.config import Settings

SERVICE_NAME = "console"
# Not a readiness gate: the console shows an UNAVAILABLE page while branch-manager or
# committer are away; `quarry up` starts it after them.
DEPENDS_ON: tuple[str, ...] = ("branch-manager", "committer")

log = logging.getLogger(__name__)
lifecycle = logging.getLogger("quarry.runtime.server")


def build_console(settings: Settings, secure: bool = False):
    from quarry.console.app import Console
    from quarry.console.sessions import session_key
    from quarry.runtime.channels import open_service_channel
    from quarry.runtime.tls import channel_security

    key = session_key(settings)  # before any channel: no key, no console (a clear refusal)
    security = channel_security(settings)
    # No token source: every call carries the user's token (quarry.console.app).
    bm_raw, bm = open_service_channel(settings.branch_manager_address, None, security)
    cm_raw, cm = open_service_channel(settings.committer_address, None, security)
    cs_raw, cs = open_service_channel(settings.compactor_sensor_address, None, security)
    console = Console(
        settings,
        bm,
        cm,
        cs,
        workers=min(settings.max_workers, 16),
        secure=secure,
        session_key=key,
    )
    return console, [bm_raw.close, cm_raw.close, cs_raw.close]


def serve(settings: Settings) -> None:
    """Run the console until SIGTERM/SIGINT (uvicorn drains open requests)."""
    import uvicorn

    from quarry import telemetry
    from quarry.console.app import ConsoleApp
    from quarry.runtime.lifeline import watch_lifeline
    from quarry.runtime.tls import check_listen, server_tls
    from quarry.services.s3_gateway.service import _tls_options, http_listener
    from quarry.telemetry.logs import configure_logging
    from quarry.telemetry.metrics import start_metrics_endpoint

    configure_logging(SERVICE_NAME, settings.log_level, settings.log_format)
    telemetry.configure_tracing(SERVICE_NAME, warn_when_off=False)
    host, port = settings.listen_host, settings.port_of(SERVICE_NAME)
    # HTTPS with the certificate every service serves; plaintext beyond loopback is refused
    # unless allowed, as for every service.
    tls = server_tls(settings)
    check_listen(settings, SERVICE_NAME, host, tls)
    console, closers = build_console(settings, secure=tls is not None)
    app = ConsoleApp(console)
    # TCP_NODELAY for every accepted connection: a page's head and body never wait on
    # Nagle's algorithm for the browser's delayed ACK.
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
    print(f"{SERVICE_NAME} ready on {host}:{bound}", flush=True)  # `quarry up` reads this line
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, frame: server.handle_exit(number, frame))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    watch_lifeline(lambda: server.handle_exit(signal.SIGTERM, None))
    try:
        server.run(sockets=[sock])
    finally:
        app.close()
        for close in closers:
            close()
        lifecycle.info("%s stopped", SERVICE_NAME)
