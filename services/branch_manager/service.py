"""branch-manager wiring: KV through the kv-gateway, committed reads from object storage,
range-writer for the one metarange it writes (a new repository's empty one), the
background dropper of retired staging tokens, and (when compactor_enabled) the reporter
that sends staged-write counts to the compactor-sensor; with auth on, also the Auth service
(IAM over the same KV store) and the service token on every outgoing call."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from quarry.config import Settings

if TYPE_CHECKING:
    from quarry.runtime.server import ServiceSpec

SERVICE_NAME = "branch-manager"
# What must answer before branch-manager serves. Not the compactor-sensor: its reports are
# fire-and-forget. Not the range-writer either: only CreateRepository calls it, and that
# call fails on its own (UNAVAILABLE) while the range-writer is away.
DEPENDS_ON = ("kv-gateway",)


def build(
    settings: Settings,
    kv_store=None,
    committed=None,
    range_writer=None,
    reporter=None,
    dropper_clock=time.time,
) -> ServiceSpec:
    """`reporter`: a started StagingReporter to use instead of one dialing
    settings.compactor_sensor_address (tests); the spec stops it either way.
    `dropper_clock`: the staging dropper's wall clock (core_dependencies; tests)."""
    # Imported here, not at the top: `quarry up` and a worker supervisor import this module
    # for DEPENDS_ON alone, and must not pay for the service's implementation.
    from quarry.auth.service_tokens import service_auth
    from quarry.runtime.server import ServiceSpec
    from quarry.runtime.wiring import core_dependencies
    from quarry.services.branch_manager.servicer import BranchManagerServicer
    from quarry.v1 import auth_pb2, auth_pb2_grpc, branch_manager_pb2, branch_manager_pb2_grpc

    auth = service_auth(settings, SERVICE_NAME)
    tokens = auth.tokens if auth is not None else None
    deps = core_dependencies(
        settings, kv_store, committed, range_writer, tokens=tokens, dropper_clock=dropper_clock
    )
    closers = list(deps.closers)
    if reporter is None and settings.compactor_enabled:
        from quarry.compaction.reporter import StagingReporter
        from quarry.runtime.tls import channel_security

        reporter = StagingReporter(
            settings.compactor_sensor_address,
            interval_seconds=settings.staging_report_interval_seconds,
            token_source=tokens,
            security=channel_security(settings),
        ).start()
    if reporter is not None:
        # After the server has drained: the last acknowledged writes are reported too.
        closers.insert(0, reporter.stop)
    authorizer = None
    auth_servicer = None
    if auth is not None:
        from quarry.auth.authorizer import Authorizer
        from quarry.auth.keys import resolve_signing_key
        from quarry.auth.sigv4_secrets import SecretSealer
        from quarry.auth.store import IamStore
        from quarry.auth.throttle import LoginThrottle
        from quarry.runtime.workers import share_of_workers
        from quarry.services.branch_manager.auth_servicer import AuthServicer

        # One IAM store and authorizer for the Auth service and the interceptor, so an IAM
        # change made here invalidates this process's cache at once. New credentials keep
        # their secret sealed too: the s3-gateway's SigV4 needs it.
        sealer = SecretSealer(resolve_signing_key(settings))
        iam = IamStore(
            deps.graveler.kv, max_response_bytes=settings.max_response_bytes, sealer=sealer
        )
        authorizer = Authorizer(iam, settings.auth_cache_seconds)
        auth_servicer = AuthServicer(
            iam,
            auth.authority,
            authorizer,
            float(settings.auth_token_lifetime_seconds),
            # Each worker process (quarry.runtime.workers) throttles its share: spreading
            # attempts over connections (hence workers) must NEVER multiply the admitted
            # rate of scrypts or guesses.
            LoginThrottle(
                share_of_workers(settings.auth_login_attempts_per_minute_per_key),
                share_of_workers(settings.auth_login_attempts_per_minute_per_address),
            ),
            sealer=sealer,
        )

    from quarry.actions.runs import install as install_actions

    install_actions(deps.graveler, settings)  # branches and tags
    servicer = BranchManagerServicer(
        deps.graveler,
        deps.requests,
        on_staged=reporter.record if reporter is not None else None,
        authorizer=authorizer,
    )

    def register(server) -> None:
        branch_manager_pb2_grpc.add_BranchManagerServicer_to_server(servicer, server)
        if auth_servicer is not None:
            auth_pb2_grpc.add_AuthServicer_to_server(auth_servicer, server)

    names = [branch_manager_pb2.DESCRIPTOR.services_by_name["BranchManager"].full_name]
    if auth_servicer is not None:
        names.append(auth_pb2.DESCRIPTOR.services_by_name["Auth"].full_name)
    return ServiceSpec(
        name=SERVICE_NAME,
        register=register,
        grpc_service_names=names,
        on_stop=closers,
        dependencies=deps.needed(DEPENDS_ON),
        on_ready=deps.on_ready,
        iam_kv=deps.graveler.kv,
        authorizer=authorizer,
    )
