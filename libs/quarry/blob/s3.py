"""S3BlobStore: a storage namespace under s3://bucket/prefix, through boto3.

Conditional create (put if_absent) uses S3's `If-None-Match: *`. A server that does not
support it (older S3-compatible stores) gets a HEAD check followed by a plain PUT instead;
the store remembers the fallback. For Quarry's content-addressed objects the check-then-put
race is harmless: both writers write the same logical content.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import io
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from quarry import errors
from quarry.blob.base import (
    STREAM_CHUNK_BYTES,
    BlobBytes,
    BlobStore,
    HashingReader,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectReader,
    Readable,
    StorageUnreachable,
    Written,
    check_key,
    check_range,
)

log = logging.getLogger(__name__)

_MISSING_CODES = {"404", "NoSuchKey", "NotFound"}
_EXISTS_CODES = {"412", "PreconditionFailed"}
# Another conditional write of the same key is in flight.
_CONFLICT_CODES = {"409", "ConditionalRequestConflict"}
_UNSUPPORTED_CODES = {"501", "NotImplemented"}

# put_stream: one PUT below the threshold, a multipart upload of parts of this size above it.
# The source is read front to back and each part held in memory until sent: at most
# STREAM_PARTS_IN_MEMORY parts in flight and the one being read (40 MiB) per upload, whatever
# the object's size.
STREAM_PART_BYTES = 8 << 20
STREAM_PARTS_IN_MEMORY = 4


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return code or status


def _refusal(exc: Exception) -> str | None:
    """Why S3 refused a write carrying `If-None-Match: *`: "exists" (an object is there),
    "conflict" (another conditional write of the key is in flight), "unsupported" (the
    server refused the condition itself: an older S3-compatible store), or None (another
    failure)."""
    code, status = _error_code(exc), _status(exc)
    if code in _EXISTS_CODES or status == "412":
        return "exists"
    if code in _CONFLICT_CODES or status == "409":
        return "conflict"
    if (
        code in _UNSUPPORTED_CODES
        or status == "501"
        or (code == "InvalidArgument" and "if-none-match" in str(exc).lower())
    ):
        return "unsupported"
    return None


def _read_part(reader: HashingReader) -> bytes:
    """The next STREAM_PART_BYTES of the source (fewer at its end), read STREAM_CHUNK_BYTES
    at a time."""
    part = bytearray()
    while len(part) < STREAM_PART_BYTES:
        chunk = reader.read(min(STREAM_CHUNK_BYTES, STREAM_PART_BYTES - len(part)))
        if not chunk:
            break
        part += chunk
    return bytes(part)


def _status(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))


class S3BlobStore(BlobStore):
    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        *,
        client: Any = None,
        max_pool_connections: int = 32,
    ):
        if not bucket:
            raise errors.InvalidArgument("S3 storage namespace needs a bucket")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.endpoint_url = endpoint_url or None
        self.region = region
        if client is None:
            client = shared_client(self.endpoint_url, region, max_pool_connections)
        self._client = client
        self._conditional_put_supported = True
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"S3BlobStore(s3://{self.bucket}/{self.prefix})"

    def _key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def get(self, key: str) -> bytes:
        with self.open_read(key) as reader:
            return reader.read()

    def open_read(self, key: str, offset: int = 0, length: int | None = None) -> ObjectReader:
        """get_object's Body, read as the caller asks (never whole unless asked); the
        connection goes back to the pool when the reader is closed. A range is asked of S3
        (`Range: bytes=FIRST-LAST`), so only its bytes travel; S3's InvalidRange (the range
        starts at or past the end) is an empty read, as for every store."""
        from botocore.exceptions import BotoCoreError, ClientError
        from urllib3.exceptions import HTTPError

        check_range(offset, length)
        ranged: dict[str, str] = {}
        if length is not None:
            # A length of 0 still asks for one byte (S3 has no empty range), never read.
            ranged["Range"] = f"bytes={offset}-{offset + max(length, 1) - 1}"
        elif offset:
            ranged["Range"] = f"bytes={offset}-"
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self._key(key), **ranged)
        except (ClientError, BotoCoreError) as exc:
            if _error_code(exc) != "NoSuchBucket" and (
                _error_code(exc) in _MISSING_CODES or _status(exc) == "404"
            ):
                raise ObjectNotFound(
                    f"object {key!r} not found in s3://{self.bucket}/{self.prefix}"
                ) from None
            if ranged and (_error_code(exc) == "InvalidRange" or _status(exc) == "416"):
                return ObjectReader(io.BytesIO(b""), lambda exc: exc, failures=())
            raise _unavailable(exc, self) from exc
        # A connection dropped or timing out mid-body is UNAVAILABLE like any S3 failure.
        return ObjectReader(
            response["Body"],
            lambda exc: _unavailable(exc, self),
            failures=(ClientError, BotoCoreError, HTTPError, OSError),
            limit=length,
        )

    def exists(self, key: str) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except (ClientError, BotoCoreError) as exc:
            if _error_code(exc) in _MISSING_CODES or _status(exc) == "404":
                return False
            raise _unavailable(exc, self) from exc

    def put(self, key: str, data: BlobBytes, if_absent: bool = False) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        full_key = self._key(key)
        data = bytes(data)  # boto3 takes bytes (a view is copied: the network costs more)
        if not if_absent:
            try:
                self._client.put_object(Bucket=self.bucket, Key=full_key, Body=data)
            except (ClientError, BotoCoreError) as exc:
                raise _unavailable(exc, self) from exc
            return True
        if self._conditional_put_supported:
            for attempt in range(5):
                try:
                    self._client.put_object(
                        Bucket=self.bucket, Key=full_key, Body=data, IfNoneMatch="*"
                    )
                    return True
                except (ClientError, BotoCoreError) as exc:
                    refusal = _refusal(exc)
                    if refusal == "exists":
                        return False
                    if refusal == "conflict":
                        # A concurrent conditional write of the same key: wait for it.
                        time.sleep(0.05 * (attempt + 1))
                        if self.exists(key):
                            return False
                        continue
                    if refusal == "unsupported":
                        self._no_conditional_writes()
                        break
                    raise _unavailable(exc, self) from exc
            else:
                raise errors.Unavailable(f"conditional write of {key!r} kept conflicting")
        if self.exists(key):
            return False
        try:
            self._client.put_object(Bucket=self.bucket, Key=full_key, Body=data)
        except (ClientError, BotoCoreError) as exc:
            raise _unavailable(exc, self) from exc
        return True

    def _no_conditional_writes(self) -> None:
        log.info(
            "s3://%s does not support conditional writes; falling back to HEAD + PUT",
            self.bucket,
        )
        with self._lock:
            self._conditional_put_supported = False

    def put_stream(self, key: str, source: Readable) -> Written:
        """A NEW object from `source`, read a part at a time: one PUT when it fits in one
        part, else a multipart upload of parts of STREAM_PART_BYTES, at most
        STREAM_PARTS_IN_MEMORY of them in flight.

        Never replaces an object: the PUT and the CompleteMultipartUpload carry
        `If-None-Match: *` (a HEAD first where the server has no conditional writes), and
        an object found there is ObjectExists, the one already there left as it was.
        Nothing is visible under the key unless complete (a PUT is atomic; a multipart
        upload's object appears only at its completion), and on any failure, also the
        source's, the multipart upload is aborted: no parts are left billed."""
        from botocore.exceptions import BotoCoreError, ClientError

        full_key = self._key(key)  # an invalid key is refused before the source is read
        reader = HashingReader(source)
        first = _read_part(reader)
        if len(first) < STREAM_PART_BYTES:
            if not self.put(key, first, if_absent=True):
                raise ObjectExists.for_stream(key)
            return reader.written
        try:
            upload_id = self._client.create_multipart_upload(Bucket=self.bucket, Key=full_key)[
                "UploadId"
            ]
        except (ClientError, BotoCoreError) as exc:
            raise _unavailable(exc, self) from exc
        try:
            parts = self._upload_parts(full_key, upload_id, reader, first)
            self._complete_new(key, upload_id, parts)
        except BaseException:
            with contextlib.suppress(ClientError, BotoCoreError):
                self._client.abort_multipart_upload(
                    Bucket=self.bucket, Key=full_key, UploadId=upload_id
                )
            raise
        return reader.written

    def _upload_parts(
        self, full_key: str, upload_id: str, reader: HashingReader, first: bytes
    ) -> list[dict[str, Any]]:
        """Every part of the source (`first` already read), uploaded STREAM_PARTS_IN_MEMORY
        at a time while the next is read; their numbers and ETags in order."""
        from botocore.exceptions import BotoCoreError, ClientError

        def upload(number: int, body: bytes) -> dict[str, Any]:
            try:
                response = self._client.upload_part(
                    Bucket=self.bucket,
                    Key=full_key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=body,
                )
            except (ClientError, BotoCoreError) as exc:
                raise _unavailable(exc, self) from exc
            return {"PartNumber": number, "ETag": response["ETag"]}

        parts: list[dict[str, Any]] = []
        in_flight: collections.deque[concurrent.futures.Future[dict[str, Any]]]
        in_flight = collections.deque()
        with concurrent.futures.ThreadPoolExecutor(STREAM_PARTS_IN_MEMORY) as pool:
            part, number = first, 1
            while part:
                if len(in_flight) == STREAM_PARTS_IN_MEMORY:
                    parts.append(in_flight.popleft().result())
                in_flight.append(pool.submit(upload, number, part))
                part, number = _read_part(reader), number + 1
            parts.extend(future.result() for future in in_flight)
        return parts

    def _complete_new(self, key: str, upload_id: str, parts: list[dict[str, Any]]) -> None:
        """Complete a multipart upload only if no object is under `key` (ObjectExists)."""
        from botocore.exceptions import BotoCoreError, ClientError

        request: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self._key(key),
            "UploadId": upload_id,
            "MultipartUpload": {"Parts": parts},
        }
        exists = ObjectExists.for_stream(key)
        if self._conditional_put_supported:
            try:
                self._client.complete_multipart_upload(**request, IfNoneMatch="*")
                return
            except (ClientError, BotoCoreError) as exc:
                refusal = _refusal(exc)
                if refusal == "exists":
                    raise exists from None
                if refusal == "conflict":
                    # A concurrent conditional write of the key: whoever wins, not us.
                    raise (exists if self.exists(key) else _unavailable(exc, self)) from None
                if refusal != "unsupported":
                    raise _unavailable(exc, self) from exc
                self._no_conditional_writes()
        if self.exists(key):
            raise exists
        try:
            self._client.complete_multipart_upload(**request)
        except (ClientError, BotoCoreError) as exc:
            raise _unavailable(exc, self) from exc

    def put_if_equals(self, key: str, data: bytes, expected: bytes) -> bool:
        # S3's `If-Match: <etag>` makes the replace atomic: the ETag read with the expected
        # bytes must still be current when the new object lands.
        from botocore.exceptions import BotoCoreError, ClientError

        full_key = self._key(key)
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=full_key)
            body = response["Body"]
            try:
                current = body.read()
            finally:
                body.close()
        except (ClientError, BotoCoreError) as exc:
            if _error_code(exc) in _MISSING_CODES:
                return False
            raise _unavailable(exc, self) from exc
        if current != expected:
            return False
        try:
            self._client.put_object(
                Bucket=self.bucket, Key=full_key, Body=data, IfMatch=response["ETag"]
            )
            return True
        except (ClientError, BotoCoreError) as exc:
            if _error_code(exc) in _EXISTS_CODES | _CONFLICT_CODES | _MISSING_CODES or _status(
                exc
            ) in ("412", "409"):
                return False
            raise _unavailable(exc, self) from exc

    def delete(self, key: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except (ClientError, BotoCoreError) as exc:
            if _error_code(exc) in _MISSING_CODES:
                return
            raise _unavailable(exc, self) from exc

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        from botocore.exceptions import BotoCoreError, ClientError

        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                for item in page.get("Contents", ()):
                    yield ObjectInfo(
                        item["Key"][len(self.prefix) :],
                        int(item["Size"]),
                        item["LastModified"].timestamp(),
                    )
        except (ClientError, BotoCoreError) as exc:
            raise _unavailable(exc, self) from exc

    def close(self) -> None:
        pass  # the client is shared by every store on the same endpoint and region


_clients: dict[tuple[str | None, str, int], Any] = {}
_clients_lock = threading.Lock()


def shared_client(endpoint_url: str | None, region: str, max_pool_connections: int = 32) -> Any:
    """One boto3 S3 client per (endpoint, region): clients are thread-safe and costly to
    build, and a service may open many repositories' namespaces."""
    key = (endpoint_url, region, max_pool_connections)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            import boto3
            from botocore.config import Config

            config = Config(
                region_name=region,
                retries={"mode": "standard", "max_attempts": 5},
                max_pool_connections=max_pool_connections,
                # Custom endpoints (S3-compatible servers on an IP) want path-style URLs.
                s3={"addressing_style": "path"} if endpoint_url else {},
            )
            client = _clients[key] = boto3.session.Session().client(
                "s3", endpoint_url=endpoint_url, config=config
            )
        return client


# Error codes that mean the environment refuses this namespace (fixing it, not retrying,
# resolves them), with the cause named in STORAGE_UNREACHABLE's message and metadata.
_ENVIRONMENT_CODES = {
    "NoSuchBucket": "no such bucket",
    "AccessDenied": "access denied",
    "403": "access denied",
    "AllAccessDisabled": "access denied",
    "AccountProblem": "access denied",
    "InvalidAccessKeyId": "invalid credentials (unknown access key)",
    "SignatureDoesNotMatch": "invalid credentials (signature does not match)",
    "InvalidToken": "invalid credentials (token)",
    "ExpiredToken": "invalid credentials (expired token)",
    "TokenRefreshRequired": "invalid credentials (expired token)",
    "InvalidBucketName": "invalid bucket name",
    "PermanentRedirect": "the bucket is in another region",
    "AuthorizationHeaderMalformed": "the bucket is in another region",
}


def _unavailable(
    exc: Exception, store: S3BlobStore | None = None, location: str = ""
) -> errors.QuarryError:
    """The one mapping of boto3/botocore failures to Quarry errors: the environment's
    refusals are FAILED_PRECONDITION / STORAGE_UNREACHABLE naming the cause; anything else
    (throttling, 5xx, timeouts) is UNAVAILABLE, so clients retry it."""
    from botocore import exceptions as bx

    if store is not None:
        location = f"s3://{store.bucket}/{store.prefix}"
    cause = ""
    if isinstance(exc, bx.NoCredentialsError):
        cause = "no credentials"
    elif isinstance(exc, bx.PartialCredentialsError):
        cause = "incomplete credentials"
    elif isinstance(exc, (bx.EndpointConnectionError, bx.ConnectTimeoutError)):
        cause = "endpoint unreachable"
    elif isinstance(exc, bx.NoRegionError):
        cause = "no region configured"
    elif isinstance(exc, bx.ClientError):
        code = _error_code(exc)
        cause = _ENVIRONMENT_CODES.get(code, "")
        if not cause and _status(exc) == "403":
            cause = "access denied"
    if cause:
        return StorageUnreachable(
            f"S3 location {location or '?'} is not usable: {cause} ({exc})",
            cause=cause,
            location=location,
        )
    return errors.Unavailable(f"S3 error: {exc}")
