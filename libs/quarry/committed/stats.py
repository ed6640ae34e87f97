"""Work counters of committed storage (CommittedManager.stats), shared by loader and writer."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass


@dataclass
class CommittedStats:
    """Work done by a CommittedManager (cumulative; see reset_stats)."""

    ranges_read: int = 0  # range files fetched from the object store
    ranges_read_disk: int = 0  # range files served by the local disk cache
    ranges_read_keys: int = 0  # of both above: decoding path and identity columns only
    range_cache_hits: int = 0  # ranges served from memory
    ranges_written: int = 0  # range files put to the object store
    ranges_existing: int = 0  # range puts skipped: the file was already there
    metaranges_read: int = 0
    metaranges_read_disk: int = 0
    metarange_cache_hits: int = 0
    metaranges_written: int = 0  # metarange files put (a flat one, or an index root)
    metarange_pages_written: int = 0  # index pages put under a root (metaranges.py)
    metaranges_existing: int = 0  # metarange or index page puts skipped: already there
    bytes_written: int = 0  # encoded bytes of the range, metarange and page files put

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class StatsCounter:
    """Thread-safe CommittedStats: count() from any thread, snapshot() a copy."""

    def __init__(self) -> None:
        self._stats = CommittedStats()
        self._lock = threading.Lock()

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self._stats, name, getattr(self._stats, name) + n)

    def snapshot(self) -> CommittedStats:
        with self._lock:
            return CommittedStats(**asdict(self._stats))

    def reset(self) -> None:
        with self._lock:
            self._stats = CommittedStats()
