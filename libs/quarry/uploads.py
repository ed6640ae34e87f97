"""Writing an object's bytes into a repository's storage namespace and staging the entry that
points at them: the one mechanism behind the s3-gateway's writes (PutObject, UploadPart,
CopyObject from another repository, CompleteMultipartUpload) and the console's upload.

Bytes go to a fresh key (quarry.blob.layout.new_upload_key: `data/<uuid hex>`, the shape
`quarry put` writes and GC treats alike), streamed in pieces through BlobStore.put_stream
(never held whole), their MD5 computed on the way (size and SHA-256 come from put_stream).
The entry is staged with the caller's own client, so the servers decide with the caller's
token (policies, branch protection) as for any PutObject.

Safety rules: never stage an entry whose bytes failed a check (`check` runs once every byte
is written, before any entry exists); a failed write or check (a bad digest, a size over a
limit, a dropped connection) and a refused staging (denied, protected, not a branch: the
server answered that it staged nothing) remove the bytes this write wrote — its own fresh
key, never any other object. A staging whose outcome is unknown (UNAVAILABLE, a deadline,
ABORTED, INTERNAL, ...: the entry may have been staged before the answer was lost) NEVER
removes them: a staged entry must never point at bytes that are gone. If it was not staged,
they are an unreferenced data file, which GC collects after its grace period.

Concurrent writes to one branch by one caller may share a staging call (`SharedStaging`, the
s3-gateway's): one PutObjects message for all of them instead of a PutObject each.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from quarry import errors
from quarry.blob import BlobStore, object_address, open_blob_store
from quarry.blob.layout import new_upload_key
from quarry.v1 import types_pb2

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Stored:
    """Bytes written under `key`: their size, MD5 and SHA-256 (hex) as written."""

    key: str
    size: int
    md5: str
    sha256: str


class _Digesting:
    """Reads `read` and keeps the MD5 of everything returned (SHA-256 comes from put_stream)."""

    def __init__(self, read: Callable[[int], bytes]) -> None:
        self._read = read
        self.md5 = hashlib.md5()

    def read(self, size: int = -1) -> bytes:
        data = self._read(size if size > 0 else READ_CHUNK)
        self.md5.update(data)
        return data


def discard(store: BlobStore, key: str) -> None:
    """Remove bytes a write put under its own fresh key (never anything else)."""
    try:
        store.delete(key)
    except Exception:
        log.warning("could not remove the unreferenced upload %s", key, exc_info=True)


def store_stream(
    store: BlobStore,
    read: Callable[[int], bytes],
    check: Callable[[Stored], None] | None = None,
) -> Stored:
    """Write what `read` returns (until b"") under a fresh key; what was written once `check`
    (if any) accepted it. On any failure, the check's included, the bytes are removed and
    the error raised."""
    key = new_upload_key()
    digesting = _Digesting(read)
    try:
        written = store.put_stream(key, digesting)
        stored = Stored(key, written.size, digesting.md5.hexdigest(), written.sha256)
        if check is not None:
            check(stored)
    except BaseException:
        discard(store, key)
        raise
    return stored


# The answers that say the server staged nothing: the caller's mistakes and refusals.
# Any other failure (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, ABORTED, RESOURCE_EXHAUSTED,
# INTERNAL, UNKNOWN, DATA_LOSS, or no answer at all) may come after the entry was staged.
_NOTHING_STAGED = frozenset(
    {
        errors.Code.INVALID_ARGUMENT,
        errors.Code.NOT_FOUND,
        errors.Code.ALREADY_EXISTS,
        errors.Code.PERMISSION_DENIED,
        errors.Code.FAILED_PRECONDITION,
        errors.Code.OUT_OF_RANGE,
        errors.Code.UNIMPLEMENTED,
        errors.Code.UNAUTHENTICATED,
    }
)


def nothing_staged(exc: BaseException) -> bool:
    """Whether a failed staging call certainly staged nothing (the server refused it)."""
    return isinstance(exc, errors.QuarryError) and exc.code in _NOTHING_STAGED


@dataclass(frozen=True)
class Condition:
    """What a conditional write requires of its path's current entry on the branch (S3's
    `If-None-Match: *` and `If-Match`); the default requires nothing."""

    if_absent: bool = False
    if_match_checksum: str = ""

    def __bool__(self) -> bool:
        return self.if_absent or bool(self.if_match_checksum)


NO_CONDITION = Condition()


def stage(  # noqa: PLR0913 — one entry's staging: where, what, its bytes, and how
    client: Any,
    repository: str,
    branch: str,
    entry: types_pb2.Entry,
    store: BlobStore,
    key: str,
    shared: SharedStaging | None = None,
    condition: Condition = NO_CONDITION,
) -> None:
    """PutObject `entry` (whose bytes are `key` of `store`) on `branch` with the caller's
    client (through `shared` when given: possibly one call with concurrent writes of the
    same caller and branch; a conditional write is always a call of its own). When the
    server refuses it (denied, protected, not a branch, the condition not met), the bytes
    are removed; when the outcome is unknown, they are kept (see the module's safety
    rules)."""
    try:
        if condition:
            client.put_object(
                repository,
                branch,
                entry,
                if_absent=condition.if_absent,
                if_match_checksum=condition.if_match_checksum,
            )
        elif shared is None:
            client.put_object(repository, branch, entry)
        else:
            shared.stage(client, repository, branch, entry)
    except BaseException as exc:
        if nothing_staged(exc):
            discard(store, key)
        else:
            log.warning(
                "staging %s on %s/%s failed with an unknown outcome (%s): its bytes %s are "
                "kept (GC collects them if nothing refers to them)",
                entry.path,
                repository,
                branch,
                exc,
                key,
            )
        raise


class _Pending:
    """One entry waiting to be staged by a shared call. `gate` (a lock held while closed)
    opens once: with the outcome (`error`, None when staged), with `alone` (the batch
    failed: stage it with a call of its own), or with `batch` (send this batch: the
    entry's thread now leads the next call)."""

    __slots__ = ("entry", "gate", "error", "alone", "batch")

    def __init__(self, entry: types_pb2.Entry) -> None:
        self.entry = entry
        self.gate = threading.Lock()
        self.gate.acquire()
        self.error: BaseException | None = None
        self.alone = False
        self.batch: list[_Pending] | None = None


class SharedStaging:
    """Staging of concurrent writes to one branch by one caller (one client: one token): at
    most `max_calls` calls in flight per (client, repository, branch), the re-sent writes of
    a failed batch aside. A write that arrives
    while that many are in flight waits, and the writes that waited go together in the next
    call to end's place — one PutObjects message of up to `max_entries` — sent by the first
    of them. An uncontended write is one PutObject, as without sharing. The branch-manager
    then reads the branch and validates the write once for the batch instead of once per
    object (quarry.graveler's writer flow).

    Safety rules:
    - A write returns only once ITS entry was staged by a call that succeeded, or with the
      error of a call that tried to stage it: never on another write's success.
    - A batch that fails (one entry denied, an invalid path, the branch protected, the
      service away) never fails the others for it: every write of the batch is staged again
      with a call of its own, on its own thread, and gets that call's answer — the same
      answer it would have got without sharing. Staging is idempotent, so an entry the
      failed batch did stage is staged again harmlessly.
    - Within a batch the later write of a path wins, as the later of two concurrent
      PutObjects of one path may.
    - One caller's writes never share a call with another's (the client carries the
      caller's token: a batch is authorized as its caller, entry by entry)."""

    def __init__(
        self,
        max_entries: int = 100,
        max_calls: int = 2,
        observe: Callable[[int], None] | None = None,
    ) -> None:
        """`observe(n)`: called before each staging call with the number of entries it
        carries (metrics; an entry of a failed batch is carried again by its own call)."""
        if max_entries < 1 or max_calls < 1:
            raise ValueError("max_entries and max_calls must be at least 1")
        self._max_entries = max_entries
        self._max_calls = max_calls
        self._observe = observe
        self._lock = threading.Lock()
        # (client, repository, branch) -> [calls in flight, the writes waiting]; a key is
        # present while a call for it is in flight.
        self._keys: dict[tuple[Any, str, str], tuple[list[int], list[_Pending]]] = {}

    def waiting_writes(self) -> int:
        """The writes waiting for a call, over every branch."""
        with self._lock:
            return sum(len(waiting) for _, waiting in self._keys.values())

    def stage(self, client: Any, repository: str, branch: str, entry: types_pb2.Entry) -> None:
        """Stage `entry` on `branch` as `client`'s caller; the call's error if it failed."""
        key = (client, repository, branch)
        me = _Pending(entry)
        with self._lock:
            state = self._keys.get(key)
            if state is None:
                state = self._keys[key] = ([0], [])
            in_flight, waiting = state
            if in_flight[0] < self._max_calls:
                in_flight[0] += 1  # ours
                batch: list[_Pending] | None = [me]
            else:
                waiting.append(me)
                batch = None
        if batch is None:
            me.gate.acquire()  # opened by the call that carried us, or to lead the next one
            if me.batch is None:
                if me.alone:
                    self._alone(client, repository, branch, entry)
                    return
                if me.error is not None:
                    raise me.error
                return
            batch = me.batch
        try:
            self._send(client, repository, branch, batch)
        finally:
            self._hand_on(key)
        if me.alone:
            self._alone(client, repository, branch, entry)
        elif me.error is not None:
            raise me.error

    def _alone(self, client: Any, repository: str, branch: str, entry: types_pb2.Entry) -> None:
        """A write of a batch that failed, staged again with a call of its own."""
        if self._observe is not None:
            self._observe(1)
        client.put_object(repository, branch, entry)

    def _send(self, client: Any, repository: str, branch: str, batch: list[_Pending]) -> None:
        """One call for `batch` (led by batch[0], the calling thread); the others' gates are
        opened with its outcome."""
        if self._observe is not None:
            self._observe(len(batch))
        followers = batch[1:]
        try:
            if not followers:
                client.put_object(repository, branch, batch[0].entry)
            else:
                client.put_objects(
                    repository, branch, [p.entry for p in batch], batch_size=len(batch)
                )
        except BaseException as exc:
            if not followers:
                batch[0].error = exc
            else:
                for pending in batch:
                    pending.alone = True  # each its own call, its own answer
        finally:
            for pending in followers:
                pending.gate.release()

    def _hand_on(self, key: tuple[Any, str, str]) -> None:
        """A call for `key` ended: the writes that waited meanwhile (up to the batch size)
        take its place, led by the first of them; with none waiting, one call fewer is in
        flight (none: the key is forgotten)."""
        with self._lock:
            in_flight, waiting = self._keys[key]
            if not waiting:
                in_flight[0] -= 1
                if not in_flight[0]:
                    del self._keys[key]
                return
            batch = waiting[: self._max_entries]
            del waiting[: self._max_entries]
        batch[0].batch = batch
        batch[0].gate.release()


def now() -> Any:
    """A Timestamp of this moment (an entry's mtime)."""
    from google.protobuf.timestamp_pb2 import Timestamp

    stamp = Timestamp()
    stamp.FromNanoseconds(time.time_ns())
    return stamp


def put(  # noqa: PLR0913 — one object's write: where, what, and how it is described
    client: Any,
    repository: types_pb2.Repository,
    branch: str,
    path: str,
    read: Callable[[int], bytes],
    settings: Any,
    *,
    content_type: str = "",
    metadata: Mapping[str, str] | None = None,
    check: Callable[[Stored], None] | None = None,
    shared: SharedStaging | None = None,
    condition: Condition = NO_CONDITION,
) -> types_pb2.Entry:
    """Write an object's bytes into `repository`'s storage namespace and stage its entry on
    `branch` (checksum: the MD5 hex, S3's ETag; through `shared` when given; only if the
    path's entry meets `condition`); the entry staged."""
    store = open_blob_store(repository.storage_namespace, settings)
    try:
        stored = store_stream(store, read, check)
        entry = types_pb2.Entry(
            path=path,
            physical_address=object_address(repository.storage_namespace, stored.key),
            size_bytes=stored.size,
            checksum=stored.md5,
            content_type=content_type or "application/octet-stream",
            metadata=dict(metadata or {}),
        )
        entry.mtime.CopyFrom(now())
        stage(client, repository.name, branch, entry, store, stored.key, shared, condition)
    finally:
        store.close()
    return entry
