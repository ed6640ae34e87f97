"""Typed partition names (docs/architecture.md §2) and the gateway wrapper that enforces them.

Every partition belongs to exactly one class:

  | class     | name                          |
  |-----------|-------------------------------|
  | `quarry`  | `quarry` (exact)              |
  | `repo`    | `repo/<repo>/<instance-id>`   |
  | `staging` | `staging/<token>`             |
  | `cleanup` | `cleanup` (exact)             |
  | `auth`    | `auth` (exact)                |

Anything else is refused with UnknownPartitionClass (INVALID_ARGUMENT), so a bug that builds
a partition name by hand cannot scatter data into partitions nobody will ever find or clean.
A staging token names exactly one partition (`staging/<token>`, the token has no "/"), which
is how "staged entries live only in the partition of their staging token" is enforced.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import NoReturn

from quarry.kv import store

QUARRY_PARTITION = b"quarry"
CLEANUP_PARTITION = b"cleanup"
AUTH_PARTITION = b"auth"

QUARRY = "quarry"
REPO = "repo"
STAGING = "staging"
CLEANUP = "cleanup"
AUTH = "auth"
PARTITION_CLASSES = (QUARRY, REPO, STAGING, CLEANUP, AUTH)

_EXACT_PARTITIONS = {
    QUARRY_PARTITION: QUARRY,
    CLEANUP_PARTITION: CLEANUP,
    AUTH_PARTITION: AUTH,
}
_REPO_PREFIX = b"repo/"
_STAGING_PREFIX = b"staging/"
_KNOWN_FORMS = "quarry, repo/<repo>/<instance-id>, staging/<token>, cleanup, auth"

# Partition names can be up to 2 KB; keep error messages readable.
_MAX_NAME_IN_MESSAGE = 120


def partition_class(partition: bytes) -> str:
    """The class of `partition` (one of PARTITION_CLASSES); UnknownPartitionClass otherwise."""
    if isinstance(partition, (bytearray, memoryview)):
        partition = bytes(partition)
    if isinstance(partition, bytes):
        # Every KV request classifies its partition two or three times (validation,
        # metering); the hot partitions are few, so remember recent answers.
        return _cached_partition_class(partition)
    return _partition_class(partition)


@functools.lru_cache(maxsize=4096)
def _cached_partition_class(partition: bytes) -> str:
    return _partition_class(partition)


def _partition_class(partition: object) -> str:
    if not isinstance(partition, bytes):
        raise store.UnknownPartitionClass(
            f"a partition name is bytes, not {type(partition).__name__}; known partition "
            f"classes: {_KNOWN_FORMS}"
        )
    exact = _EXACT_PARTITIONS.get(partition)
    if exact is not None:
        return exact
    if partition.startswith(_REPO_PREFIX):
        parts = partition[len(_REPO_PREFIX) :].split(b"/")
        if len(parts) == 2 and parts[0] and parts[1]:
            return REPO
        _refuse(
            partition, "a repo partition is repo/<repo>/<instance-id> with both parts non-empty"
        )
    if partition.startswith(_STAGING_PREFIX):
        token = partition[len(_STAGING_PREFIX) :]
        if token and b"/" not in token:
            return STAGING
        _refuse(
            partition, "a staging partition is staging/<token> with a non-empty token without '/'"
        )
    _refuse(partition, "unknown partition class")


def repo_partition(repo: str | bytes, instance_id: str | bytes) -> bytes:
    """`repo/<repo>/<instance-id>`; the instance id distinguishes re-created repositories."""
    repo_bytes = _as_bytes(repo)
    instance_bytes = _as_bytes(instance_id)
    if not repo_bytes or b"/" in repo_bytes or not instance_bytes or b"/" in instance_bytes:
        raise store.UnknownPartitionClass(
            f"cannot build a repo partition from repo {repo!r} and instance id "
            f"{instance_id!r}: both must be non-empty and contain no '/'"
        )
    return _REPO_PREFIX + repo_bytes + b"/" + instance_bytes


def staging_partition(token: str | bytes) -> bytes:
    """`staging/<token>`: the one partition holding everything staged under `token`."""
    token_bytes = _as_bytes(token)
    if not token_bytes or b"/" in token_bytes:
        raise store.UnknownPartitionClass(
            f"cannot build a staging partition from token {token!r}: it must be non-empty "
            f"and contain no '/'"
        )
    return _STAGING_PREFIX + token_bytes


def check_partition_name(partition: bytes) -> str:
    """Full gateway check: the generic limits of store.check_partition, then the class."""
    store.check_partition(partition)
    return partition_class(partition)


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _refuse(partition: bytes, why: str) -> NoReturn:
    shown = partition[:_MAX_NAME_IN_MESSAGE]
    suffix = "..." if len(partition) > _MAX_NAME_IN_MESSAGE else ""
    raise store.UnknownPartitionClass(
        f"invalid partition {shown!r}{suffix}: {why}; known partition classes: {_KNOWN_FORMS}",
        metadata={"known_classes": ",".join(PARTITION_CLASSES)},
    )


class PartitionValidatingStore(store.Store):
    """Refuses any call whose partition is not of a known class, before it reaches `inner`.

    Batch calls are checked item by item BEFORE anything is passed on, so one bad item
    refuses the whole batch instead of leaving it half written.
    """

    def __init__(self, inner: store.Store):
        self.inner = inner

    def get(self, partition: bytes, key: bytes) -> store.GetResult:
        check_partition_name(partition)
        return self.inner.get(partition, key)

    def set(self, partition: bytes, key: bytes, value: bytes) -> None:
        check_partition_name(partition)
        self.inner.set(partition, key, value)

    def set_if(
        self, partition: bytes, key: bytes, value: bytes, predicate: store.Predicate
    ) -> None:
        check_partition_name(partition)
        self.inner.set_if(partition, key, value, predicate)

    def delete(self, partition: bytes, key: bytes) -> None:
        check_partition_name(partition)
        self.inner.delete(partition, key)

    def delete_if(self, partition: bytes, key: bytes, predicate: store.Equals) -> None:
        check_partition_name(partition)
        self.inner.delete_if(partition, key, predicate)

    def scan(
        self,
        partition: bytes,
        start: bytes = b"",
        end: bytes | None = None,
        batch_size: int = store.DEFAULT_SCAN_BATCH_SIZE,
    ) -> store.ScanIterator:
        check_partition_name(partition)
        return self.inner.scan(partition, start, end, batch_size)

    def batch_get(self, items: Sequence[tuple[bytes, bytes]]) -> list[store.GetResult | None]:
        _check_batch_partitions(item[0] for item in items)
        return self.inner.batch_get(items)

    def batch_set(self, items: Sequence[tuple[bytes, bytes, bytes]]) -> None:
        _check_batch_partitions(item[0] for item in items)
        self.inner.batch_set(items)

    def batch_delete(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        _check_batch_partitions(item[0] for item in items)
        self.inner.batch_delete(items)

    def close(self) -> None:
        self.inner.close()


def _check_batch_partitions(partitions: Iterable[bytes]) -> None:
    # Batches usually repeat a few partitions many times; check each name once.
    seen: set[bytes] = set()
    for partition in partitions:
        if partition not in seen:
            check_partition_name(partition)
            seen.add(partition)
