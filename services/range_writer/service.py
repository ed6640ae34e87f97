"""range-writer wiring: a CommittedManager over the object stores of the namespaces it is
asked about (local directories or S3, see quarry.blob.open_blob_store) -> servicer."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from quarry.config import Settings

if TYPE_CHECKING:
    from quarry.committed import CommittedManager
    from quarry.committed.spans import FanOut
    from quarry.runtime.server import ServiceSpec

SERVICE_NAME = "range-writer"
# Writes only to object stores, opened per namespace per call: no service to wait for.
DEPENDS_ON: tuple[str, ...] = ()


def build(settings: Settings, manager: CommittedManager | None = None) -> ServiceSpec:
    """The range-writer's ServiceSpec. `manager` overrides the default (tests)."""
    # Imported here, not at the top: `quarry up` and a worker supervisor import this module
    # for DEPENDS_ON alone, and must not pay for the service's implementation.
    from quarry.committed import CommittedManager
    from quarry.runtime.server import ServiceSpec
    from quarry.services.range_writer.servicer import RangeWriterServicer
    from quarry.v1 import range_writer_pb2, range_writer_pb2_grpc

    if manager is None:
        manager = CommittedManager.from_settings(settings)
    fan_out, closers = _fan_out(settings, manager)
    servicer = RangeWriterServicer(manager, settings.max_response_bytes, fan_out)
    return ServiceSpec(
        name=SERVICE_NAME,
        register=lambda server: range_writer_pb2_grpc.add_RangeWriterServicer_to_server(
            servicer, server
        ),
        grpc_service_names=[range_writer_pb2.DESCRIPTOR.services_by_name["RangeWriter"].full_name],
        on_stop=[*closers, manager.close],
    )


def _fan_out(
    settings: Settings, manager: CommittedManager
) -> tuple[FanOut | None, list[Callable[[], None]]]:
    """Peers for spans of large applies: local worker processes (QUARRY_RANGE_WRITER_
    PROCESSES), then other range-writers (QUARRY_RANGE_WRITER_PEERS), one channel each (a
    dns:/// name is one channel whose calls gRPC's round_robin spreads over the pods)."""
    from quarry.committed import CommittedManager
    from quarry.committed.processes import ProcessSpanWorkers
    from quarry.committed.spans import FanOut, SpanApplier

    targets = [t.strip() for t in settings.range_writer_peers.split(",") if t.strip()]
    if not targets and not settings.range_writer_processes:
        return None, []
    peers: list[SpanApplier] = []
    closers: list[Callable[[], None]] = []
    if settings.range_writer_processes:
        workers = ProcessSpanWorkers(
            settings.range_writer_processes,
            functools.partial(CommittedManager.from_settings, settings),
            add_stats=manager.add_stats,
            span_timeout=settings.range_writer_span_timeout_seconds,
        )
        peers += workers.peers()
        closers.append(workers.close)
    from quarry.auth.service_tokens import token_source
    from quarry.committed.remote import RemoteRangeWriter
    from quarry.runtime.channels import open_service_channel
    from quarry.runtime.tls import channel_security

    tokens = token_source(settings, SERVICE_NAME)
    security = channel_security(settings)
    for target in targets:
        raw, traced = open_service_channel(target, tokens, security)
        # A peer that does not answer (partitioned away, stopped) holds a span no longer
        # than a worker process would: then the coordinator applies it.
        peers.append(
            RemoteRangeWriter(traced, timeout=settings.range_writer_span_timeout_seconds).apply_span
        )
        closers.append(raw.close)
    fan_out = FanOut(
        manager,
        peers,
        spans=settings.range_writer_spans,
        min_changes=settings.range_writer_fan_out_min_changes,
    )
    return fan_out, [fan_out.close, *closers]
