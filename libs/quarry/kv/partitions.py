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
A staging token names its partitions: an unsharded token `<t>` exactly one, `staging/<t>` (the
token has no "/"); a token with N > 1 shards, `<t>.s<N>`, exactly N, `staging/<t>.s<N>.<i>` for
i in 0..N-1, and the shard of a key is a stable hash of the key (`staging_shard`: BLAKE2b, never
Python's hash()). This is how "staged entries live only in the partition of their staging token"
is enforced: a sharded token's bare name, a shard index outside 0..N-1 and a write of a key
into a shard that is not the key's are refused (WrongStagingShard), so a staged entry can only
be written where a point read of its path looks for it (one lookup, whatever N is).
"""

from __future__ import annotations

import functools
import hashlib
import re
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
_KNOWN_FORMS = (
    "quarry, repo/<repo>/<instance-id>, staging/<token>, staging/<token>.s<N>.<shard>, "
    "cleanup, auth"
)

# Staging shards (docs/architecture.md §2 "Sharded staging"). A token with N > 1 shards ends
# in `.s<N>`; its shard partitions append `.<i>`. Tokens without the suffix (every token
# written before sharding existed, and every token of a repository with staging_shards = 1)
# keep their one partition `staging/<token>`, byte for byte.
MAX_STAGING_SHARDS = 64
_SHARDED_TOKEN = re.compile(rb"^(?P<base>[^/.]+)\.s(?P<shards>[0-9]+)(?:\.(?P<shard>[0-9]+))?$")

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
            _check_shard_name(partition, token)
            return STAGING
        _refuse(
            partition, "a staging partition is staging/<token> with a non-empty token without '/'"
        )
    _refuse(partition, "unknown partition class")


def _check_shard_name(partition: bytes, token: bytes) -> None:
    """A name that looks sharded must be one shard partition of a valid sharded token."""
    match = _SHARDED_TOKEN.match(token)
    if match is None:
        return  # an unsharded token's one partition
    if any(
        number is not None and number != str(int(number)).encode()
        for number in (match["shards"], match["shard"])
    ):
        _refuse(partition, "shard counts and indexes are written without leading zeros")
    shards = int(match["shards"])
    if shards < 2 or shards > MAX_STAGING_SHARDS:
        _refuse(partition, f"a sharded staging token has 2..{MAX_STAGING_SHARDS} shards")
    if match["shard"] is None:
        _refuse(
            partition,
            "a sharded staging token's items live in its shard partitions "
            "staging/<token>.s<N>.<shard>, never in staging/<token>.s<N>",
        )
    if int(match["shard"]) >= shards:
        _refuse(partition, f"a token with {shards} shards has shards 0..{shards - 1}")


def _shard_of_partition(partition: bytes) -> tuple[int, int] | None:
    """(shard, shards) of a valid shard partition, None for any other partition."""
    if not partition.startswith(_STAGING_PREFIX):
        return None
    return _cached_shard_of_partition(bytes(partition))


@functools.lru_cache(maxsize=4096)
def _cached_shard_of_partition(partition: bytes) -> tuple[int, int] | None:
    match = _SHARDED_TOKEN.match(partition[len(_STAGING_PREFIX) :])
    if match is None or match["shard"] is None:
        return None
    return int(match["shard"]), int(match["shards"])


def staging_shard(key: bytes, shards: int) -> int:
    """The shard (0..shards-1) of a staged key: a stable hash of its bytes, the same in every
    process and release (BLAKE2b, never Python's randomized hash())."""
    if shards <= 1:
        return 0
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def sharded_token(base: str, shards: int) -> str:
    """The staging token `base` with `shards` shards (`base` itself for one shard)."""
    if not 1 <= shards <= MAX_STAGING_SHARDS:
        raise store.InvalidStagingShards(
            f"staging_shards must be 1..{MAX_STAGING_SHARDS}, not {shards}",
            metadata={"staging_shards": str(shards), "max": str(MAX_STAGING_SHARDS)},
        )
    if not base or "/" in base or "." in base:
        raise store.UnknownPartitionClass(
            f"a staging token base must be non-empty and hold no '/' or '.': {base!r}"
        )
    return base if shards == 1 else f"{base}.s{shards}"


def staging_token_shards(token: str | bytes) -> int:
    """How many shards (partitions) the staging token has: 1 unless it ends in `.s<N>`."""
    return _cached_token_shards(_as_bytes(token))


@functools.lru_cache(maxsize=4096)
def _looks_sharded(token: bytes) -> bool:
    return _SHARDED_TOKEN.match(token) is not None


@functools.lru_cache(maxsize=4096)
def _cached_token_shards(token: bytes) -> int:
    # Asked on every staged read and write; a process uses few tokens at a time.
    match = _SHARDED_TOKEN.match(token)
    if match is None or match["shard"] is not None:
        return 1
    return int(match["shards"])


def staging_partitions(token: str | bytes) -> list[bytes]:
    """Every partition of a staging token, shard 0 first (one for an unsharded token)."""
    shards = staging_token_shards(token)
    if shards == 1:
        return [staging_partition(token)]
    base = _STAGING_PREFIX + _as_bytes(token) + b"."
    return [base + str(i).encode() for i in range(shards)]


def staging_partition_of(token: str | bytes, key: bytes) -> bytes:
    """The one partition of `token` that holds (or would hold) the staged `key`."""
    shards = staging_token_shards(token)
    if shards == 1:
        return staging_partition(token)
    return _STAGING_PREFIX + _as_bytes(token) + b"." + str(staging_shard(key, shards)).encode()


def check_staged_write(partition: bytes, key: bytes) -> None:
    """A write into a shard partition must be of a key of that shard (WrongStagingShard):
    it would otherwise sit where no point read of its path ever looks."""
    shard = _shard_of_partition(partition)
    if shard is None:
        return
    index, shards = shard
    wanted = staging_shard(key, shards)
    if wanted != index:
        shown = key[:_MAX_NAME_IN_MESSAGE]
        raise store.WrongStagingShard(
            f"key {shown!r} belongs to shard {wanted} of its staging token, not to "
            f"partition {partition[:_MAX_NAME_IN_MESSAGE]!r} (shard {index} of {shards})",
            metadata={"shard": str(index), "key_shard": str(wanted), "shards": str(shards)},
        )


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
    """`staging/<token>`: the one partition of an UNSHARDED token. A sharded token has
    several (staging_partitions, staging_partition_of): asking for its one partition is
    refused rather than answered with a partition that holds none of its items."""
    token_bytes = _as_bytes(token)
    if not token_bytes or b"/" in token_bytes:
        raise store.UnknownPartitionClass(
            f"cannot build a staging partition from token {token!r}: it must be non-empty "
            f"and contain no '/'"
        )
    if _looks_sharded(token_bytes):
        raise store.UnknownPartitionClass(
            f"staging token {token!r} is sharded: its items live in its shard partitions"
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
    refuses the whole batch instead of leaving it half written. Writes into a staging shard
    partition must be of keys of that shard (check_staged_write); it must never let a staged
    item land in a partition where a point read of its path does not look.
    """

    def __init__(self, inner: store.Store):
        self.inner = inner

    def get(self, partition: bytes, key: bytes) -> store.GetResult:
        check_partition_name(partition)
        return self.inner.get(partition, key)

    def set(self, partition: bytes, key: bytes, value: bytes) -> None:
        check_partition_name(partition)
        check_staged_write(partition, key)
        self.inner.set(partition, key, value)

    def set_if(
        self, partition: bytes, key: bytes, value: bytes, predicate: store.Predicate
    ) -> None:
        check_partition_name(partition)
        check_staged_write(partition, key)
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
        for partition, key, _value in items:
            check_staged_write(partition, key)
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
