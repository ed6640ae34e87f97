"""branch-manager wiring: KV through the kv-gateway, committed reads from object storage,
range-writer for the one metarange it writes (a new repository's empty one), the
background dropper of retired staging tokens, and (when compactor_enabled) the reporter
that sends staged-write counts to the compactor-sensor."""

from __future__ import annotations

from quarry.config import Settings
from quarry.runtime.server import ServiceSpec
from quarry.services.branch_manager.servicer import BranchManagerServicer
from quarry.v1 import branch_manager_pb2, branch_manager_pb2_grpc

SERVICE_NAME = "branch-manager"
# What must answer before branch-manager serves. Not the compactor-sensor: its reports are
# fire-and-forget. Not the range-writer either: only CreateRepository calls it, and that
# call fails on its own (UNAVAILABLE) while the range-writer is away.
DEPENDS_ON = ("kv-gateway",)


def build(
    settings: Settings, kv_store=None, committed=None, range_writer=None, reporter=None
) -> ServiceSpec:
    """`reporter`: a started StagingReporter to use instead of one dialing
    settings.compactor_sensor_address (tests); the spec stops it either way."""
    from quarry.graveler.wiring import core_dependencies

    deps = core_dependencies(settings, kv_store, committed, range_writer)
    closers = list(deps.closers)
    if reporter is None and settings.compactor_enabled:
        from quarry.compaction.reporter import StagingReporter

        reporter = StagingReporter(
            settings.compactor_sensor_address,
            interval_seconds=settings.staging_report_interval_seconds,
        ).start()
    if reporter is not None:
        # After the server has drained: the last acknowledged writes are reported too.
        closers.insert(0, reporter.stop)
    servicer = BranchManagerServicer(
        deps.graveler, deps.requests, on_staged=reporter.record if reporter is not None else None
    )
    return ServiceSpec(
        name=SERVICE_NAME,
        register=lambda server: branch_manager_pb2_grpc.add_BranchManagerServicer_to_server(
            servicer, server
        ),
        grpc_service_names=[
            branch_manager_pb2.DESCRIPTOR.services_by_name["BranchManager"].full_name
        ],
        on_stop=closers,
        dependencies=deps.needed(DEPENDS_ON),
        on_ready=deps.on_ready,
    )
