"""compactor-sensor wiring: KV through the kv-gateway (branch records, and staging
partitions when rebuilding after a restart), the committer's Compact over gRPC, and the
background evaluation loop (started once the kv-gateway and the committer answer, when
compactor_enabled; stopped on shutdown)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quarry.config import Settings

if TYPE_CHECKING:
    import grpc

    from quarry.compaction.sensor import CompactionResult, CompactionSensor
    from quarry.runtime.server import ServiceSpec

SERVICE_NAME = "compactor-sensor"
# What must answer before the sensor serves: it reads branch records and staging partitions
# through the kv-gateway and asks the committer to compact.
DEPENDS_ON = ("kv-gateway", "committer")
# A compaction applies every sealed token of a branch: allow it time.
COMPACT_TIMEOUT_SECONDS = 600.0


class CommitterCompactor:
    """The committer's Compact RPC as the sensor's Compactor."""

    def __init__(self, target: str | grpc.Channel, timeout: float = COMPACT_TIMEOUT_SECONDS):
        from quarry.runtime.channels import channel_for
        from quarry.v1 import committer_pb2_grpc

        self._channel, self._owns_channel = channel_for(target)
        self._stub = committer_pb2_grpc.CommitterStub(self._channel)
        self._timeout = timeout

    def compact(self, repository: str, branch: str) -> CompactionResult:
        from quarry.compaction.sensor import CompactionResult
        from quarry.runtime.errors import domain_errors
        from quarry.v1 import committer_pb2

        with domain_errors():
            response = self._stub.Compact(
                committer_pb2.CompactRequest(repository=repository, branch=branch),
                timeout=self._timeout,
            )
        return CompactionResult(response.compacted_metarange_id, response.tokens_compacted)

    def close(self) -> None:
        if self._owns_channel:
            self._channel.close()


@dataclass
class Assembled:
    spec: ServiceSpec
    sensor: CompactionSensor


def assemble(settings: Settings, kv_store=None, compactor=None) -> Assembled:
    """The ServiceSpec and its sensor (tests reach the sensor). `kv_store` and `compactor`
    override the kv-gateway and committer clients."""
    # Imported here, not at the top: `quarry up` and a worker supervisor import this module
    # for DEPENDS_ON alone, and must not pay for the service's implementation.
    from quarry.auth.service_tokens import token_source
    from quarry.compaction.sensor import CompactionSensor
    from quarry.runtime.channels import open_service_channel
    from quarry.runtime.format_version import ensure_format_version
    from quarry.runtime.server import ServiceSpec, service_dependency
    from quarry.runtime.tls import channel_security
    from quarry.services.compactor_sensor.servicer import CompactorSensorServicer
    from quarry.v1 import compactor_sensor_pb2, compactor_sensor_pb2_grpc

    tokens = token_source(settings, SERVICE_NAME)
    security = channel_security(settings)
    closers = []
    dependencies = {}
    if kv_store is None:
        from quarry.kv.remote import RemoteStore

        raw, traced = open_service_channel(settings.kv_gateway_address, security=security)
        kv_store = RemoteStore(traced, token_source=tokens)
        dependencies["kv-gateway"] = service_dependency(
            "kv-gateway", settings.kv_gateway_address, raw
        )
        closers.append(raw.close)
    if compactor is None:
        raw, traced = open_service_channel(settings.committer_address, tokens, security)
        compactor = CommitterCompactor(traced)
        dependencies["committer"] = service_dependency("committer", settings.committer_address, raw)
        closers.append(raw.close)  # also cancels a Compact still running at shutdown
    sensor = CompactionSensor.from_settings(settings, kv_store, compactor)
    # Behind the readiness gate: the format check and the loop (whose first passes rebuild
    # the statistics from the KV store) run once the kv-gateway and the committer answer.
    on_ready: list[Callable[[], object]] = [lambda: ensure_format_version(kv_store)]
    if settings.compactor_enabled:
        on_ready.append(sensor.start)
    closers.insert(0, sensor.stop)
    servicer = CompactorSensorServicer(sensor)
    spec = ServiceSpec(
        name=SERVICE_NAME,
        register=lambda server: compactor_sensor_pb2_grpc.add_CompactorSensorServicer_to_server(
            servicer, server
        ),
        grpc_service_names=[
            compactor_sensor_pb2.DESCRIPTOR.services_by_name["CompactorSensor"].full_name
        ],
        on_stop=closers,
        dependencies=[dependencies[name] for name in DEPENDS_ON if name in dependencies],
        on_ready=on_ready,
        iam_kv=kv_store,
    )
    return Assembled(spec, sensor)


def build(settings: Settings, kv_store=None, compactor=None) -> ServiceSpec:
    return assemble(settings, kv_store, compactor).spec
