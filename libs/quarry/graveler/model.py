"""Domain values shared by the versioning core and committed storage.

`Entry` is the in-process form of quarry.v1.Entry. Its *identity* is a SHA-256 over every
field a user writes and reads back — physical address, size, checksum, content type and
sorted metadata — but not mtime (docs/architecture.md §2). Every comparison of entries (commit,
uncommitted diff, diffs, merge, compaction, Spark's commit check) goes by identity, so
re-pointing a path at another address is a change, never silently dropped, and re-staging
exactly the same fields is not one.

Ranges store the identity column: changing what it covers is a storage format change
(quarry.FORMAT_VERSION). Storage format 1 left the address out (quarry.committed.legacy
reads that format, for `quarry store import` only).
"""

from __future__ import annotations

import enum
import hashlib
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


def _frame(parts: Iterable[bytes]) -> bytes:
    """Length-prefixed concatenation: unambiguous, so distinct tuples never collide."""
    out = bytearray()
    for part in parts:
        out += struct.pack(">I", len(part))
        out += part
    return bytes(out)


class Entry:
    """An object's metadata at a path. Immutable; identity is computed once, lazily."""

    __slots__ = (
        "path",
        "physical_address",
        "size_bytes",
        "checksum",
        "mtime_us",
        "content_type",
        "metadata",
        "_identity",
    )

    def __init__(  # noqa: PLR0913 — a value object: its fields, positional as ever
        self,
        path: str,
        physical_address: str = "",
        size_bytes: int = 0,
        checksum: str = "",
        mtime_us: int = 0,
        content_type: str = "",
        metadata: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
        identity: bytes | None = None,
    ):
        self.path = path
        self.physical_address = physical_address
        self.size_bytes = int(size_bytes)
        self.checksum = checksum
        # Microseconds since the epoch (Parquet TIMESTAMP_MICROS, what Spark reads).
        self.mtime_us = int(mtime_us)
        self.content_type = content_type
        items = metadata.items() if isinstance(metadata, Mapping) else (metadata or ())
        # Sorted tuple of pairs: hashable, canonical order.
        self.metadata: tuple[tuple[str, str], ...] = tuple(sorted(items))
        self._identity = identity

    @property
    def identity(self) -> bytes:
        if self._identity is None:
            self._identity = entry_identity(
                self.physical_address,
                self.size_bytes,
                self.checksum,
                self.content_type,
                self.metadata,
            )
        return self._identity

    def with_path(self, path: str) -> Entry:
        return Entry(
            path,
            self.physical_address,
            self.size_bytes,
            self.checksum,
            self.mtime_us,
            self.content_type,
            self.metadata,
            self._identity,
        )

    def same_content(self, other: Entry | None) -> bool:
        """Same identity: every field but path and mtime equal (the address included)."""
        return other is not None and self.identity == other.identity

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Entry):
            return NotImplemented
        return (
            self.path,
            self.physical_address,
            self.size_bytes,
            self.checksum,
            self.mtime_us,
            self.content_type,
            self.metadata,
        ) == (
            other.path,
            other.physical_address,
            other.size_bytes,
            other.checksum,
            other.mtime_us,
            other.content_type,
            other.metadata,
        )

    def __hash__(self) -> int:
        return hash((self.path, self.identity))

    def __repr__(self) -> str:
        return (
            f"Entry({self.path!r}, address={self.physical_address!r}, "
            f"size={self.size_bytes}, checksum={self.checksum!r})"
        )


def entry_identity(
    physical_address: str,
    size_bytes: int,
    checksum: str,
    content_type: str,
    metadata: Iterable[tuple[str, str]],
) -> bytes:
    """SHA-256 over the length-prefixed fields (address, size in decimal, checksum, content
    type, then every metadata key and value in key order). Not mtime."""
    parts = [
        physical_address.encode(),
        str(int(size_bytes)).encode(),
        checksum.encode(),
        content_type.encode(),
    ]
    for key, value in sorted(metadata):
        parts.append(key.encode())
        parts.append(value.encode())
    return hashlib.sha256(_frame(parts)).digest()


class ChangeType(enum.IntEnum):
    # Same numbers as quarry.v1.ChangeType.
    ADDED = 1
    REMOVED = 2
    CHANGED = 3
    CONFLICT = 4


@dataclass(frozen=True, slots=True)
class Change:
    type: ChangeType
    path: str
    # The entry after the change; None for REMOVED.
    entry: Entry | None = None


@dataclass(slots=True)
class DiffSummary:
    added: int = 0
    removed: int = 0
    changed: int = 0

    def count(self, change_type: ChangeType) -> None:
        if change_type == ChangeType.ADDED:
            self.added += 1
        elif change_type == ChangeType.REMOVED:
            self.removed += 1
        elif change_type == ChangeType.CHANGED:
            self.changed += 1

    @property
    def total(self) -> int:
        return self.added + self.removed + self.changed


@dataclass(frozen=True, slots=True)
class RangeInfo:
    """A metarange row: one immutable range file and its bounds (inclusive)."""

    id: str
    min_key: str
    max_key: str
    count: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class ApplyResult:
    metarange_id: str
    summary: DiffSummary = field(default_factory=DiffSummary)
    ranges_written: int = 0
    ranges_reused: int = 0


class MergeStrategy(enum.IntEnum):
    # Same numbers as quarry.v1.MergeStrategy.
    DEFAULT = 0  # any path changed differently on both sides is a conflict
    SOURCE_WINS = 1
    DEST_WINS = 2

    @classmethod
    def parse(cls, value: MergeStrategy | int | str | None) -> MergeStrategy:
        """The one parser of merge strategies (CLI, client, servicers). None, "" and
        "default" are DEFAULT; a number is taken as the wire enum's; a name may be written
        'source-wins', 'source_wins' (any case) or as the wire enum's
        'MERGE_STRATEGY_SOURCE_WINS' ('MERGE_STRATEGY_UNSPECIFIED' is DEFAULT). ValueError
        for anything else."""
        if value is None:
            return cls.DEFAULT
        if isinstance(value, int):  # a member, or a wire number
            try:
                return cls(value)
            except ValueError:
                raise ValueError(f"unknown merge strategy {value}") from None
        name = value
        if name.startswith("MERGE_STRATEGY_"):  # the wire enum's own names
            name = name.removeprefix("MERGE_STRATEGY_")
            if name == "UNSPECIFIED":
                return cls.DEFAULT
        name = name.lower().replace("-", "_")
        if name in ("", "default"):
            return cls.DEFAULT
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"unknown merge strategy {value!r}") from None


@dataclass(frozen=True, slots=True)
class Conflict:
    """A path changed differently on both sides; None = absent (deleted) on that side."""

    path: str
    base: Entry | None
    source: Entry | None
    destination: Entry | None


@dataclass(frozen=True, slots=True)
class MergeResult:
    # "" when conflicts stopped the merge (strategy DEFAULT) or on a dry run.
    metarange_id: str
    # Changes the merge makes to the destination.
    summary: DiffSummary = field(default_factory=DiffSummary)
    # At most the requested number of conflicts, in path order; `more_conflicts` counts the rest.
    conflicts: tuple[Conflict, ...] = ()
    more_conflicts: int = 0
    ranges_written: int = 0
    ranges_reused: int = 0
