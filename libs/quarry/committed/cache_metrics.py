"""The memory caches' charged bytes as Prometheus gauges (quarry_range_cache_bytes,
quarry_metarange_cache_bytes), summed over the range loaders of the process."""

from __future__ import annotations

import weakref
from typing import Any

from prometheus_client.registry import Collector


class _CacheBytes(Collector):
    """The bytes the memory caches of this process's range loaders charge (their bounds are
    range_cache_bytes and metarange_cache_bytes). Measured: a process's resident memory
    settles at about twice what they charge plus ~150 MB (Python objects and the
    allocators' retained pages beyond the bytes counted); process_resident_memory_bytes
    beside these shows it."""

    def __init__(self) -> None:
        # RangeLoaders (quarry.committed.loader), each with range_cache_bytes and
        # metarange_cache_bytes.
        self.loaders: weakref.WeakSet[Any] = weakref.WeakSet()

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        loaders = list(self.loaders)
        yield GaugeMetricFamily(
            "quarry_range_cache_bytes",
            "Bytes the decoded-range memory cache charges (bound: QUARRY_RANGE_CACHE_BYTES)",
            value=sum(loader.range_cache_bytes for loader in loaders),
        )
        yield GaugeMetricFamily(
            "quarry_metarange_cache_bytes",
            "Bytes the decoded-metarange memory cache charges "
            "(bound: QUARRY_METARANGE_CACHE_BYTES)",
            value=sum(loader.metarange_cache_bytes for loader in loaders),
        )


CACHE_BYTES = _CacheBytes()

__all__ = ["CACHE_BYTES"]
