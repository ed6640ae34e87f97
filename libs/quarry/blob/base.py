"""The object-store interface the committed layer writes ranges and metaranges through.

Keys are '/'-separated relative paths (``_quarry/ranges/<id>.parquet``) inside one storage
namespace; a store instance is bound to one namespace (a local directory or an S3 prefix).
"""

from __future__ import annotations

import abc
import builtins
import hashlib
import io
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol, Self

from quarry import errors


class ObjectNotFound(errors.NotFound):
    """A key missing from object storage (not an entry missing from a ref)."""

    reason = "STORAGE_OBJECT_NOT_FOUND"


class InvalidStorageNamespace(errors.InvalidArgument):
    """A storage namespace that is not a valid, normalized location (docs/architecture.md §2)."""

    reason = "INVALID_NAMESPACE"


class StorageUnreachable(errors.FailedPrecondition):
    """The environment stops Quarry from using a namespace: no credentials, access denied,
    no such bucket, endpoint unreachable, permission denied, not a directory. The message
    and the `cause` metadata say which; fixing the environment (not retrying) resolves it."""

    reason = "STORAGE_UNREACHABLE"

    def __init__(
        self, message: str = "", *, cause: str = "", location: str = "", **kwargs: Any
    ) -> None:
        metadata = dict(kwargs.pop("metadata", None) or {})
        if cause:
            metadata["cause"] = cause
        if location:
            metadata["location"] = location
        super().__init__(message, metadata=metadata, **kwargs)


class ObjectChanged(errors.DataLoss):
    """The object an entry points to does not have the entry's size: it was replaced,
    truncated or corrupted after the entry was recorded."""

    reason = "OBJECT_CHANGED"


class ChecksumMismatch(errors.DataLoss):
    """The object an entry points to does not have the entry's SHA-256."""

    reason = "CHECKSUM_MISMATCH"


class ObjectExists(errors.AlreadyExists):
    """put_stream of a key that already has an object (it writes new keys only)."""

    reason = "STORAGE_OBJECT_EXISTS"

    @classmethod
    def for_stream(cls, key: str) -> ObjectExists:
        return cls(f"object {key!r} already exists: put_stream never replaces one")


class InvalidObjectKey(errors.InvalidArgument):
    reason = "INVALID_OBJECT_KEY"


def check_key(key: str) -> str:
    """Reject keys that could escape the namespace or are not plain relative paths."""
    if not key or key.startswith("/") or "\\" in key or "\x00" in key:
        raise InvalidObjectKey(f"invalid object key {key!r}")
    for part in key.split("/"):
        if part in ("", ".", ".."):
            raise InvalidObjectKey(f"invalid object key {key!r}")
    return key


class InvalidByteRange(errors.InvalidArgument):
    """A negative offset or length asked of open_read."""

    reason = "INVALID_BYTE_RANGE"


def check_range(offset: int, length: int | None) -> None:
    """The one check of an open_read range, made by every store before any access."""
    if offset < 0 or (length is not None and length < 0):
        raise InvalidByteRange(
            f"a byte range starts at an offset >= 0 and has a length >= 0 (got {offset}, {length})",
            metadata={"offset": str(offset), "length": str(length)},
        )


class ObjectInfo(NamedTuple):
    key: str
    size: int
    modified: float  # last modification, seconds since the epoch


class _RawReader(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...

    def close(self) -> None: ...


class ObjectReader:
    """An object's bytes, read front to back in pieces (BlobStore.open_read): read(n) returns
    up to n bytes, b"" at the end (read() the rest). A failure while reading is the store's
    error (StorageUnreachable, Unavailable), mapped by `translate` like a failure to open it,
    never a bare OSError or botocore error. Close it, or use it as a context manager.

    `limit`: at most this many bytes are ever read from `raw` (a range's length: `raw` is
    positioned at its start, and may go on past its end)."""

    def __init__(
        self,
        raw: _RawReader,
        translate: Callable[[Any], Exception],
        failures: tuple[type[BaseException], ...] = (OSError,),
        limit: int | None = None,
    ) -> None:
        self._raw = raw
        self._translate = translate
        self._failures = failures
        self._left = limit

    def read(self, size: int = -1) -> bytes:
        left = self._left
        if left is not None:
            if left <= 0:
                return b""
            size = left if size < 0 else min(size, left)
        try:
            # Some streams (boto3's StreamingBody) read everything only when given no size.
            data = self._raw.read(size) if size >= 0 else self._raw.read()
        except self._failures as exc:
            raise self._translate(exc) from exc
        if left is not None:
            self._left = left - len(data)
        return data

    def close(self) -> None:
        self._raw.close()

    def fileno(self) -> int | None:
        """The open file's descriptor when the bytes come from a local file, else None."""
        fileno = getattr(self._raw, "fileno", None)
        try:
            return fileno() if fileno is not None else None
        except (OSError, ValueError):  # a stream without a descriptor
            return None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# The piece put_stream reads from its source and writes at a time.
STREAM_CHUNK_BYTES = 1 << 20

# What a put takes: bytes, or a view of bytes another object holds (a file encoded by
# pyarrow, handed over without copying it into a new bytes object: at 10M entries a
# metarange's 1.3 MB copy cost more than its encoding).
BlobBytes = bytes | memoryview


class Readable(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...


class Written(NamedTuple):
    """What put_stream wrote: its size and SHA-256, counted from the bytes as they went by."""

    size: int
    sha256: str


class HashingReader:
    """Reads `raw` as asked and keeps the count and SHA-256 of every byte it returned: what
    put_stream reports is what was written, never a separate read of the source. It has no
    seek or tell, so a consumer (boto3's transfer manager) reads it front to back once."""

    def __init__(self, raw: Readable) -> None:
        self._raw = raw
        self._digest = hashlib.sha256()
        self._size = 0
        # The source's own failure, if reading it failed: a store must report it as the
        # source's (an unreadable local file), not as its namespace's.
        self.failure: BaseException | None = None

    def read(self, size: int = -1, /) -> bytes:
        try:
            data = self._raw.read(size)
        except BaseException as exc:
            self.failure = exc
            raise
        self._digest.update(data)
        self._size += len(data)
        return data

    def chunks(self) -> Iterator[bytes]:
        """The rest, STREAM_CHUNK_BYTES at a time."""
        while chunk := self.read(STREAM_CHUNK_BYTES):
            yield chunk

    @property
    def written(self) -> Written:
        return Written(self._size, self._digest.hexdigest())


class BlobStore(abc.ABC):
    """An object store bound to one storage namespace."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """The object's bytes; ObjectNotFound (NOT_FOUND / STORAGE_OBJECT_NOT_FOUND) if missing."""

    def open_read(self, key: str, offset: int = 0, length: int | None = None) -> ObjectReader:
        """The object's bytes as a stream, for objects too large to hold in memory (`quarry
        cat`/`get`); ObjectNotFound if missing.

        `offset`/`length`: only the bytes [offset, offset + length) (to the end without a
        length), for a ranged read (the s3-gateway's GetObject with Range, UploadPartCopy):
        a range past the object's end reads what is there (b"" at or after the end), never
        an error; a negative offset or length is InvalidByteRange (check_range) before any
        access. The local store seeks and the S3 store asks for the range (a Range header):
        neither reads the bytes before `offset` or after the range. This fallback, for
        stores that only have get(), reads the object whole first."""
        check_range(offset, length)
        data = self.get(key)
        end = None if length is None else offset + length
        return ObjectReader(io.BytesIO(data[offset:end]), lambda exc: exc, failures=())

    @abc.abstractmethod
    def put(self, key: str, data: BlobBytes, if_absent: bool = False) -> bool:
        """Write atomically (readers see the old object, none, or the whole new one).
        With if_absent, an existing object is left alone and False is returned."""

    def put_stream(self, key: str, source: Readable) -> Written:
        """Write a NEW object from `source`, read in pieces of STREAM_CHUNK_BYTES (never
        whole), for objects too large to hold in memory (`quarry put --from`); its size and
        SHA-256 as the bytes went by. `key` must be one no one else writes (a fresh uuid):
        it is written once and never replaced. Like put, nothing is visible under the key
        until every byte is written; a failure leaves nothing there. The local and S3
        stores stream; this fallback, for stores that only have put(), reads it whole."""
        reader = HashingReader(source)
        if not self.put(key, reader.read(), if_absent=True):
            raise ObjectExists.for_stream(key)
        return reader.written

    def put_deferred(self, key: str, data: BlobBytes) -> bool:
        """put(if_absent=True) whose durability may wait for the next sync(): for a batch of
        immutable objects (range files) written before the one object that refers to them
        (their metarange). Where every put is durable at once this is just put."""
        return self.put(key, data, if_absent=True)

    def sync(self) -> None:  # noqa: B027 — optional hook: a no-op where every put is durable
        """Make every put_deferred so far durable (also objects it found already there)."""

    def put_after_sync(self, key: str, data: BlobBytes) -> bool:
        """sync(), then put(key, data, if_absent=True): the object that names a batch of
        put_deferred objects (their metarange). It must never become visible before every
        put_deferred so far is durable; a store may prepare it out of sight (write and flush
        its bytes) while it syncs them."""
        self.sync()
        return self.put(key, data, if_absent=True)

    def put_if_equals(self, key: str, data: bytes, expected: bytes) -> bool:
        """Replace the object only if its current bytes are `expected` (atomically with
        respect to other put_if_equals and put(if_absent) calls); False otherwise."""
        raise NotImplementedError(f"{type(self).__name__} has no conditional replace")

    @abc.abstractmethod
    def exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Idempotent: deleting a missing object is not an error."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix`, in key order."""

    def list_leftovers(self, older_than: float) -> Iterator[ObjectInfo]:
        """Temporary files writers left (killed mid-write) last modified before `older_than`
        (epoch seconds), in key order: never listed by `list`, garbage for GC. None in an
        object store, where an unfinished PUT leaves nothing."""
        return iter(())

    def remove_empty_folder(self, prefix: str) -> None:
        """Drop the folder `prefix` (a key prefix ending in "/") if it holds nothing any
        more. A local directory stays behind its last file; object stores have no folders
        (nothing to do). Never removes a folder that holds anything."""
        return None

    def first_keys(self, limit: int) -> builtins.list[str]:
        """Up to `limit` keys of the namespace (a bounded listing: an emptiness check must
        not walk a huge directory)."""
        keys: builtins.list[str] = []
        for info in self.list(""):
            if len(keys) >= limit:
                break
            keys.append(info.key)
        return keys

    @property
    def is_local(self) -> bool:
        """True when local_path returns real file paths (a local directory)."""
        return False

    def local_path(self, key: str) -> str | None:
        """A real file path for the key when the store is a local directory (so readers such
        as pyarrow can open it in place), else None. The file may not exist."""
        return None

    def close(self) -> None:  # noqa: B027 — optional hook: most stores hold nothing to release
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
