"""Builds the core's dependencies for a service process from Settings.

Production wiring: the KV store is the kv-gateway (RemoteStore), committed data is read
straight from object storage with local caches, and ranges are written by range-writer.
Tests pass their own parts (a local store, a local manager) to any of them.

Nothing here calls a dependency: the services it dials are returned as `dependencies` (each
service.py declares which of them it needs in order to serve), and the work that needs the
KV store — the format version check, the staging dropper — as `on_ready`, which the server
runs once they answer (quarry.runtime.server).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from quarry.config import Settings
from quarry.graveler.core import CommittedReader, RangeWriterClient
from quarry.graveler.graveler import Graveler
from quarry.graveler.reach import Reach
from quarry.graveler.requests import RequestLog
from quarry.graveler.retry import Retries, RetryPolicy
from quarry.graveler.staging import Dropper, StagingManager
from quarry.graveler.writes import PutStreamLimits
from quarry.kv import store as kv
from quarry.runtime.channels import TokenSource, open_service_channel
from quarry.runtime.format_version import ensure_format_version
from quarry.runtime.server import Dependency, service_dependency
from quarry.runtime.tls import channel_security

# Deadline of each KV call the background dropper makes: a stalled kv-gateway holds it (and
# a shutdown waiting for it) this long at most.
DROPPER_CALL_TIMEOUT_SECONDS = 5.0


@dataclass
class CoreDependencies:
    graveler: Graveler
    closers: list[Callable[[], None]] = field(default_factory=list)
    requests: RequestLog | None = None  # the log of calls with a request_id (set by wiring)
    # The services this wiring dialed, by name ("kv-gateway", "range-writer"); parts passed
    # in by a caller are the caller's to manage and do not appear.
    dependencies: dict[str, Dependency] = field(default_factory=dict)
    # Start-up work that needs the KV store, for ServiceSpec.on_ready.
    on_ready: list[Callable[[], None]] = field(default_factory=list)

    def needed(self, names: Iterable[str]) -> list[Dependency]:
        """The dependencies among `names` (a service's DEPENDS_ON) that this wiring dialed."""
        return [self.dependencies[name] for name in names if name in self.dependencies]


def core_dependencies(  # noqa: PLR0913 — the parts a caller may supply, each optional
    settings: Settings,
    kv_store: kv.Store | None = None,
    committed: CommittedReader | None = None,
    range_writer: RangeWriterClient | None = None,
    start_dropper: bool = True,
    tokens: TokenSource | None = None,
    dropper_clock: Callable[[], float] = time.time,
) -> CoreDependencies:
    """`tokens`: the service's token source (quarry.auth.service_tokens), attached to every
    call it makes to the kv-gateway and the range-writer; None when auth is off.
    `dropper_clock`: the wall clock the staging dropper measures its grace period by (tests
    move one forward rather than wait out the grace)."""
    closers: list[Callable[[], None]] = []
    dependencies: dict[str, Dependency] = {}
    dropper_store = kv_store
    security = channel_security(settings)
    if kv_store is None:
        from quarry.kv.remote import RemoteStore

        # The token goes on each KV call as metadata (RemoteStore), not through a channel
        # interceptor: cheaper on the hot path of every read and write.
        raw, traced = open_service_channel(settings.kv_gateway_address, security=security)
        kv_store = RemoteStore(traced, token_source=tokens)
        # Same connection, shorter deadlines: background work never blocks for long.
        dropper_store = RemoteStore(
            traced, timeout=DROPPER_CALL_TIMEOUT_SECONDS, token_source=tokens
        )
        dependencies["kv-gateway"] = service_dependency(
            "kv-gateway", settings.kv_gateway_address, raw
        )
        closers.append(raw.close)  # also cancels calls still blocked on a dead gateway
    if committed is None:
        committed = cast(CommittedReader, BuiltOnFirstUse(lambda: _committed_manager(settings)))
    if range_writer is None:
        raw, traced = open_service_channel(settings.range_writer_address, tokens, security)
        range_writer = cast(
            RangeWriterClient, BuiltOnFirstUse(lambda: _remote_range_writer(traced))
        )
        dependencies["range-writer"] = service_dependency(
            "range-writer", settings.range_writer_address, raw
        )
        closers.append(raw.close)
    graveler = Graveler(
        kv_store,
        committed,
        range_writer,
        dirty_read_optimization=settings.experimental_dirty_read_optimization,
        max_response_bytes=settings.max_response_bytes,
        retries=retries(settings),
    )
    graveler.imports.settings = settings  # S3 sources: the endpoint and region
    graveler.addresses.reach = Reach.of(settings)
    graveler.imports.heartbeat_seconds = settings.import_heartbeat_seconds
    graveler.imports.stale_seconds = settings.import_stale_seconds
    graveler.imports.listing_processes = settings.import_listing_processes
    graveler.writes.stream_limits = PutStreamLimits(
        settings.max_put_objects_stream_entries, settings.max_put_objects_stream_bytes
    )
    requests = request_log(graveler, settings)
    closers.insert(0, requests.close)
    store = kv_store

    def check_format() -> None:
        ensure_format_version(store)

    on_ready: list[Callable[[], None]] = [check_format]
    if start_dropper:
        assert dropper_store is not None
        dropper = Dropper(
            StagingManager(dropper_store, clock=dropper_clock),
            interval_seconds=settings.staging_drop_interval_seconds,
            grace_seconds=settings.staging_drop_grace_seconds,
        )

        def start_dropping() -> None:
            dropper.start()

        def stop_dropping() -> None:
            # Not waited for long: a pass still blocked on the gateway is cancelled when the
            # channel closes below, and its thread then ends.
            dropper.stop(timeout=0.2)

        on_ready.append(start_dropping)
        closers.insert(0, stop_dropping)
    return CoreDependencies(graveler, closers, requests, dependencies, on_ready)


class BuiltOnFirstUse:
    """Stands for the part `build` makes, and makes it on the first use of any of its
    attributes (once, whichever thread comes first).

    Why: committed storage and the range-writer's client import pyarrow and numpy, about
    half of a branch-manager's or committer's start-up CPU (0.45 of 1.1 CPU-s), which a
    process that serves only refs, staging and auth calls never needs. The first call that
    reads a range or commits pays the import instead."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._part: Any = None
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        part = self._part
        if part is None:
            with self._lock:
                if self._part is None:
                    self._part = self._build()
                part = self._part
        return getattr(part, name)


def _committed_manager(settings: Settings) -> CommittedReader:
    from quarry.committed import CommittedManager

    return CommittedManager.from_settings(settings)


def _remote_range_writer(channel: Any) -> RangeWriterClient:
    from quarry.committed.remote import RemoteRangeWriter

    return RemoteRangeWriter(channel)


def retries(settings: Settings) -> Retries:
    """The core's retry limits (branch compare-and-swap, merge) from Settings."""

    def policy(attempts: int) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=attempts,
            base_seconds=settings.branch_retry_base_seconds,
            cap_seconds=settings.branch_retry_cap_seconds,
        )

    return Retries(
        branch=policy(settings.branch_retry_attempts), merge=policy(settings.merge_retry_attempts)
    )


def request_log(graveler: Graveler, settings: Settings) -> RequestLog:
    """The RequestLog over the core's KV store and repositories."""
    return RequestLog(
        graveler.kv,
        lambda name: graveler.refs.get_repository(name).partition,
        retention_seconds=settings.request_retention_seconds,
        lease_seconds=settings.request_lease_seconds,
    )
