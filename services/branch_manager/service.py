"""branch-manager wiring: KV through the kv-gateway, committed reads from object storage,
range-writer for the one metarange it writes (a new repository's empty one), and the
background dropper of retired staging tokens."""

from __future__ import annotations

from quarry.config import Settings
from quarry.runtime.server import ServiceSpec
from quarry.v1 import branch_manager_pb2, branch_manager_pb2_grpc

from branch_manager.servicer import BranchManagerServicer

SERVICE_NAME = "branch-manager"


def build(settings: Settings, kv_store=None, committed=None, range_writer=None) -> ServiceSpec:
    from quarry.graveler.wiring import core_dependencies

    deps = core_dependencies(settings, kv_store, committed, range_writer)
    servicer = BranchManagerServicer(deps.graveler)
    return ServiceSpec(
        name=SERVICE_NAME,
        register=lambda server: branch_manager_pb2_grpc.add_BranchManagerServicer_to_server(
            servicer, server),
        grpc_service_names=[
            branch_manager_pb2.DESCRIPTOR.services_by_name["BranchManager"].full_name],
        on_stop=deps.closers,
    )
