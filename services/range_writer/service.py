"""range-writer wiring: a CommittedManager over the object stores of the namespaces it is
asked about (local directories or S3, see quarry.blob.open_blob_store) -> servicer."""

from __future__ import annotations

from quarry.blob import open_blob_store
from quarry.committed import CommittedManager
from quarry.config import Settings
from quarry.runtime.server import ServiceSpec
from quarry.services.range_writer.servicer import RangeWriterServicer
from quarry.v1 import range_writer_pb2, range_writer_pb2_grpc

SERVICE_NAME = "range-writer"
# Writes only to object stores, opened per namespace per call: no service to wait for.
DEPENDS_ON: tuple[str, ...] = ()


def build(settings: Settings, manager: CommittedManager | None = None) -> ServiceSpec:
    """The range-writer's ServiceSpec. `manager` overrides the default (tests)."""
    if manager is None:
        manager = CommittedManager(
            lambda ns: open_blob_store(ns, settings), settings.effective_cache_dir
        )
    servicer = RangeWriterServicer(manager, settings.max_response_bytes)
    return ServiceSpec(
        name=SERVICE_NAME,
        register=lambda server: range_writer_pb2_grpc.add_RangeWriterServicer_to_server(
            servicer, server
        ),
        grpc_service_names=[range_writer_pb2.DESCRIPTOR.services_by_name["RangeWriter"].full_name],
        on_stop=[manager.close],
    )
