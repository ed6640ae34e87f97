"""kv-gateway wiring: backend → metering (+ optional limiter) → amortized reads (unless
kv_amortize_reads is off) → partition validation → servicer.

Order matters: metering sits directly on the backend so it charges what the backend would
(an amortized read shared by many requests is charged once); validation is outermost so
nothing unvalidated reaches any layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quarry.config import Settings

if TYPE_CHECKING:
    from quarry.kv.limiter import PartitionLimiter
    from quarry.kv.metering import MeteredStore
    from quarry.runtime.server import Dependency, ServiceSpec
    from quarry.v1 import kv_pb2

SERVICE_NAME = "kv-gateway"
# No other Quarry service: the gateway waits only for its KV backend (see backend_dependency).
DEPENDS_ON: tuple[str, ...] = ()


def backend_dependency(backend, url: str) -> Dependency:
    """The KV backend (DynamoDB may be unreachable; SQLite is a local file): it answers when
    one read of the format-version item succeeds."""
    import urllib.parse

    from quarry.kv import store as kv
    from quarry.runtime.format_version import KEY as FORMAT_VERSION_KEY
    from quarry.runtime.format_version import PARTITION as FORMAT_VERSION_PARTITION
    from quarry.runtime.server import Dependency, DependencyUnavailable

    parts = urllib.parse.urlsplit(url)
    shown = parts.scheme + "://" + (parts.netloc.rsplit("@", 1)[-1] + parts.path)  # no secrets

    def probe(_timeout: float) -> None:
        try:
            backend.get(FORMAT_VERSION_PARTITION, FORMAT_VERSION_KEY)
        except kv.KeyNotFound:
            pass  # answers; the version is stamped by the start-up work
        except Exception as exc:  # any failure is "not answering"
            raise DependencyUnavailable(
                f"the KV backend {shown} does not answer: {getattr(exc, 'message', exc)}",
                metadata={"dependency": "kv-backend", "address": shown},
            ) from None

    return Dependency("kv-backend", shown, probe)


def capacity_report_to_proto(
    metered: MeteredStore, limiter: PartitionLimiter | None, top_n: int
) -> kv_pb2.GetCapacityReportResponse:
    from quarry.kv.capacity import READ, WRITE
    from quarry.v1 import kv_pb2

    report = metered.report(top_n)

    def usage(u) -> kv_pb2.CapacityUsage:
        return kv_pb2.CapacityUsage(
            read_units=u.read_units,
            write_units=u.write_units,
            reads=u.reads,
            writes=u.writes,
            throttled=u.throttled,
        )

    response = kv_pb2.GetCapacityReportResponse(
        classes=[
            kv_pb2.PartitionClassUsage(partition_class=name, usage=usage(u))
            for name, u in sorted(report.by_class.items())
        ],
        hottest_partitions=[
            kv_pb2.PartitionUsage(
                partition_key=p.partition, partition_class=p.partition_class, usage=usage(p.totals)
            )
            for p in report.hottest
        ],
        limiter_enabled=limiter is not None,
    )
    if limiter is not None:
        response.limiter_read_units_per_second = limiter.rates[READ]
        response.limiter_write_units_per_second = limiter.rates[WRITE]
    return response


def build(settings: Settings, backend=None) -> ServiceSpec:
    """The kv-gateway's ServiceSpec. `backend` overrides settings.kv_url (tests: a backend
    passed in is not probed, so cost-model counts see no probe reads)."""
    # Imported here, not at the top: `quarry up` and a worker supervisor import this module
    # for DEPENDS_ON alone, and must not pay for the service's implementation.
    from quarry.kv import ThrottleRetry, open_store
    from quarry.kv.amortized import AmortizedStore
    from quarry.kv.limiter import PartitionLimiter
    from quarry.kv.metering import MeteredStore
    from quarry.kv.partitions import PartitionValidatingStore
    from quarry.runtime.format_version import ensure_format_version
    from quarry.runtime.server import ServiceSpec
    from quarry.services.kv_gateway.servicer import KVGatewayServicer
    from quarry.v1 import kv_pb2, kv_pb2_grpc

    dependencies = []
    if backend is None:
        backend = open_store(settings.effective_kv_url, ThrottleRetry.from_settings(settings))
        dependencies.append(backend_dependency(backend, settings.effective_kv_url))
    limiter = None
    if settings.kv_limiter_enabled:
        limiter = PartitionLimiter(
            read_units_per_second=settings.kv_limiter_read_units_per_second,
            write_units_per_second=settings.kv_limiter_write_units_per_second,
        )
    metered = MeteredStore(backend, limiter=limiter)
    amortized = AmortizedStore(metered) if settings.kv_amortize_reads else metered
    store = PartitionValidatingStore(amortized)
    servicer = KVGatewayServicer(
        store,
        lambda top_n: capacity_report_to_proto(metered, limiter, top_n),
        max_response_bytes=settings.max_response_bytes,
    )

    return ServiceSpec(
        name=SERVICE_NAME,
        register=lambda server: kv_pb2_grpc.add_KVGatewayServicer_to_server(servicer, server),
        grpc_service_names=[kv_pb2.DESCRIPTOR.services_by_name["KVGateway"].full_name],
        on_stop=[store.close],
        dependencies=dependencies,
        # Behind the readiness gate: stamp or check the storage format version once the
        # backend answers; another version stops the gateway (export/import message).
        on_ready=[lambda: ensure_format_version(backend)],
        # IAM reads of the auth check go to the backend directly: not metered as client
        # traffic, not limited, and cached per user by the authorizer.
        iam_kv=backend,
    )
