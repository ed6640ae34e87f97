"""committer wiring (see quarry.runtime.wiring for the shared core dependencies)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from quarry.config import Settings

if TYPE_CHECKING:
    from quarry.runtime.server import ServiceSpec

SERVICE_NAME = "committer"
# What must answer before the committer serves (every commit writes ranges and KV records).
DEPENDS_ON = ("kv-gateway", "range-writer")


def build(
    settings: Settings, kv_store=None, committed=None, range_writer=None, dropper_clock=time.time
) -> ServiceSpec:
    """`dropper_clock`: the staging dropper's wall clock (core_dependencies; tests)."""
    # Imported here, not at the top: `quarry up` and a worker supervisor import this module
    # for DEPENDS_ON alone, and must not pay for the service's implementation.
    from quarry.auth.service_tokens import token_source
    from quarry.runtime.server import ServiceSpec
    from quarry.runtime.wiring import core_dependencies
    from quarry.services.committer.servicer import CommitterServicer
    from quarry.v1 import committer_pb2, committer_pb2_grpc

    deps = core_dependencies(
        settings,
        kv_store,
        committed,
        range_writer,
        tokens=token_source(settings, SERVICE_NAME),
        dropper_clock=dropper_clock,
    )
    authorizer = None
    if settings.auth_enabled:
        from quarry.auth.authorizer import Authorizer
        from quarry.auth.store import IamStore

        # Shared by the interceptor and the servicer's committer check: one cache.
        authorizer = Authorizer(IamStore(deps.graveler.kv), settings.auth_cache_seconds)
    from quarry.graveler.imports import METRICS
    from quarry.telemetry.metrics import expose

    expose(*METRICS)
    from quarry.actions.runs import install as install_actions

    install_actions(deps.graveler, settings)  # commits and merges
    servicer = CommitterServicer(deps.graveler, deps.requests, authorizer)
    return ServiceSpec(
        name=SERVICE_NAME,
        register=lambda server: committer_pb2_grpc.add_CommitterServicer_to_server(
            servicer, server
        ),
        grpc_service_names=[committer_pb2.DESCRIPTOR.services_by_name["Committer"].full_name],
        # Running imports finish within the stop's grace, or end CANCELLED, before the
        # channels they write through close.
        drain=[deps.graveler.imports.stop],
        on_stop=deps.closers,
        dependencies=deps.needed(DEPENDS_ON),
        on_ready=deps.on_ready,
        iam_kv=deps.graveler.kv,
        authorizer=authorizer,
    )
