"""Serving an ASGI application (the s3-gateway, the console) the way every Quarry service is
served: one mechanism for the HTTP services, as quarry.runtime.server is for the gRPC ones.

uvicorn (httptools parser) on a socket bound here with TCP_NODELAY; HTTPS with the
certificate every service serves (QUARRY_TLS_CERT_FILE/KEY_FILE; QUARRY_TLS_CLIENT_AUTH asks
clients for one from QUARRY_TLS_CA_FILE), plaintext beyond loopback refused unless allowed;
metrics on the service's metrics port; JSON or text logs; a trace per request when OTEL_*
asks for one; SIGTERM/SIGINT (and `quarry up`'s lifeline) drain open requests for
QUARRY_SHUTDOWN_GRACE_SECONDS, then the application and its channels are closed."""

from __future__ import annotations

import logging
import math
import signal
import socket
import ssl
from collections.abc import Callable
from typing import Any

from quarry.config import Settings, port_taken

log = logging.getLogger(__name__)
# The lifecycle lines ("signal N, draining", "stopped") under the logger every service's
# server logs them with, so one search (and tests/e2e/test_start_order.py) finds them all.
lifecycle = logging.getLogger("quarry.runtime.server")


def http_listener(service: str, host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """The bound (not yet listening) socket of an HTTP service run by uvicorn. TCP_NODELAY is
    set on it, and Linux gives it to every accepted connection: asyncio sets it on a
    transport's socket only when the socket says IPPROTO_TCP, which a socket made like this
    one (protocol 0) does not, so without it a small answer's last segment waits on Nagle's
    algorithm for the client's delayed ACK (up to ~40 ms on a kept-alive connection: a 4 KiB
    PUT's answer after its headers). `reuse_port`: a worker's, binding the port its
    supervisor reserved (quarry.runtime.workers), beside the other workers."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise port_taken(service, host, port) from None
    return sock


def tls_options(settings: Settings, enabled: bool) -> dict[str, Any]:
    """uvicorn's TLS arguments for the certificate every service serves (none when off)."""
    if not enabled:
        return {}
    options: dict[str, Any] = {
        "ssl_certfile": settings.tls_cert_file,
        "ssl_keyfile": settings.tls_key_file,
    }
    if settings.tls_client_auth:
        options.update(ssl_ca_certs=settings.tls_ca_file, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return options


def serve_asgi(
    settings: Settings,
    service: str,
    make_app: Callable[[bool], tuple[Any, list[Callable[[], None]]]],
) -> None:
    """Run `service`'s ASGI application until SIGTERM/SIGINT or the lifeline. `make_app(tls)`
    builds (the application, what to call once it has stopped: its own close, its channels',
    a background task's stop) after the settings were checked and before the port is bound;
    `tls` says whether it is served over TLS (the console's cookies get Secure).

    Started by a supervisor as one of the service's worker processes (quarry.runtime.workers),
    as a gRPC service's worker is: it binds the supervisor's port with SO_REUSEPORT, its
    metrics on a loopback port of its own (the supervisor serves their sum), and reports
    both on its first line."""
    import uvicorn

    from quarry import telemetry
    from quarry.runtime.lifeline import watch_lifeline
    from quarry.runtime.tls import check_listen, server_tls
    from quarry.runtime.workers import ready_line, start_serving_metrics, worker_role
    from quarry.telemetry.logs import configure_logging

    role = worker_role()
    configure_logging(service, settings.log_level, settings.log_format, worker=role is not None)
    telemetry.configure_tracing(service, warn_when_off=False)  # off is a service's default
    host = settings.listen_host
    tls = server_tls(settings)
    check_listen(settings, service, host, tls)
    app, closers = make_app(tls is not None)
    if role is None:
        sock = http_listener(service, host, settings.port_of(service))
    else:
        sock = http_listener(service, host, role.port, reuse_port=True)
    metrics_port = start_serving_metrics(settings, service, role)
    bound = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        http="httptools",
        ws="none",  # no WebSockets served: uvicorn would otherwise load an implementation
        lifespan="off",
        log_config=None,
        access_log=False,
        # Whole seconds (uvicorn's type): rounded up, never under the grace asked for.
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_seconds),
        server_header=False,
        date_header=True,
        # The client's address is the connection's, never an X-Forwarded-For header
        # (uvicorn trusts one from 127.0.0.1 by default): the console's sign-in throttle
        # is per address, and a header anyone can send would reset it.
        proxy_headers=False,
        **tls_options(settings, tls is not None),
    )

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit:
                return  # a second signal while draining: said once
            lifecycle.info(
                "%s: %s, draining (grace %.1fs)",
                service,
                # A real signal has a frame; the lifeline's call has none (its supervisor went).
                f"signal {sig}" if frame is not None else "its supervisor is gone",
                settings.shutdown_grace_seconds,
            )
            super().handle_exit(sig, frame)

    server = _Server(config)
    log.info(
        "%s listening on %s:%d, %s (metrics port %s)",
        service,
        host,
        bound,
        "plaintext" if tls is None else ("mTLS" if settings.tls_client_auth else "TLS"),
        metrics_port or "off",
    )
    # `quarry up` (or the supervisor of a worker) reads this line: the port is bound.
    print(ready_line(service, host, bound, metrics_port, "", role), flush=True)
    # Ours until uvicorn installs its own, and again after it restores them: a SIGTERM before
    # or after the serving loop stops it the same way (uvicorn re-raises the signal it caught
    # once it has drained; the default action would end the process with -15, not 0).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, frame: server.handle_exit(number, frame))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # Started by `quarry up`: stop, as on SIGTERM, once it is gone (even killed outright).
    # uvicorn's loop polls should_exit, so setting it from the watcher thread is enough.
    watch_lifeline(lambda: server.handle_exit(signal.SIGTERM, None))
    try:
        server.run(sockets=[sock])
    finally:
        for close in closers:
            close()
        lifecycle.info("%s stopped", service)
