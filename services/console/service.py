"""console wiring: an HTTP (ASGI) service, not a gRPC one. uvicorn (httptools parser)
serves quarry.console.app.ConsoleApp; its pages call branch-manager, committer and the
compactor-sensor over gRPC with the signed-in user's token (the console's own service
token goes only as the relay of the uploads it stages, quarry.auth.checks). Metrics on QUARRY_METRICS_BASE_PORT + 6 (9407), JSON or text logs like
every service, a trace per request when OTEL_* asks for one."""

from __future__ import annotations

from quarry.config import Settings

SERVICE_NAME = "console"
# Not a readiness gate: the console shows an UNAVAILABLE page while branch-manager or
# committer are away; `quarry up` starts it after them.
DEPENDS_ON: tuple[str, ...] = ("branch-manager", "committer")


def build_console(settings: Settings, secure: bool = False):
    from quarry.auth.service_tokens import token_source
    from quarry.console.app import Console
    from quarry.console.sessions import session_key
    from quarry.runtime.channels import open_service_channel
    from quarry.runtime.tls import channel_security

    key = session_key(settings)  # before any channel: no key, no console (a clear refusal)
    security = channel_security(settings)
    # No token source on the channels: every call carries the user's token
    # (quarry.console.app); the console's own goes only as the relay of its uploads.
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
        relay=token_source(settings, SERVICE_NAME),
    )
    return console, [bm_raw.close, cm_raw.close, cs_raw.close]


def serve(settings: Settings) -> None:
    """Run the console until SIGTERM/SIGINT (uvicorn drains open requests;
    quarry.runtime.asgi_server)."""
    from quarry.console.app import ConsoleApp
    from quarry.runtime.asgi_server import serve_asgi

    def make_app(tls: bool):
        console, closers = build_console(settings, secure=tls)
        app = ConsoleApp(console)
        return app, [app.close, *closers]

    serve_asgi(settings, SERVICE_NAME, make_app)
