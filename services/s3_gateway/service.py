"""s3-gateway wiring: an HTTP (ASGI) service, not a gRPC one. uvicorn (httptools parser)
serves quarry.s3gateway.app.S3App; the app calls branch-manager and committer over gRPC
with each caller's own token, and the Auth service (on branch-manager) with the gateway's
service token to check SigV4 signatures. Metrics on QUARRY_METRICS_BASE_PORT + 5 (9406),
JSON or text logs like every service, a trace per request when OTEL_* asks for one."""

from __future__ import annotations

import logging

from quarry.config import Settings

log = logging.getLogger("quarry.s3gateway")

SERVICE_NAME = "s3-gateway"
# Not gRPC dependencies of a readiness gate: the gateway answers S3 errors (503
# ServiceUnavailable) while branch-manager or committer are away; `quarry up` starts it last.
DEPENDS_ON: tuple[str, ...] = ("branch-manager", "committer")


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
    gateway = Gateway(settings, bm, cm, auth, workers=settings.max_workers, relay=tokens)
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


def serve(settings: Settings) -> None:
    """Run the gateway until SIGTERM/SIGINT (uvicorn drains open requests), with its
    background sweep of abandoned multipart uploads (quarry.runtime.asgi_server)."""
    from quarry.runtime.asgi_server import serve_asgi
    from quarry.runtime.workers import worker_role
    from quarry.s3gateway.app import S3App

    role = worker_role()
    # With worker processes, one sweep is enough: the first worker's.
    sweeps = role is None or role.index == 0

    def make_app(tls: bool):
        gateway, closers, service_channel = build_gateway(settings)
        app = S3App(gateway)
        sweep = multipart_sweep_worker(settings, service_channel) if sweeps else None
        stops = [app.close, *closers]
        if sweep is not None:
            sweep.start()
            stops.insert(0, sweep.stop)
            log.info(
                "sweeping abandoned multipart uploads every %ss (expiry %ss)",
                settings.s3_gateway_multipart_sweep_seconds,
                settings.s3_gateway_multipart_expiry_seconds,
            )
        return app, stops

    serve_asgi(settings, SERVICE_NAME, make_app)
