"""Builds the core's dependencies for a service process from Settings.

Production wiring: the KV store is the kv-gateway (RemoteStore), committed data is read
straight from object storage with local caches, and ranges are written by range-writer.
Tests pass their own parts (a local store, a local manager) to any of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from quarry.config import Settings
from quarry.graveler.graveler import Graveler
from quarry.graveler.requests import RequestLog
from quarry.graveler.staging import Dropper
from quarry.runtime.format_version import ensure_format_version


@dataclass
class CoreDependencies:
    graveler: Graveler
    closers: list[Callable[[], None]] = field(default_factory=list)
    requests: RequestLog | None = None  # the log of calls with a request_id (set by wiring)


def core_dependencies(settings: Settings, kv_store=None, committed=None, range_writer=None,
                      start_dropper: bool = True) -> CoreDependencies:
    closers: list[Callable[[], None]] = []
    if kv_store is None:
        from quarry.kv.remote import RemoteStore

        kv_store = RemoteStore(settings.kv_gateway_address)
        closers.append(kv_store.close)
    ensure_format_version(kv_store)
    if committed is None:
        from quarry.committed import CommittedManager

        committed = CommittedManager.from_settings(settings)
    if range_writer is None:
        from quarry.committed.remote import RemoteRangeWriter

        range_writer = RemoteRangeWriter(settings.range_writer_address)
        closers.append(range_writer.close)
    graveler = Graveler(kv_store, committed, range_writer,
                        dirty_read_optimization=settings.experimental_dirty_read_optimization,
                        max_response_bytes=settings.max_response_bytes)
    requests = request_log(graveler, settings)
    closers.insert(0, requests.close)
    if start_dropper:
        dropper = Dropper(graveler.staging,
                          interval_seconds=settings.staging_drop_interval_seconds,
                          grace_seconds=settings.staging_drop_grace_seconds).start()
        closers.insert(0, dropper.stop)
    return CoreDependencies(graveler, closers, requests)


def request_log(graveler: Graveler, settings: Settings) -> RequestLog:
    """The RequestLog over the core's KV store and repositories."""
    return RequestLog(graveler.kv, lambda name: graveler.refs.get_repository(name).partition,
                      retention_seconds=settings.request_retention_seconds,
                      lease_seconds=settings.request_lease_seconds)
