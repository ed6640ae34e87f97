"""committer wiring (see quarry.graveler.wiring for the shared core dependencies)."""

from __future__ import annotations

from quarry.config import Settings
from quarry.runtime.server import ServiceSpec
from quarry.services.committer.servicer import CommitterServicer
from quarry.v1 import committer_pb2, committer_pb2_grpc

SERVICE_NAME = "committer"
# What must answer before the committer serves (every commit writes ranges and KV records).
DEPENDS_ON = ("kv-gateway", "range-writer")


def build(settings: Settings, kv_store=None, committed=None, range_writer=None) -> ServiceSpec:
    from quarry.graveler.wiring import core_dependencies

    deps = core_dependencies(settings, kv_store, committed, range_writer)
    servicer = CommitterServicer(deps.graveler, deps.requests)
    return ServiceSpec(
        name=SERVICE_NAME,
        register=lambda server: committer_pb2_grpc.add_CommitterServicer_to_server(
            servicer, server
        ),
        grpc_service_names=[committer_pb2.DESCRIPTOR.services_by_name["Committer"].full_name],
        on_stop=deps.closers,
        dependencies=deps.needed(DEPENDS_ON),
        on_ready=deps.on_ready,
    )
