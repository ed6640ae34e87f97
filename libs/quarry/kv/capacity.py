"""Capacity units: what DynamoDB charges for a request, shared by metering and the limiter
(docs/architecture.md §3).

  * a strongly consistent read: 1 read unit per 4 KB of item size, rounded up, minimum 1;
  * a write or delete: 1 write unit per 1 KB of the item, rounded up, minimum 1.

Item sizes come from `store.item_size`.
"""

from __future__ import annotations

from quarry.kv import partitions, store

READ_UNIT_BYTES = 4 * 1024
WRITE_UNIT_BYTES = 1024

# The two capacity kinds, each with its own budget per partition.
READ = "read"
WRITE = "write"

# The class reported for a partition name outside the known classes.
UNKNOWN_CLASS = "unknown"


def read_units(size_bytes: int) -> int:
    """Read capacity units of one strongly consistent read of `size_bytes`."""
    return max(1, -(-size_bytes // READ_UNIT_BYTES))


def write_units(size_bytes: int) -> int:
    """Write capacity units of writing (or deleting) an item of `size_bytes`."""
    return max(1, -(-size_bytes // WRITE_UNIT_BYTES))


def partition_class_or_unknown(partition: bytes) -> str:
    """The partition's class (quarry.kv.partitions), or UNKNOWN_CLASS."""
    try:
        return partitions.partition_class(partition)
    except store.UnknownPartitionClass:
        return UNKNOWN_CLASS
