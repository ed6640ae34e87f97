"""One handler per S3 operation, over Quarry's gRPC API called with the caller's own token
(so the same policies, branch protection and audit apply as for any client) and the object
bytes in the repository's storage namespace (or an imported object's own address) through
the blob stores.

Bucket = repository; key = REF/PATH. Reads work on any ref; writes only on branches
(MethodNotAllowed otherwise). Bytes of a write go to a fresh key `data/<uuid hex>` in the
namespace (the shape of `quarry put`'s uploads, which GC treats alike), in pieces (MD5 and
SHA-256 computed on the way), and the entry is staged only after every check on them passed
(Content-MD5, a signed x-amz-content-sha256, aws-chunked chunk signatures): quarry.uploads,
the mechanism the console's upload shares.

Safety rules: a write never stages an entry whose bytes failed a check, and a failed write
(a bad digest, a refused signature, a denied or protected staging, a dropped connection)
removes the bytes it wrote; it never deletes or overwrites any other object. A multipart
upload's parts are invisible (no entry) until CompleteMultipartUpload stages the whole
object; an aborted or completed upload's parts are removed.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import itertools
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

from quarry import errors, uploads
from quarry.auth.policy import object_arn
from quarry.blob import (
    BlobStore,
    ChecksumMismatch,
    Confinement,
    ObjectChanged,
    ObjectNotFound,
    check_stored_size,
    confinement,
    object_address,
    open_blob_store,
    open_object,
    parse_storage_namespace,
    primed,
    records_sha256,
    size_recorded,
    verified_chunks,
)
from quarry.blob.layout import address_location, new_upload_key
from quarry.client import Client
from quarry.httpsyntax import is_header_name, is_header_value
from quarry.s3gateway import checksums, xmlserde
from quarry.s3gateway.errors import (
    S3Error,
    access_denied,
    from_quarry,
    invalid_argument,
    method_not_allowed,
    no_such_key,
    not_implemented,
)
from quarry.s3gateway.request import Request, Response, xml_response
from quarry.v1 import types_pb2

log = logging.getLogger(__name__)

MULTIPART_PREFIX = "_s3_multipart/"
READ_CHUNK = 1 << 20
# A GET's body goes out in pieces this large: each piece is one hop from the worker thread
# to the event loop, so fewer, larger pieces (still a few MiB per request at most).
SEND_CHUNK = 4 << 20
MAX_KEYS = 1000
MAX_LIST_KEYS = 10_000  # quarry.paging.MAX_PAGE_SIZE
MAX_PARTS = 10_000
MAX_KEY_BYTES = 1024  # S3: a key (here REF/PATH) is at most 1,024 bytes of UTF-8
MAX_XML_BODY = xmlserde.MAX_REQUEST_XML_BYTES
_META = "x-amz-meta-"


class Lookups:
    """What the gateway looked up for a user a moment ago, reused for `ttl_seconds`
    (QUARRY_S3_GATEWAY_CACHE_SECONDS): a repository's record (its storage namespace) and
    that a ref is a branch. A request then costs one Quarry call (stat, stage) instead of
    three.

    Safety: these are never what authorizes or decides a write. Entries are per user (one
    user's lookup never answers another's), and the staging call that follows is checked by
    branch-manager as always (policies, protection, the branch and repository still
    existing): a repository or branch deleted within the TTL makes that call fail, and the
    bytes written for it are removed (_stage). The branch check here is only the early
    MethodNotAllowed for a write to a tag or commit before any byte is stored."""

    def __init__(self, ttl_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        from quarry.lru import TTLCache

        self.repositories = TTLCache(ttl_seconds, max_items=10_000, clock=clock)
        self.branches = TTLCache(ttl_seconds, max_items=10_000, clock=clock)
        # A repository's branch names as S3 keys (NAME/), sorted: a client paging through
        # the branches reads them once per TTL, not once per page (3,000 branches paged 7
        # at a time took 40 s). Only ever a listing's answer, never a write's check.
        self.branch_keys = TTLCache(ttl_seconds, max_items=1_000, clock=clock)


@dataclass
class Context:
    """What one request's operation works with: the caller's client and who they are."""

    client: Client
    user_id: str
    settings: Any
    region: str
    sealed_check: Callable[[list[tuple[str, str]]], None]  # checks aws-chunked signatures
    lookups: Lookups | None = None
    # The gateway's shared staging calls (concurrent PUTs of one caller to one branch); None:
    # a call per write.
    staging: uploads.SharedStaging | None = None
    # Auth is on: the caller proved who they are and `client` carries their token.
    authenticated: bool = False


# ---- helpers ------------------------------------------------------------------------------

WRITE_OBJECT = "fs:WriteObject"


# An ETag S3 clients read as the MD5 of the bytes (no dash) or of a multipart upload (-N).
_S3_ETAG = re.compile(r"[0-9a-f]{32}(-[0-9]+)?")


def _etag(checksum: str) -> str:
    """The entry's ETag. S3 clients take a dash-less ETag for the MD5 of the bytes (s3cmd
    warned of a mismatch on every download and its sync re-transferred, rclone checks
    it): a checksum that is not an MD5 (the SHA-256 Spark and `quarry put --from` record)
    is shown in the multipart form `<32 hex>-1`, which clients never check as one; it is
    derived from the checksum, so it changes exactly when the object does."""
    if _S3_ETAG.fullmatch(checksum):
        return f'"{checksum}"'
    return f'"{hashlib.md5(checksum.encode()).hexdigest()}-1"'


def _mtime(entry: types_pb2.Entry) -> float:
    return entry.mtime.seconds + entry.mtime.nanos / 1e9 if entry.HasField("mtime") else 0.0


def _object_headers(entry: types_pb2.Entry) -> list[tuple[str, str]]:
    headers = [
        ("etag", _etag(entry.checksum)),
        ("last-modified", xmlserde.http_date(_mtime(entry))),
        ("content-type", entry.content_type or "application/octet-stream"),
        ("accept-ranges", "bytes"),
        # A stored HTML page opened in a browser (a presigned link) runs in a sandbox of
        # its own origin: it cannot set cookies for this host, whose other ports serve the
        # console (it could sign a user in as someone else), nor be read as another type.
        ("content-security-policy", "sandbox"),
        ("x-content-type-options", "nosniff"),
    ]
    # Safety rule: metadata becomes headers only under names the gateway chose (the five
    # standard headers, x-amz-meta-*) and with values a header can carry. Metadata is
    # anyone's to write through the CLI and gRPC: mapped as it was, `quarry.http.set-cookie`
    # set a cookie on this host (its other ports serve the console), and a CR/LF in a value
    # split the answer (a 500, a dropped connection).
    for key, value in sorted(entry.metadata.items()):
        if not is_header_value(value):
            continue
        if key.startswith(STORED_HEADER_PREFIX):
            name = key[len(STORED_HEADER_PREFIX) :]
            if name in STORED_HEADERS:
                headers.append((name, value))
        elif key.startswith(checksums.STORED_PREFIX):
            continue  # answered only when asked for (_checksum_headers)
        elif is_header_name(key):
            headers.append((_META + key, value))
    return headers


def _call(fn: Callable[..., Any], *args: Any, resource: str = "", **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except errors.QuarryError as exc:
        raise from_quarry(exc, resource) from None


def _repository(ctx: Context, bucket: str) -> types_pb2.Repository:
    key = (ctx.user_id, bucket)
    if ctx.lookups is not None:
        cached = ctx.lookups.repositories.get(key)
        if cached is not None:
            return cached
    try:
        repo = ctx.client.get_repository(bucket)
    except errors.QuarryError as exc:
        if exc.code is not None and exc.code.name == "NOT_FOUND":
            raise S3Error(
                "NoSuchBucket", "The specified bucket does not exist", 404, bucket
            ) from None
        raise from_quarry(exc, bucket) from None
    if ctx.lookups is not None:
        ctx.lookups.repositories.put(key, repo)
    return repo


def _confine(ctx: Context, bucket: str, address: str) -> Confinement | None:
    """For an object at a local address, where reads of `bucket` may open files
    (quarry.blob.confine: a link planted after staging is not followed out); None for S3
    addresses, with no repository lookup (reads are the hot path)."""
    location = address_location(address)
    if location is None or location.kind != "local":
        return None
    return confinement(_repository(ctx, bucket).storage_namespace, ctx.settings)


def _require_branch(ctx: Context, bucket: str, ref: str) -> None:
    """MethodNotAllowed unless `ref` is a branch: writes go to branches only."""
    if not ref:
        raise method_not_allowed("a write needs a key BRANCH/PATH")
    key = (ctx.user_id, bucket, ref)
    if ctx.lookups is not None and ctx.lookups.branches.get(key) is not None:
        return
    try:
        ctx.client.get_branch(bucket, ref)
    except errors.QuarryError as exc:
        if exc.code is not None and exc.code.name in ("NOT_FOUND", "INVALID_ARGUMENT"):
            raise method_not_allowed(
                f"{ref!r} is not a branch of {bucket!r}: writes go to branches only"
            ) from None
        raise from_quarry(exc, bucket) from None
    if ctx.lookups is not None:
        ctx.lookups.branches.put(key, True)


# The standard headers S3 stores with an object and answers GET and HEAD with, kept in the
# entry's metadata under STORED_HEADER_PREFIX (a client's own x-amz-meta-* may not use it).
STORED_HEADERS = (
    "cache-control",
    "content-disposition",
    "content-encoding",
    "content-language",
    "expires",
)
STORED_HEADER_PREFIX = "quarry.http."


def _user_metadata(request: Request) -> dict[str, str]:
    """The entry metadata a write records: the client's x-amz-meta-* and the standard
    headers S3 keeps with an object (STORED_HEADERS; Content-Encoding without the
    `aws-chunked` that only framed this request's body). A gzip object uploaded with
    `--content-encoding gzip` is served with it, not as bytes of another type."""
    metadata = {
        name[len(_META) :]: values[0]
        for name, values in request.headers.items()
        if name.startswith(_META)
    }
    reserved = [
        (name, prefix)
        for name in metadata
        for prefix in (STORED_HEADER_PREFIX, checksums.STORED_PREFIX)
        if name.startswith(prefix)
    ]
    if reserved:
        name, prefix = reserved[0]
        raise invalid_argument(f"x-amz-meta-{name}: the {prefix} names are reserved")
    for header in STORED_HEADERS:
        value = request.header(header).strip()
        if header == "content-encoding":
            codings = [c.strip() for c in value.split(",") if c.strip()]
            value = ", ".join(c for c in codings if c.lower() != "aws-chunked")
        if value:
            metadata[STORED_HEADER_PREFIX + header] = value
    return metadata


def _timestamp(seconds: float) -> Any:
    from google.protobuf.timestamp_pb2 import Timestamp

    stamp = Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


# ---- body decoding -----------------------------------------------------------------------


Finish = Callable[[], "checksums.Claim | None"]


def body_reader(
    request: Request, ctx: Context, signature: Any
) -> tuple[Callable[[int], bytes], Finish]:
    """(read, finish): the payload's bytes, decoded from aws-chunked when the request says
    so, and the checks to run once they are all read (chunk signatures via the Auth
    service; the claimed x-amz-checksum-*, quarry.s3gateway.checksums), which return the
    checksum verified (None: none claimed, or one accepted unverified)."""
    from quarry.s3gateway import sigv4

    mode = signature.payload_hash if signature is not None else sigv4.UNSIGNED_PAYLOAD
    chunked = mode in (
        sigv4.STREAMING_PAYLOAD,
        sigv4.STREAMING_UNSIGNED_TRAILER,
        sigv4.STREAMING_PAYLOAD_TRAILER,
    )
    claim = checksums.claimed(request, chunked)
    if chunked:
        signed = mode in (sigv4.STREAMING_PAYLOAD, sigv4.STREAMING_PAYLOAD_TRAILER)
        decoder = sigv4.ChunkedDecoder(
            request.read,
            signature if signed else None,
            signature.signature,
            signed_trailer=mode == sigv4.STREAMING_PAYLOAD_TRAILER,
        )
        read: Callable[[int], bytes] = decoder.read
        trailers = decoder.trailers

        def check_chunks() -> checksums.Claim | None:
            if signed:
                ctx.sealed_check(decoder.signed)
            # A trailer no x-amz-trailer announced is refused, never ignored: a checksum
            # sent that way went unchecked (a wrong CRC32 was stored with a 200).
            announced = claim.name if claim is not None and claim.value is None else ""
            extra = sorted(name for name in decoder.trailers if name != announced)
            if extra:
                raise S3Error(
                    "InvalidRequest", f"trailer {extra[0]} was not announced in x-amz-trailer", 400
                )
            return None
    else:
        read, trailers = request.read, {}

        def check_chunks() -> checksums.Claim | None:
            return None

    if claim is None:
        return read, check_chunks
    summing = checksums.Summing(read, claim)

    def finish() -> checksums.Claim | None:
        check_chunks()
        return summing.verify(trailers)

    return summing.read, finish


# ---- buckets ------------------------------------------------------------------------------


def list_buckets(ctx: Context, request: Request) -> Response:
    buckets = [
        [("Name", repo.name), ("CreationDate", xmlserde.timestamp(repo.creation_time.seconds))]
        for repo in _call(ctx.client.iter_repositories)
    ]
    return xml_response(
        xmlserde.document(
            "ListAllMyBucketsResult",
            [
                ("Owner", [[("ID", ctx.user_id), ("DisplayName", ctx.user_id)]]),
                ("Buckets", [[("Bucket", buckets)]] if buckets else [[]]),
            ],
        )
    )


def create_bucket(ctx: Context, request: Request) -> Response:
    """A bucket is a repository, which needs a storage namespace: the gateway makes none.
    CreateBucket of a repository the caller can read answers as S3 does for a bucket one
    owns (409 BucketAlreadyOwnedByYou, which rclone, s3cmd and `aws s3 mb` take as "it
    exists": rclone sends it before a single-file copy); of any other name, how to make one."""
    try:
        _repository(ctx, request.target.bucket)
    except S3Error as error:
        if error.code != "NoSuchBucket":
            raise
        raise S3Error(
            "NotImplemented",
            "a bucket is a Quarry repository, created with its storage namespace: "
            f"quarry repo create {request.target.bucket} NAMESPACE",
            501,
            request.target.bucket,
        ) from None
    raise S3Error(
        "BucketAlreadyOwnedByYou",
        "Your previous request to create the named bucket succeeded and you already own it.",
        409,
        request.target.bucket,
    )


def head_bucket(ctx: Context, request: Request) -> Response:
    _repository(ctx, request.target.bucket)
    return Response(200, [("x-amz-bucket-region", ctx.region)])


def get_bucket_location(ctx: Context, request: Request) -> Response:
    _repository(ctx, request.target.bucket)
    # us-east-1 is S3's empty LocationConstraint.
    region = "" if ctx.region == "us-east-1" else ctx.region
    body = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n'
        + f'<LocationConstraint xmlns="{xmlserde.NS}">{region}</LocationConstraint>'.encode()
    )
    return xml_response(body)


# ---- listing ------------------------------------------------------------------------------


def _branch_keys(ctx: Context, bucket: str) -> list[str]:
    """The repository's branches as S3 keys (NAME/), sorted; the user's TTL snapshot when
    the gateway keeps one (Lookups.branch_keys)."""
    key = (ctx.user_id, bucket)
    if ctx.lookups is not None:
        cached = ctx.lookups.branch_keys.get(key)
        if cached is not None:
            return cached
    keys = sorted(b.name + "/" for b in _call(ctx.client.iter_branches, bucket))
    if ctx.lookups is not None:
        ctx.lookups.branch_keys.put(key, keys)
    return keys


@dataclass
class _Page:
    keys: list[types_pb2.Entry]  # paths already prefixed with REF/
    prefixes: list[str]
    next_token: str


def _list_page(  # noqa: PLR0913 — the S3 listing parameters
    ctx: Context, bucket: str, prefix: str, delimiter: str, max_keys: int, token: str, after: str
) -> _Page:
    """One page of keys under `prefix` (REF/PATH-PREFIX). A prefix without "/" names no ref
    yet: the branches it matches are listed as common prefixes (with delimiter "/")."""
    _repository(ctx, bucket)
    if "/" not in prefix:
        if delimiter != "/":
            # Never "empty": `aws s3 sync --delete s3://REPO DIR` would delete every file
            # of DIR. A listing across refs is not built (README: S3 gateway).
            raise not_implemented(
                "a listing across refs (give the prefix REF/, or the delimiter /)"
            )
        keys = _branch_keys(ctx, bucket)
        # A continuation names the last branch of the page before (see below). S3 orders
        # keys (NAME/), not names: `a-b/` comes before `a/`.
        start = max(bisect.bisect_right(keys, max(after, token)), bisect.bisect_left(keys, prefix))
        names: list[str] = []
        for key in itertools.islice(keys, start, None):
            if not key.startswith(prefix) or len(names) > max_keys:
                break  # past the block of keys starting with the prefix, or the page
            names.append(key)
        if len(names) > max_keys:
            return _Page([], names[:max_keys], names[max_keys - 1])
        return _Page([], names, "")
    ref, path_prefix = prefix.split("/", 1)
    page_token = ""
    if token:
        page_token = token
    elif after:
        after_ref, _, after_path = after.partition("/")
        if after_ref > ref:
            return _Page([], [], "")
        if after_ref == ref and after_path:
            if after_path.startswith(path_prefix):
                from quarry.graveler.iterators import encode_page_token

                # The listing's own "after" token (what ListObjects resumes from).
                skip = bool(delimiter) and after_path.endswith(delimiter)
                page_token = encode_page_token(after=after_path, skip_prefix=skip)
            elif after_path > path_prefix:
                return _Page([], [], "")
    # A ref that does not exist is NoSuchKey, never an empty listing (which S3 would give
    # for an empty prefix): a mistyped branch in `aws s3 sync --delete s3://REPO/BRANCH/
    # DIR` must not delete every file of DIR.
    response = _call(
        ctx.client.list_objects,
        bucket,
        ref,
        prefix=path_prefix,
        delimiter=delimiter,
        page_size=max_keys,
        page_token=page_token,
        resource=bucket,
    )
    entries = []
    for entry in response.entries:
        copy = types_pb2.Entry()
        copy.CopyFrom(entry)
        copy.path = f"{ref}/{entry.path}"
        entries.append(copy)
    prefixes = [f"{ref}/{p}" for p in response.common_prefixes]
    return _Page(entries, prefixes, response.next_page_token)


def _max_keys(request: Request) -> int:
    text = request.param("max-keys")
    if text is None:
        return MAX_KEYS
    try:
        value = int(text)
    except ValueError:
        raise invalid_argument("max-keys must be an integer") from None
    if value < 0:
        raise invalid_argument("max-keys must not be negative")
    return min(value, MAX_LIST_KEYS)


def list_objects(ctx: Context, request: Request) -> Response:
    """ListObjectsV2 (list-type=2) and V1."""
    v2 = request.param("list-type") == "2"
    prefix = request.param("prefix") or ""
    delimiter = request.param("delimiter") or ""
    encoding = request.param("encoding-type") or ""
    if encoding not in ("", "url"):
        raise invalid_argument("encoding-type must be url")
    max_keys = _max_keys(request)

    def enc(value: str) -> str:
        return quote(value, safe="/") if encoding == "url" else value

    token = ""
    after = ""
    if v2:
        raw_token = request.param("continuation-token") or ""
        if raw_token:
            try:
                token = base64.urlsafe_b64decode(raw_token.encode()).decode()
            except ValueError:
                raise invalid_argument("The continuation token provided is incorrect") from None
        after = request.param("start-after") or ""
    else:
        after = request.param("marker") or ""
    if max_keys == 0:
        page = _Page([], [], "")
    else:
        page = _list_page(ctx, request.target.bucket, prefix, delimiter, max_keys, token, after)
    contents = [
        [
            ("Key", enc(entry.path)),
            ("LastModified", xmlserde.timestamp(_mtime(entry))),
            ("ETag", _etag(entry.checksum)),
            ("Size", _listed_size(ctx, request.target.bucket, entry)),
            ("StorageClass", "STANDARD"),
        ]
        for entry in page.keys
    ]
    fields: list[tuple[str, Any]] = [
        ("Name", request.target.bucket),
        ("Prefix", enc(prefix)),
    ]
    truncated = bool(page.next_token)
    if v2:
        fields += [
            ("KeyCount", len(page.keys) + len(page.prefixes)),
            ("MaxKeys", max_keys),
            ("Delimiter", enc(delimiter) if delimiter else None),
            ("IsTruncated", truncated),
            ("ContinuationToken", request.param("continuation-token")),
            (
                "NextContinuationToken",
                base64.urlsafe_b64encode(page.next_token.encode()).decode() if truncated else None,
            ),
            ("StartAfter", enc(after) if after else None),
            ("EncodingType", encoding or None),
        ]
    else:
        last = max([e.path for e in page.keys] + page.prefixes, default="")
        fields += [
            ("Marker", enc(after)),
            ("MaxKeys", max_keys),
            ("Delimiter", enc(delimiter) if delimiter else None),
            ("IsTruncated", truncated),
            ("NextMarker", enc(last) if truncated else None),
            ("EncodingType", encoding or None),
        ]
    fields += [("Contents", contents)]
    fields += [("CommonPrefixes", [[("Prefix", enc(p))] for p in page.prefixes])]
    return xml_response(xmlserde.document("ListBucketResult", fields))


# ---- reading objects ----------------------------------------------------------------------


def _stat(ctx: Context, request: Request) -> types_pb2.Entry:
    bucket, key = request.target.bucket, request.target.key
    ref, path = request.target.ref, request.target.path
    if not path:
        _repository(ctx, bucket)
        raise no_such_key(key)
    # One call (no GetRepository first: reads are the hot path); a missing repository
    # says so by its reason.
    try:
        return ctx.client.stat_object(bucket, ref, path)
    except errors.QuarryError as exc:
        # A name no repository can have is a bucket that does not exist, as S3 says.
        no_bucket = exc.reason == "INVALID_NAME" and exc.metadata.get("kind") == "repository"
        if exc.reason == "REPOSITORY_NOT_FOUND" or no_bucket:
            raise S3Error(
                "NoSuchBucket", "The specified bucket does not exist", 404, bucket
            ) from None
        if exc.code is not None and exc.code.name in ("NOT_FOUND", "INVALID_ARGUMENT"):
            raise no_such_key(key) from None
        raise from_quarry(exc, key) from None


def _http_time(value: str) -> float | None:
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def _etag_matches(header: str, etag: str) -> bool:
    wanted = [t.strip() for t in header.split(",")]
    return "*" in wanted or etag in wanted or etag.strip('"') in [w.strip('"') for w in wanted]


_PRECONDITION_FAILED = "At least one of the pre-conditions you specified did not hold"


def _conditions(entry: types_pb2.Entry, request: Request, prefix: str) -> str | None:
    """How the conditional headers `PREFIX-if-match`, `-if-unmodified-since`,
    `-if-none-match` and `-if-modified-since` judge `entry`: "failed", "not-modified" or
    None (every condition holds, or none was given). RFC 7232's order and precedence, which
    S3 follows for GetObject/HeadObject (`if-*`) and for a copy's source
    (`x-amz-copy-source-if-*`): If-Unmodified-Since counts only without If-Match, and
    If-Modified-Since only without If-None-Match; a date that does not parse is ignored."""
    etag = _etag(entry.checksum)
    modified = int(_mtime(entry))  # HTTP dates have whole seconds
    if_match = request.header(prefix + "if-match")
    if if_match and not _etag_matches(if_match, etag):
        return "failed"
    unmodified_since = request.header(prefix + "if-unmodified-since")
    if unmodified_since and not if_match:
        when = _http_time(unmodified_since)
        if when is not None and modified > when:
            return "failed"
    if_none = request.header(prefix + "if-none-match")
    if if_none and _etag_matches(if_none, etag):
        return "not-modified"
    modified_since = request.header(prefix + "if-modified-since")
    if modified_since and not if_none:
        when = _http_time(modified_since)
        if when is not None and modified <= when:
            return "not-modified"
    return None


def _preconditions(request: Request, entry: types_pb2.Entry) -> Response | None:
    """The answer when a conditional header decides a GetObject/HeadObject: 412
    PreconditionFailed (If-Match, If-Unmodified-Since) or 304 Not Modified (If-None-Match,
    If-Modified-Since); None to answer with the object."""
    outcome = _conditions(entry, request, "")
    if outcome == "failed":
        raise S3Error("PreconditionFailed", _PRECONDITION_FAILED, 412)
    if outcome == "not-modified":
        return Response(304, [("etag", _etag(entry.checksum))])
    return None


def _copy_preconditions(request: Request, source: _Source) -> None:
    """The copy-source conditions of a CopyObject or UploadPartCopy
    (x-amz-copy-source-if-match, -if-none-match, -if-modified-since, -if-unmodified-since):
    S3 answers 412 PreconditionFailed whichever fails (a copy has no 304), checked on the
    source entry as stat'ed, before any byte is written or any entry staged."""
    if _conditions(source.entry, request, "x-amz-copy-source-") is not None:
        raise S3Error("PreconditionFailed", _PRECONDITION_FAILED, 412, source.key)


def _range(header: str, size: int) -> tuple[int, int] | None:
    """(first, last) inclusive of a single `bytes=` range; None when absent or not parsable
    (S3 then sends the whole object); InvalidRange when unsatisfiable."""
    if not header.startswith("bytes=") or "," in header:
        return None
    first_text, _, last_text = header[6:].strip().partition("-")
    try:
        if first_text == "":
            length = int(last_text)
            if length <= 0:
                raise ValueError
            return max(0, size - length), size - 1
        first = int(first_text)
        last = int(last_text) if last_text else size - 1
    except ValueError:
        return None
    if first >= size or first < 0:
        raise S3Error("InvalidRange", "The requested range is not satisfiable", 416)
    if last < first:
        return None
    return first, min(last, size - 1)


_OVERRIDES = {
    "response-content-type": "content-type",
    "response-content-language": "content-language",
    "response-expires": "expires",
    "response-cache-control": "cache-control",
    "response-content-disposition": "content-disposition",
    "response-content-encoding": "content-encoding",
}


def _apply_overrides(request: Request, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    out = list(headers)
    for param, header in _OVERRIDES.items():
        value = request.param(param)
        if value is not None:
            out = [(k, v) for k, v in out if k != header] + [(header, value)]
    return out


def _whole_part(request: Request) -> bool:
    """Whether a GetObject/HeadObject asks for `?partNumber=1`. Every object is stored whole
    (a completed multipart upload's parts are concatenated), so each has one part: part 1
    is the whole object, answered as a part (206), and any other number is
    InvalidPartNumber, never the whole object again (a client assembling parts would
    otherwise repeat the bytes)."""
    text = request.param("partNumber")
    if text is None:
        return False
    if request.header("range"):
        raise S3Error(
            "InvalidRequest", "Cannot specify both Range header and partNumber query parameter", 400
        )
    if not _is_count(text) or not 1 <= int(text) <= MAX_PARTS:
        raise invalid_argument("Part number must be an integer between 1 and 10000, inclusive")
    if int(text) != 1:
        raise S3Error("InvalidPartNumber", "The requested partnumber is not satisfiable", 416)
    return True


def _checksum_headers(request: Request, entry: types_pb2.Entry) -> list[tuple[str, str]]:
    """The object's kept checksum, for a GET or HEAD of the whole object that asks for it."""
    if not checksums.asked_for(request):
        return []
    return checksums.response_headers(checksums.stored(entry.metadata, entry.checksum))


def head_object(ctx: Context, request: Request) -> Response:
    entry = _stat(ctx, request)
    early = _preconditions(request, entry)
    if early is not None:
        return early
    size: int | None = entry.size_bytes
    if not size_recorded(entry.size_bytes, entry.checksum):
        # As GET: a local file's own size for an entry that records none; else no length.
        size = _stored_size(
            ctx, entry, _confine(ctx, request.target.bucket, entry.physical_address)
        )
    headers = _object_headers(entry) + _checksum_headers(request, entry)
    if size is None:
        return Response(200, headers)
    headers.append(("content-length", str(size)))
    if _whole_part(request) and size > 0:
        return Response(206, headers + [("content-range", f"bytes 0-{size - 1}/{size}")])
    return Response(200, headers)


def get_object(ctx: Context, request: Request) -> Response:
    """An object, or a range of it. What is sent is checked against the entry as far as a
    read can tell: a local file's size before any byte; the whole object, and any range
    that ends at the object's end (how `aws s3 cp` fetches its last part, how s3cmd and
    rclone resume), by size and SHA-256 as it is sent, the earlier bytes read and hashed
    unsent, the last chunk held until they match (quarry.blob.verified_chunks). A client
    then never completes a file of other bytes: its last part fails. An object of one or
    two chunks fails before the answer starts, with a clear error."""
    entry = _stat(ctx, request)
    early = _preconditions(request, entry)
    if early is not None:
        return early
    confine = _confine(ctx, request.target.bucket, entry.physical_address)
    size, checksum = entry.size_bytes, entry.checksum
    if not size_recorded(size, checksum):
        # An entry of unknown size (`quarry put --address` without --size): a local file's
        # own size stands for it (HEAD says the same); an S3 object's is sent without one.
        stored = _stored_size(ctx, entry, confine)
        if stored is None:
            return _unknown_size_object(ctx, entry, confine)
        size, checksum = stored, ""
    headers = _apply_overrides(request, _object_headers(entry))
    wanted = _range(request.header("range"), size) if size > 0 else None
    if _whole_part(request) and size > 0:
        wanted = (0, size - 1)
    status = 200
    first, last = 0, size - 1
    if wanted is not None:
        first, last = wanted
        status = 206
        headers.append(("content-range", f"bytes {first}-{last}/{size}"))
    if (first, last) == (0, size - 1):
        headers += _checksum_headers(request, entry)  # the whole object's, for the whole
    length = max(0, last - first + 1)
    headers.append(("content-length", str(length)))
    # Read from the start when what is sent ends at the object's end and a SHA-256 can check
    # it; else only the range is read (a seek, or a ranged GET of an S3 namespace).
    to_the_end = last == size - 1
    checked = to_the_end and (wanted is None or records_sha256(checksum))
    if checked:
        opened = open_object(entry.physical_address, ctx.settings, confine=confine)
    else:
        opened = open_object(entry.physical_address, ctx.settings, first, length, confine)
    reader, close = _enter(opened)
    try:
        # A local file of another size: an error before any byte, not a body cut short.
        check_stored_size(reader, entry.physical_address, size, checksum)
        if checked:
            body: Iterator[bytes] = verified_chunks(
                reader, entry.physical_address, size, checksum, SEND_CHUNK, skip=first
            )
        else:
            body = _exactly(reader, length, entry.physical_address)
        return Response(status, headers, primed(body), close=close)
    except errors.QuarryError as exc:
        close()
        raise from_quarry(exc) from None
    except BaseException:
        close()
        raise


def _enter(opened: Any) -> tuple[Any, Callable[[], None]]:
    """An open_object context entered: (its reader, what closes it)."""
    try:
        reader = opened.__enter__()
    except ObjectNotFound:
        raise S3Error("NoSuchKey", "the object's bytes are missing from storage", 404) from None
    except errors.QuarryError as exc:
        raise from_quarry(exc) from None
    return reader, lambda: opened.__exit__(None, None, None)


def _exactly(reader: Any, length: int, address: str) -> Iterator[bytes]:
    left = length
    while left > 0:
        piece = reader.read(min(SEND_CHUNK, left))
        if not piece:
            raise errors.DataLoss(  # the client sees a short body, never wrong bytes
                f"the object at {address} ended {left} bytes early"
            )
        left -= len(piece)
        yield piece


def _listed_size(ctx: Context, bucket: str, entry: types_pb2.Entry) -> int:
    """An entry's size in a listing: the recorded one; for an entry that records none, its
    local file's, as GET and HEAD answer (rclone and s3cmd compare a listing's size with
    what they download). 0 when that cannot be read (an S3 object, a file gone)."""
    if size_recorded(entry.size_bytes, entry.checksum):
        return entry.size_bytes
    try:
        stored = _stored_size(ctx, entry, _confine(ctx, bucket, entry.physical_address))
    except (S3Error, errors.QuarryError):
        return 0
    return stored or 0


def _stored_size(ctx: Context, entry: types_pb2.Entry, confine: Confinement | None) -> int | None:
    """The stored object's size for an entry that records none: a local file's; None for an
    object in S3 (a HEAD there per request is not worth it: it is sent without a length)."""
    opened = open_object(entry.physical_address, ctx.settings, confine=confine)
    reader, close = _enter(opened)
    try:
        fileno = reader.fileno()
        return None if fileno is None else os.fstat(fileno).st_size
    finally:
        close()


def _unknown_size_object(
    ctx: Context, entry: types_pb2.Entry, confine: Confinement | None
) -> Response:
    """An entry of unknown size whose object is in S3: its bytes, without a length."""
    opened = open_object(entry.physical_address, ctx.settings, confine=confine)
    reader, close = _enter(opened)
    body = verified_chunks(reader, entry.physical_address, 0, "", SEND_CHUNK)
    return Response(200, _object_headers(entry), body, close=close)


# ---- writing objects ----------------------------------------------------------------------


def _is_count(text: str) -> bool:
    """Whether `text` is a whole number int() takes (str.isdigit alone admits "²")."""
    return text.isascii() and text.isdigit()


def _check_body(
    stored: uploads.Stored, finish: Finish, request: Request, signature: Any
) -> checksums.Claim | None:
    """The checks on a written body (chunk signatures, the claimed checksum, Content-MD5, a
    signed x-amz-content-sha256, x-amz-decoded-content-length): an S3Error when one fails;
    the x-amz-checksum-* verified."""
    from quarry.s3gateway import sigv4

    verified = finish()
    content_md5 = request.header("content-md5")
    if content_md5:
        try:
            expected = base64.b64decode(content_md5, validate=True).hex()
        except ValueError:
            raise S3Error(
                "InvalidDigest", "The Content-MD5 you specified was invalid", 400
            ) from None
        if expected != stored.md5:
            raise S3Error(
                "BadDigest", "The Content-MD5 you specified did not match what we received", 400
            )
    claimed = signature.payload_hash if signature is not None else ""
    if sigv4.is_sha256(claimed) and claimed != stored.sha256:
        raise S3Error(
            "XAmzContentSHA256Mismatch",
            "The provided 'x-amz-content-sha256' header does not match what was computed.",
            400,
        )
    declared = request.header("x-amz-decoded-content-length") or ""
    if declared and not _is_count(declared):
        raise invalid_argument("x-amz-decoded-content-length must be a number of bytes")
    if declared and int(declared) != stored.size:
        raise S3Error("IncompleteBody", "the body is shorter than declared", 400)
    return verified


def _read_document(
    ctx: Context, request: Request, signature: Any, *, checksum_is_the_body: bool
) -> bytes:
    """A request's XML document (DeleteObjects, CompleteMultipartUpload), checked as a
    written object's body is (_check_body): the signed x-amz-content-sha256, Content-MD5
    and, when `checksum_is_the_body`, an x-amz-checksum-* (on CompleteMultipartUpload that
    header is the whole object's, not the document's). Safety rule: a document that is not
    the one signed is never acted on — else one signed DeleteObjects seen in transit or in
    a log, replayed with another body, deletes any key as its signer
    (XAmzContentSHA256Mismatch / BadDigest)."""
    if checksum_is_the_body:
        _require_verifiable_body(request, signature)
        read, finish = body_reader(request, ctx, signature)
    else:
        read, finish = request.read, lambda: None
    parts: list[bytes] = []
    total = 0
    while chunk := read(65536):
        total += len(chunk)
        if total > MAX_XML_BODY:
            raise S3Error("EntityTooLarge", "the request body is too large", 400)
        parts.append(chunk)
    document = b"".join(parts)
    digests = uploads.Stored(
        key="",
        size=len(document),
        md5=hashlib.md5(document).hexdigest(),
        sha256=hashlib.sha256(document).hexdigest(),
    )
    _check_body(digests, finish, request, signature)
    return document


def _require_verifiable_body(request: Request, signature: Any) -> None:
    """A DeleteObjects document whose bytes the signature does not cover (UNSIGNED-PAYLOAD,
    an unsigned streaming body) must carry a check the signature does: a signed Content-MD5,
    or an x-amz-checksum-* header (every x-amz-* header is signed) of an algorithm the
    gateway verifies. S3 refuses a DeleteObjects without one too; here, without it, a signed
    request seen once could be resent with another list of keys to delete."""
    from quarry.s3gateway import sigv4

    if signature is None or sigv4.is_sha256(signature.payload_hash):
        return  # auth off, or the payload hash is signed (and checked)
    if request.header("content-md5") and "content-md5" in signature.signed_headers:
        return
    if checksums.verifiable_header(request):
        return
    raise S3Error(
        "InvalidRequest",
        "Missing required header for this request: a signed Content-MD5 or an "
        "x-amz-checksum-crc32, -crc32c, -sha1 or -sha256 (the body is not signed)",
        400,
    )


def _store_body(
    store: BlobStore,
    read: Callable[[int], bytes],
    finish: Finish,
    request: Request,
    signature: Any,
) -> tuple[uploads.Stored, checksums.Claim | None]:
    """Write the body under a fresh key (quarry.uploads); what was written once every check
    on it passed, and the checksum verified. On any failure the bytes written are removed
    and the error raised."""
    verified: list[checksums.Claim | None] = [None]

    def check(stored: uploads.Stored) -> None:
        verified[0] = _check_body(stored, finish, request, signature)

    return uploads.store_stream(store, read, check), verified[0]


def _checksum_of_etag(ctx: Context, request: Request, etag: str) -> str:
    """The checksum an If-Match ETag stands for. A plain MD5 is the checksum itself; a
    derived one (_etag) is the current object's checksum when it is that object's ETag.
    The write is then a compare-and-swap on that checksum (if_match_checksum): an object
    replaced since this read fails it."""
    if re.fullmatch(r"[0-9a-f]{32}", etag):
        return etag
    target = request.target
    try:
        entry = ctx.client.stat_object(target.bucket, target.ref, target.path)
    except errors.NotFound:
        return etag  # nothing there: the write answers NoSuchKey
    return entry.checksum if _etag(entry.checksum).strip('"') == etag else etag


def _write_condition(ctx: Context, request: Request) -> uploads.Condition:
    """The condition a PutObject or CompleteMultipartUpload puts on the key's current
    object: `If-None-Match: *` (no object) or `If-Match: ETAG` (that object), answered 412
    PreconditionFailed when unmet (404 NoSuchKey for If-Match on no object), as S3 does. A
    conditional header the gateway cannot honour is refused, never ignored."""
    none_match = request.header("if-none-match").strip()
    match = request.header("if-match").strip()
    if none_match and match:
        raise invalid_argument("If-Match and If-None-Match exclude each other on a write")
    if none_match:
        if none_match != "*":
            raise not_implemented("If-None-Match on a write other than '*'")
        return uploads.Condition(if_absent=True)
    if match:
        etag = match.removeprefix("W/").strip('"')
        if not etag or etag == "*" or "," in etag:
            raise not_implemented("If-Match on a write other than one ETag")
        return uploads.Condition(if_match_checksum=_checksum_of_etag(ctx, request, etag))
    for header in ("if-modified-since", "if-unmodified-since"):
        if request.header(header):
            raise not_implemented(f"{header} on a write")
    return uploads.NO_CONDITION


def _stage(  # noqa: PLR0913 — one entry's staging: where, what, its bytes, and how
    ctx: Context,
    bucket: str,
    branch: str,
    entry: types_pb2.Entry,
    store: BlobStore,
    key: str,
    condition: uploads.Condition = uploads.NO_CONDITION,
) -> None:
    try:
        uploads.stage(ctx.client, bucket, branch, entry, store, key, ctx.staging, condition)
    except errors.QuarryError as exc:
        raise from_quarry(exc, entry.path) from None


def _check_key_length(request: Request) -> None:
    """KeyTooLongError for a key (REF/PATH) over S3's 1,024 bytes, before anything is read."""
    if len(request.target.key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise S3Error("KeyTooLongError", "Your key is too long", 400, request.target.key[:200])


def put_object(ctx: Context, request: Request, signature: Any) -> Response:
    bucket, ref, path = request.target.bucket, request.target.ref, request.target.path
    _check_key_length(request)
    repo = _repository(ctx, bucket)
    _require_branch(ctx, bucket, ref)
    if not path:
        # A "directory marker" for the branch itself (pyarrow, s3fs make them): the branch
        # exists, so there is nothing to store; an empty body is all it may carry.
        if request.read(1):
            raise invalid_argument("a key is REF/PATH with a non-empty PATH")
        return Response(200, [("etag", _etag(hashlib.md5(b"").hexdigest()))])
    condition = _write_condition(ctx, request)
    read, finish = body_reader(request, ctx, signature)
    metadata = _user_metadata(request)

    def check(stored: uploads.Stored) -> None:
        # Runs once the bytes are stored, before uploads.put builds the entry from
        # `metadata`: the verified checksum is kept with the object.
        verified = _check_body(stored, finish, request, signature)
        # uploads.put records stored.md5 as the entry's checksum.
        checksums.keep(metadata, verified, stored.md5)

    try:
        entry = uploads.put(
            ctx.client,
            repo,
            ref,
            path,
            read,
            ctx.settings,
            content_type=request.header("content-type"),
            metadata=metadata,
            check=check,
            shared=ctx.staging,
            condition=condition,
        )
    except errors.QuarryError as exc:
        raise from_quarry(exc, path) from None
    kept = checksums.stored(entry.metadata, entry.checksum)
    return Response(200, [("etag", _etag(entry.checksum)), *checksums.response_headers(kept)])


@dataclass
class _Source:
    bucket: str
    key: str  # REF/PATH
    entry: types_pb2.Entry


def check_version_id(version_id: str | None) -> None:
    """A repository is an unversioned bucket (a ref's history is Quarry's own): the only
    version of an object is `null`, as S3 answers for such a bucket. Safety rule: a request
    naming another version never acts on the current object instead (a purge of old
    versions deleted the live one, a read of one version got another): InvalidArgument."""
    if version_id is not None and version_id != "null":
        raise invalid_argument("Invalid version id specified")


def _copy_source(ctx: Context, request: Request) -> _Source:
    """The object `x-amz-copy-source` names (BUCKET/REF/PATH, URL-encoded, optionally
    ?versionId=), stat'ed as the caller (their read permission applies): NoSuchKey or
    NoSuchBucket when it is not there."""
    # Cut off `?versionId=` before decoding: a `?` in the key itself arrives as %3F.
    named, _, query = request.header("x-amz-copy-source").partition("?")
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key == "versionId":
            check_version_id(value)
    source = unquote(named).lstrip("/")
    src_bucket, _, src_key = source.partition("/")
    src_ref, _, src_path = src_key.partition("/")
    if not src_bucket or not src_ref or not src_path:
        raise invalid_argument("x-amz-copy-source must be BUCKET/REF/PATH")
    try:
        entry = ctx.client.stat_object(src_bucket, src_ref, src_path)
    except errors.QuarryError as exc:
        if exc.reason == "REPOSITORY_NOT_FOUND":
            raise S3Error(
                "NoSuchBucket", "The specified bucket does not exist", 404, src_bucket
            ) from None
        if exc.code is not None and exc.code.name in ("NOT_FOUND", "INVALID_ARGUMENT"):
            raise no_such_key(src_key) from None
        raise from_quarry(exc, src_key) from None
    return _Source(src_bucket, src_key, entry)


class _RangeReader:
    """`length` bytes of an object (a reader opened on that range), read in pieces, with
    their MD5 (and any other `sums`, hashlib-like, fed as they pass); DataLoss when the
    object ends before the range does."""

    def __init__(self, reader: Any, length: int, address: str, sums: Iterable[Any] = ()) -> None:
        self._reader = reader
        self._left = length
        self._address = address
        self.md5 = hashlib.md5()
        self._sums = (self.md5, *sums)

    def read(self, size: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        piece = self._reader.read(min(size if size > 0 else READ_CHUNK, self._left))
        if not piece:
            raise errors.DataLoss(f"the object at {self._address} ended {self._left} bytes early")
        self._left -= len(piece)
        for summing in self._sums:
            summing.update(piece)
        return piece


def _source_size(ctx: Context, source: _Source) -> int:
    """The size of the object a copy reads: its entry's, else (an entry that records none:
    `quarry put --address` without --size) its local file's; an S3 object of unknown size
    is refused (NotImplemented) -- copying "its first 0 bytes" would be a silent empty copy."""
    entry = source.entry
    if size_recorded(entry.size_bytes, entry.checksum):
        return entry.size_bytes
    stored = _stored_size(ctx, entry, _confine(ctx, source.bucket, entry.physical_address))
    if stored is None:
        raise not_implemented("copying an object whose entry records no size from S3")
    return stored


def _check_copied(source: _Source, md5_hex: str, sha256_hex: str | None) -> None:
    """DATA_LOSS unless the bytes read whole from a source are its entry's, by the checksum
    the entry records when it is a SHA-256 (`sha256_hex` None: verified_chunks checked it as
    they were read) or a plain MD5 (an S3 ETag of one part); other forms are checked by size
    alone, as a GET checks them. A copy never carries an entry's checksum, or a checksum
    computed for the copy, over other bytes."""
    recorded = source.entry.checksum.lower()
    if records_sha256(recorded):
        if sha256_hex is None:
            return
        actual = sha256_hex
    elif re.fullmatch(r"[0-9a-f]{32}", recorded):
        actual = md5_hex
    else:
        return
    if actual != recorded:
        address = source.entry.physical_address
        raise from_quarry(
            ChecksumMismatch(
                f"the object at {address} is not the bytes its entry records ({recorded}): "
                "it changed after the entry was recorded",
                metadata={"physical_address": address},
            )
        )


def _copy_bytes(  # noqa: PLR0913 — what is copied, where to, and what is summed on the way
    ctx: Context,
    source: _Source,
    store: BlobStore,
    key: str,
    first: int,
    length: int,
    sums: Iterable[Any] = (),
) -> tuple[str, str]:
    """Write `length` bytes of the source object from `first` on under `key` (a fresh key of
    `store`), feeding them to `sums` too; their (MD5, SHA-256) hex. A whole object's bytes
    are checked against the source's entry as a GET checks them: its size (a local file's
    before any byte; any object's by a byte past it), then _check_copied. On failure
    nothing stays under `key`."""
    entry = source.entry
    whole = size_recorded(entry.size_bytes, entry.checksum) and (first, length) == (
        0,
        entry.size_bytes,
    )
    try:
        address = entry.physical_address
        confine = _confine(ctx, source.bucket, address)
        opened = (
            open_object(address, ctx.settings, confine=confine)
            if whole
            else open_object(address, ctx.settings, first, length, confine)
        )
        with opened as reader:
            if whole:
                check_stored_size(reader, address, entry.size_bytes, entry.checksum)
            ranged = _RangeReader(reader, length, address, sums)
            written = store.put_stream(key, ranged)
            if whole and reader.read(1):
                raise ObjectChanged(
                    f"the object at {address} has more than the {entry.size_bytes} bytes its "
                    "entry records: it changed after the entry was recorded",
                    metadata={"physical_address": address},
                )
        if whole:
            _check_copied(source, ranged.md5.hexdigest(), written.sha256)
    except ObjectNotFound:
        uploads.discard(store, key)
        raise S3Error("NoSuchKey", "the source object's bytes are missing", 404) from None
    except errors.QuarryError as exc:
        uploads.discard(store, key)
        raise from_quarry(exc) from None
    except BaseException:
        uploads.discard(store, key)
        raise
    return ranged.md5.hexdigest(), written.sha256


def _summed_source(
    ctx: Context, source: _Source, computing: checksums.Computing
) -> checksums.Claim:
    """The source object's checksum `computing` computes, from its bytes read whole and
    checked against its entry (verified_chunks: size, SHA-256; _check_copied: a plain MD5)."""
    entry = source.entry
    if not size_recorded(entry.size_bytes, entry.checksum):
        raise S3Error(
            "InvalidRequest",
            "the source object's entry records no size or checksum: its checksum cannot be "
            "bound to its bytes",
            400,
        )
    md5 = hashlib.md5()
    confine = _confine(ctx, source.bucket, entry.physical_address)
    reader, close = _enter(open_object(entry.physical_address, ctx.settings, confine=confine))
    try:
        for piece in verified_chunks(
            reader, entry.physical_address, entry.size_bytes, entry.checksum
        ):
            computing.update(piece)
            md5.update(piece)
    except errors.QuarryError as exc:
        raise from_quarry(exc) from None
    finally:
        close()
    _check_copied(source, md5.hexdigest(), None)
    return computing.claim()


def copy_object(ctx: Context, request: Request) -> Response:
    """CopyObject from any ref to a branch. Within one repository: a new entry pointing at
    the same bytes (copy-on-write: objects are immutable). From another repository: the
    bytes are copied into this repository's namespace first (namespaces are per repository:
    an entry never points into another repository's namespace, whose GC would not know of
    it). Metadata copied or replaced (x-amz-metadata-directive). The source's kept checksum
    stays with the copy (the same bytes); x-amz-checksum-algorithm asks for one in another
    algorithm, computed from the source's bytes (read whole and checked against its entry)."""
    bucket, ref, path = request.target.bucket, request.target.ref, request.target.path
    if not path:
        raise invalid_argument("a key is REF/PATH with a non-empty PATH")
    _check_key_length(request)
    condition = _write_condition(ctx, request)
    directive = request.header("x-amz-metadata-directive") or "COPY"
    if directive not in ("COPY", "REPLACE"):
        raise invalid_argument("x-amz-metadata-directive must be COPY or REPLACE")
    algorithm = checksums.requested(request)
    repo = _repository(ctx, bucket)
    _require_branch(ctx, bucket, ref)
    source = _copy_source(ctx, request)
    if directive == "COPY" and (source.bucket, source.key) == (bucket, request.target.key):
        raise S3Error(
            "InvalidRequest",
            "This copy request is illegal because it is trying to copy an object to itself "
            "without changing the object's metadata.",
            400,
        )
    _copy_preconditions(request, source)
    entry = types_pb2.Entry()
    entry.CopyFrom(source.entry)
    entry.path = path
    entry.mtime.CopyFrom(_timestamp(time.time()))
    if directive == "REPLACE":
        entry.ClearField("metadata")
        entry.metadata.update(_user_metadata(request))
        # As a PUT: what the request says, else the default (never the source's).
        entry.content_type = request.header("content-type") or "application/octet-stream"
    kept = checksums.stored(source.entry.metadata, source.entry.checksum)
    computing = None
    if algorithm is not None and (kept is None or kept.algorithm != algorithm):
        computing = checksums.Computing(algorithm)
    if source.bucket == bucket:
        if computing is not None:
            kept = _summed_source(ctx, source, computing)
        checksums.keep(entry.metadata, kept, entry.checksum)
        _call(
            ctx.client.put_object,
            bucket,
            ref,
            entry,
            if_absent=condition.if_absent,
            if_match_checksum=condition.if_match_checksum,
            resource=path,
        )
    else:
        store = open_blob_store(repo.storage_namespace, ctx.settings)
        try:
            key = new_upload_key()
            size = _source_size(ctx, source)
            sums = () if computing is None else (computing,)
            _md5, sha256 = _copy_bytes(ctx, source, store, key, 0, size, sums)
            if computing is not None:
                kept = computing.claim()
            entry.physical_address = object_address(repo.storage_namespace, key)
            entry.size_bytes = size
            if not entry.checksum:  # a source of unknown size: the copy's own bytes name it
                entry.checksum = sha256
            checksums.keep(entry.metadata, kept, entry.checksum)
            _stage(ctx, bucket, ref, entry, store, key, condition)
        finally:
            store.close()
    return xml_response(
        xmlserde.document(
            "CopyObjectResult",
            [
                ("LastModified", xmlserde.timestamp(_mtime(entry))),
                ("ETag", _etag(entry.checksum)),
                *checksums.result_elements(checksums.stored(entry.metadata, entry.checksum)),
            ],
        )
    )


def _refuse_delete_conditions(request: Request) -> None:
    """A conditional delete (If-Match, or a DeleteObjects <ETag>) is not built: refused,
    never ignored (the object would go whatever its ETag)."""
    if request.header("if-match") or request.header("x-amz-if-match-size"):
        raise not_implemented("a conditional delete (If-Match)")


def delete_object(ctx: Context, request: Request) -> Response:
    bucket, ref, path = request.target.bucket, request.target.ref, request.target.path
    _refuse_delete_conditions(request)
    _repository(ctx, bucket)
    _require_branch(ctx, bucket, ref)
    if path:
        try:
            ctx.client.delete_object(bucket, ref, path)
        except errors.QuarryError as exc:
            # S3 answers 204 for a key that does not exist.
            if not (exc.code is not None and exc.code.name == "NOT_FOUND"):
                raise from_quarry(exc, path) from None
    return Response(204)


def _delete_keys(ctx: Context, bucket: str, branch: str, keys: list[str]) -> dict[str, S3Error]:
    """Delete `keys` (BRANCH/PATH) of one branch in one call; the S3 error of each key that
    was not deleted. When branch-manager refuses the call (a Deny on one of the paths, one
    invalid path), each key is sent again alone, so each gets the answer it would have got
    by itself and the others are deleted, as S3 does (a delete is idempotent: sending one
    again is safe whatever the first call did)."""

    def delete(group: list[str]) -> None:
        paths = [key.partition("/")[2] for key in group]
        ctx.client.delete_objects(bucket, branch, [path for path in paths if path])

    try:
        delete(keys)
        return {}
    except errors.QuarryError as exc:
        if len(keys) == 1:
            return {keys[0]: from_quarry(exc, keys[0])}
    failures = {}
    for key in keys:
        try:
            delete([key])
        except errors.QuarryError as exc:
            failures[key] = from_quarry(exc, key)
    return failures


def delete_objects(ctx: Context, request: Request, signature: Any) -> Response:
    bucket = request.target.bucket
    body = _read_document(ctx, request, signature, checksum_is_the_body=True)
    document = xmlserde.parse(body, "Delete")
    quiet = xmlserde.text(document, "Quiet").lower() == "true"
    objects = xmlserde.children(document, "Object")
    keys = [xmlserde.text(o, "Key") for o in objects]
    for o in objects:  # before anything is deleted
        if xmlserde.children(o, "VersionId"):
            check_version_id(xmlserde.text(o, "VersionId"))
    _refuse_delete_conditions(request)
    if any(xmlserde.text(o, "ETag") for o in objects):
        raise not_implemented("a conditional delete (an <ETag> in DeleteObjects)")
    if len(keys) > 1000:
        raise S3Error("MalformedXML", "at most 1000 keys per DeleteObjects", 400)
    _repository(ctx, bucket)
    by_branch: dict[str, list[str]] = {}
    results: list[tuple[str, Any]] = []
    for key in keys:
        ref, _, path = key.partition("/")
        by_branch.setdefault(ref, []).append(key)
    for ref, group in by_branch.items():
        try:
            _require_branch(ctx, bucket, ref)
        except (S3Error, errors.QuarryError) as exc:
            failure = exc if isinstance(exc, S3Error) else from_quarry(exc)
            failures = dict.fromkeys(group, failure)
        else:
            failures = _delete_keys(ctx, bucket, ref, group)
        for key in group:
            if key in failures:
                error = failures[key]
                results.append(
                    ("Error", [[("Key", key), ("Code", error.code), ("Message", error.message)]])
                )
            elif not quiet:
                results.append(("Deleted", [[("Key", key)]]))
    return xml_response(xmlserde.document("DeleteResult", results))


# ---- multipart uploads --------------------------------------------------------------------
#
# State lives in the repository's namespace (the gateway keeps none): MULTIPART_PREFIX +
# UPLOAD_ID + "/upload.json" (key, owner, content type, metadata) and one object per part
# "part-NNNNN-MD5-SEQUENCE" (SEQUENCE: upload time in ns, then a uuid; the latest upload of a
# number is the part, see _write_part). Nothing is staged before Complete; Complete writes the parts,
# concatenated, to one new data object, stages its entry, then removes the parts.


# What a successful Complete leaves in its upload's directory (key, owner, parts, ETag), so a
# retry of it gets the same answer; the sweep of abandoned uploads removes it with the
# directory after QUARRY_S3_GATEWAY_MULTIPART_EXPIRY_SECONDS.
COMPLETED_RECORD = "completed.json"


def _upload_dir(upload_id: str) -> str:
    if not upload_id or not all(c in "0123456789abcdef" for c in upload_id) or len(upload_id) != 32:
        raise S3Error("NoSuchUpload", "The specified upload does not exist.", 404)
    return f"{MULTIPART_PREFIX}{upload_id}/"


def _load_upload(
    ctx: Context, store: BlobStore, request: Request, upload_id: str
) -> dict[str, Any]:
    """The upload's record; NoSuchUpload unless it exists for this key, AccessDenied unless
    the caller started it."""
    try:
        record = json.loads(store.get(_upload_dir(upload_id) + "upload.json"))
    except ObjectNotFound:
        raise S3Error("NoSuchUpload", "The specified upload does not exist.", 404) from None
    if record["key"] != request.target.key:
        raise S3Error("NoSuchUpload", "The specified upload does not exist.", 404)
    if record["owner"] != ctx.user_id:
        raise access_denied("the upload belongs to another user")
    return record


def _check_write(ctx: Context, request: Request) -> None:
    """fs:WriteObject on the key (AccessDenied otherwise) before a multipart upload stores
    anything: its parts are written to the repository's namespace long before the staging
    call that would check it (a read-only user could fill the storage with parts)."""
    if ctx.authenticated:
        bucket, path = request.target.bucket, request.target.path
        _call(ctx.client.check_permission, WRITE_OBJECT, object_arn(bucket, path), resource=path)


def create_multipart_upload(ctx: Context, request: Request) -> Response:
    bucket, ref, path = request.target.bucket, request.target.ref, request.target.path
    _check_key_length(request)
    if not path:
        raise invalid_argument("a key is REF/PATH with a non-empty PATH")
    repo = _repository(ctx, bucket)
    _require_branch(ctx, bucket, ref)
    _check_write(ctx, request)
    upload_id = uuid.uuid4().hex
    record = {
        "key": request.target.key,
        "owner": ctx.user_id,
        "content_type": request.header("content-type") or "application/octet-stream",
        "metadata": _user_metadata(request),
        "initiated": time.time(),
    }
    with open_blob_store(repo.storage_namespace, ctx.settings) as store:
        store.put(
            _upload_dir(upload_id) + "upload.json", json.dumps(record).encode(), if_absent=True
        )
    return xml_response(
        xmlserde.document(
            "InitiateMultipartUploadResult",
            [("Bucket", bucket), ("Key", request.target.key), ("UploadId", upload_id)],
        )
    )


def _part_number(request: Request) -> int:
    try:
        number = int(request.param("partNumber") or "")
    except ValueError:
        raise invalid_argument("partNumber must be an integer") from None
    if not 1 <= number <= MAX_PARTS:
        raise invalid_argument("Part number must be an integer between 1 and 10000, inclusive")
    return number


def upload_part(ctx: Context, request: Request, signature: Any) -> Response:
    repo = _repository(ctx, request.target.bucket)
    upload_id = request.param("uploadId") or ""
    number = _part_number(request)
    read, finish = body_reader(request, ctx, signature)
    with open_blob_store(repo.storage_namespace, ctx.settings) as store:
        _load_upload(ctx, store, request, upload_id)
        _check_write(ctx, request)  # again: the permission may have gone since Create
        stored, verified = _store_body(store, read, finish, request, signature)
        key, md5_hex = stored.key, stored.md5
        # The part under its number and MD5 (what Complete names it by); the temporary key's
        # bytes are moved by writing the part name once (no rename in the store API).
        try:
            with store.open_read(key) as reader:
                _write_part(store, upload_id, number, md5_hex, reader)
        finally:
            uploads.discard(store, key)
    # The part's checksum is answered (an SDK names it again in Complete), not kept: a
    # multipart object has no whole-object checksum here (README: S3 gateway).
    return Response(200, [("etag", _etag(md5_hex)), *checksums.response_headers(verified)[:1]])


def _copy_range(request: Request, size: int) -> tuple[int, int]:
    """(first, length) of x-amz-copy-source-range (`bytes=FIRST-LAST`, both given, as S3
    requires), or the whole source; InvalidRange outside the source."""
    header = request.header("x-amz-copy-source-range")
    if not header:
        return 0, size
    first_text, sep, last_text = header.removeprefix("bytes=").partition("-")
    try:
        if not header.startswith("bytes=") or not sep:
            raise ValueError
        first, last = int(first_text), int(last_text)
    except ValueError:
        raise invalid_argument("x-amz-copy-source-range must be bytes=FIRST-LAST") from None
    if first < 0 or last < first or last >= size:
        raise S3Error("InvalidRange", "The requested range is not satisfiable", 416)
    return first, last - first + 1


def upload_part_copy(ctx: Context, request: Request) -> Response:
    """UploadPartCopy: a part made of (a byte range of) an existing object, read as the
    caller from any ref of any repository, written as a part of this upload (bytes copied:
    a part is never a reference to another object)."""
    repo = _repository(ctx, request.target.bucket)
    upload_id = request.param("uploadId") or ""
    number = _part_number(request)
    with open_blob_store(repo.storage_namespace, ctx.settings) as store:
        _load_upload(ctx, store, request, upload_id)
        _check_write(ctx, request)
        source = _copy_source(ctx, request)
        _copy_preconditions(request, source)
        first, length = _copy_range(request, _source_size(ctx, source))
        key = new_upload_key()
        md5_hex, _sha256 = _copy_bytes(ctx, source, store, key, first, length)
        try:
            with store.open_read(key) as reader:
                _write_part(store, upload_id, number, md5_hex, reader)
        finally:
            uploads.discard(store, key)
    return xml_response(
        xmlserde.document(
            "CopyPartResult",
            [("LastModified", xmlserde.timestamp(time.time())), ("ETag", _etag(md5_hex))],
        )
    )


@dataclass(frozen=True)
class _Part:
    md5: str
    key: str
    size: int
    modified: float


def _part_sequence(piece: str) -> tuple[bool, str]:
    """The order of a part file among the uploads of one part number: the later upload
    wins, as in S3. A part's name ends in its upload time (ns, zero-padded) and a random
    suffix; a name from before that ordering (a bare uuid) counts as the oldest."""
    return (len(piece) == _PART_SEQUENCE_LENGTH, piece)


_PART_SEQUENCE_LENGTH = 20 + 32


def _write_part(store: BlobStore, upload_id: str, number: int, md5_hex: str, reader: Any) -> None:
    """Store part `number` of an upload from `reader`, then remove the earlier uploads of
    that number. Safety rule: only part files of this number ordered before the one just
    written are removed, so two uploads of one number racing each other leave the later
    one, never neither."""
    directory = _upload_dir(upload_id)
    sequence = f"{time.time_ns():020d}{uuid.uuid4().hex}"
    store.put_stream(f"{directory}part-{number:05d}-{md5_hex}-{sequence}", reader)
    for _number, other_sequence, other in list(_part_files(store, upload_id, number)):
        if _part_sequence(other_sequence) < _part_sequence(sequence):
            uploads.discard(store, other.key)


def _part_files(
    store: BlobStore, upload_id: str, number: int | None = None
) -> Iterator[tuple[int, str, _Part]]:
    """(number, sequence, part) of every part file of the upload (of part `number` only
    when given: one listing of that number's files, not of every part), superseded or
    not."""
    directory = _upload_dir(upload_id)
    prefix = "part-" if number is None else f"part-{number:05d}-"
    for info in store.list(directory + prefix):
        name = (
            info.key[len(directory) :]
            if info.key.startswith(directory)
            else info.key.rpartition("/")[2]
        )
        pieces = name.split("-")
        if len(pieces) != 4 or not _is_count(pieces[1]):
            continue
        key = info.key if info.key.startswith(directory) else directory + name
        yield int(pieces[1]), pieces[3], _Part(pieces[2], key, info.size, info.modified)


def _parts(store: BlobStore, upload_id: str) -> dict[int, _Part]:
    """number -> the upload's latest part of that number (an earlier upload of a number is
    superseded, as in S3: neither listed nor accepted by Complete)."""
    latest: dict[int, tuple[tuple[bool, str], _Part]] = {}
    for number, sequence, part in _part_files(store, upload_id):
        order = _part_sequence(sequence)
        if number not in latest or latest[number][0] < order:
            latest[number] = (order, part)
    return {number: part for number, (_order, part) in latest.items()}


def _listed_part_number(text: str) -> int:
    """A <PartNumber> of a CompleteMultipartUpload: MalformedXML unless an integer."""
    if not _is_count(text.strip()):
        raise S3Error("MalformedXML", f"PartNumber {text!r} is not a positive integer", 400)
    return int(text)


def complete_multipart_upload(ctx: Context, request: Request, signature: Any) -> Response:
    bucket, ref, path = request.target.bucket, request.target.ref, request.target.path
    upload_id = request.param("uploadId") or ""
    body = _read_document(ctx, request, signature, checksum_is_the_body=False)
    document = xmlserde.parse(body, "CompleteMultipartUpload")
    listed = xmlserde.children(document, "Part")
    wanted = [
        (_listed_part_number(xmlserde.text(p, "PartNumber")), xmlserde.text(p, "ETag").strip('"'))
        for p in listed
    ]
    # The checksum each part is named with, and the whole object's (its x-amz-checksum-*
    # header): verified as the parts are joined, before anything is staged.
    part_claims = [
        checksums.listed({tag: xmlserde.text(p, tag) for tag in checksums.PART_ELEMENTS})
        for p in listed
    ]
    whole_claim = checksums.claimed(request, chunked=False)
    composite = request.header("x-amz-checksum-type").strip().upper() == "COMPOSITE"
    if whole_claim is not None and (composite or "-" in (whole_claim.value or "")):
        whole_claim = None  # a COMPOSITE value (a checksum of the parts'): not the body's
    if not wanted:
        raise S3Error("MalformedXML", "a CompleteMultipartUpload names at least one part", 400)
    if [n for n, _ in wanted] != sorted({n for n, _ in wanted}):
        raise S3Error("InvalidPartOrder", "The list of parts was not in ascending order.", 400)
    condition = _write_condition(ctx, request)
    repo = _repository(ctx, bucket)
    _require_branch(ctx, bucket, ref)
    with open_blob_store(repo.storage_namespace, ctx.settings) as store:
        try:
            record = _load_upload(ctx, store, request, upload_id)
        except S3Error as missing:
            if missing.code != "NoSuchUpload":
                raise
            # A retry of a Complete that succeeded (its answer lost): the same answer.
            done = _completed(ctx, store, request, upload_id, wanted)
            if done is None:
                raise
            return _completed_answer(bucket, request.target.key, done["etag"])
        stored = _parts(store, upload_id)
        keys = []
        for number, etag in wanted:
            part = stored.get(number)
            if part is None or part.md5 != etag:
                raise S3Error(
                    "InvalidPart", f"part {number} with ETag {etag} was not uploaded", 400
                )
            keys.append(part.key)
        digest = hashlib.md5()
        for _, etag in wanted:
            digest.update(bytes.fromhex(etag))
        final_etag = f"{digest.hexdigest()}-{len(wanted)}"

        joined = _JoinedParts(store, keys, part_claims, whole_claim)
        key = new_upload_key()
        try:
            written = store.put_stream(key, joined)
            joined.verify([number for number, _ in wanted])
        except ObjectNotFound:
            # A part went while it was read: the upload was aborted (or swept) meanwhile.
            uploads.discard(store, key)
            raise S3Error("NoSuchUpload", "The specified upload does not exist.", 404) from None
        except BaseException:
            uploads.discard(store, key)
            raise
        entry = types_pb2.Entry(
            path=path,
            physical_address=object_address(repo.storage_namespace, key),
            size_bytes=written.size,
            checksum=final_etag,
            content_type=record["content_type"],
            metadata=record["metadata"],
        )
        if joined.whole is not None and joined.whole.verifies:
            # A whole-object (FULL_OBJECT) checksum verified here is kept, as a PUT's is.
            checksums.keep(entry.metadata, joined.whole.claim, final_etag)
        entry.mtime.CopyFrom(_timestamp(time.time()))
        _stage(ctx, bucket, ref, entry, store, key, condition)
        completed = {
            "key": record["key"],
            "owner": record["owner"],
            "parts": [[number, etag] for number, etag in wanted],
            "etag": final_etag,
        }
        store.put(_upload_dir(upload_id) + COMPLETED_RECORD, json.dumps(completed).encode())
        _remove_upload(store, upload_id, keep=COMPLETED_RECORD)
    return _completed_answer(bucket, request.target.key, final_etag)


class _JoinedParts:
    """The parts of an upload read one after another (a file-like `read` for put_stream),
    each part's named checksum and the whole object's computed as they pass."""

    def __init__(
        self,
        store: BlobStore,
        keys: list[str],
        part_claims: list[checksums.Claim | None],
        whole_claim: checksums.Claim | None,
    ) -> None:
        self._store = store
        self._keys = list(keys)
        self.parts = [None if c is None else checksums.Expected(c) for c in part_claims]
        self.whole = None if whole_claim is None else checksums.Expected(whole_claim)
        self._index = -1
        self._reader: Any = None

    def read(self, size: int = -1) -> bytes:
        while True:
            if self._reader is None:
                if self._index + 1 >= len(self._keys):
                    return b""
                self._index += 1
                self._reader = self._store.open_read(self._keys[self._index])
            data = self._reader.read(size if size > 0 else READ_CHUNK)
            if data:
                part = self.parts[self._index]
                if part is not None:
                    part.update(data)
                if self.whole is not None:
                    self.whole.update(data)
                return data
            self._reader.close()
            self._reader = None

    def verify(self, numbers: list[int]) -> None:
        """InvalidPart for a part whose bytes are not the checksum it was named with;
        BadDigest when the whole object's x-amz-checksum-* does not match."""
        for number, part in zip(numbers, self.parts, strict=True):
            if part is not None and not part.matches():
                raise S3Error(
                    "InvalidPart",
                    f"part {number}'s {part.claim.algorithm.upper()} is not the one uploaded",
                    400,
                )
        if self.whole is not None and not self.whole.matches():
            raise S3Error(
                "BadDigest",
                f"The {self.whole.claim.algorithm.upper()} you specified did not match the "
                "calculated checksum.",
                400,
            )


def _completed_answer(bucket: str, key: str, etag: str) -> Response:
    return xml_response(
        xmlserde.document(
            "CompleteMultipartUploadResult",
            [
                ("Location", f"/{bucket}/{key}"),
                ("Bucket", bucket),
                ("Key", key),
                ("ETag", _etag(etag)),
            ],
        )
    )


def _completed(
    ctx: Context, store: BlobStore, request: Request, upload_id: str, wanted: list[Any]
) -> dict[str, Any] | None:
    """The record a successful Complete left (COMPLETED_RECORD) when this request repeats
    it: the same key, caller and parts. S3 answers such a retry (an SDK's, after a lost
    answer) with the first one's result; NoSuchUpload made it report a failed upload whose
    object was staged. Anything else about a finished upload stays NoSuchUpload."""
    try:
        done = json.loads(store.get(_upload_dir(upload_id) + COMPLETED_RECORD))
    except (ObjectNotFound, ValueError):
        return None
    same_parts = [tuple(p) for p in done.get("parts", [])] == [tuple(p) for p in wanted]
    if done.get("key") != request.target.key or done.get("owner") != ctx.user_id:
        return None
    return done if same_parts else None


def _remove_upload(store: BlobStore, upload_id: str, keep: str = "") -> None:
    """The upload's record and parts removed (and, unless it is `keep`, the record of its
    completion)."""
    directory = _upload_dir(upload_id)
    # Its record first: a Complete racing this one (a client's retry) then finds no upload
    # (NoSuchUpload, or its completion's answer), never an upload whose parts are half gone
    # (InvalidPart).
    uploads.discard(store, directory + "upload.json")
    for info in list(store.list(directory)):
        key = (
            info.key if info.key.startswith(directory) else directory + info.key.rpartition("/")[2]
        )
        if keep and key == directory + keep:
            continue
        uploads.discard(store, key)
    if not keep:
        store.remove_empty_folder(directory)  # a local namespace keeps no empty folder per upload


def sweep_abandoned_uploads(store: BlobStore, expiry_seconds: float, now: float) -> list[str]:
    """Remove the multipart uploads of `store`'s namespace that nothing was written to for
    `expiry_seconds` (QUARRY_S3_GATEWAY_MULTIPART_EXPIRY_SECONDS): neither their record nor
    any part. The ids removed.

    Safety rules: only keys under MULTIPART_PREFIX + a well-formed upload id are ever
    deleted, never a completed object's data (Complete writes it under data/, elsewhere); an
    upload written to within `expiry_seconds` (its record or any part) is in progress and
    left whole, and it is looked at again just before removal, so a part that arrived since
    the listing keeps it. A part that arrives during the removal itself (an upload idle for
    the whole expiry, resumed at that instant) is lost with its upload: Complete then
    answers NoSuchUpload or InvalidPart, never a wrong object."""
    if expiry_seconds <= 0:
        return []

    def newest_by_upload(prefix: str) -> dict[str, float]:
        newest: dict[str, float] = {}
        for info in store.list(prefix):
            upload_id = info.key[len(MULTIPART_PREFIX) :].partition("/")[0]
            newest[upload_id] = max(newest.get(upload_id, 0.0), info.modified)
        return newest

    removed = []
    for upload_id, newest in sorted(newest_by_upload(MULTIPART_PREFIX).items()):
        try:
            directory = _upload_dir(upload_id)
        except S3Error:
            continue  # not an upload this gateway made: never touched
        if now - newest < expiry_seconds:
            continue
        again = newest_by_upload(directory).get(upload_id, 0.0)
        if now - again < expiry_seconds:
            continue
        _remove_upload(store, upload_id)
        removed.append(upload_id)
    if removed:
        log.info("removed %d abandoned multipart upload(s): %s", len(removed), removed)
    return removed


class AbandonedUploadSweeper:
    """The gateway's background sweep of abandoned multipart uploads: `sweep()` is the step
    of a PeriodicWorker (services/s3_gateway) run every
    QUARRY_S3_GATEWAY_MULTIPART_SWEEP_SECONDS. Each pass lists the repositories (as the
    gateway's own service principal) and sweeps each one's namespace with
    sweep_abandoned_uploads at `clock()`: one listing of `_s3_multipart/` per repository,
    removals only where uploads are pending. An upload abandoned in a repository that gets
    no further multipart call is removed all the same.

    Safety rules (sweep_abandoned_uploads'): an in-progress upload, i.e. one whose record
    or any part was written within `expiry_seconds` of `clock()`, is never touched; only
    keys under MULTIPART_PREFIX + a well-formed upload id are ever deleted (never a
    completed object's data). A repository whose namespace cannot be swept is logged and
    skipped; the pass goes on with the others."""

    def __init__(
        self,
        repositories: Callable[[], Iterable[types_pb2.Repository]],
        settings: Any,
        expiry_seconds: float,
        clock: Callable[[], float] = time.time,
        open_store: Callable[[str, Any], BlobStore] = open_blob_store,
    ) -> None:
        self._repositories = repositories
        self._settings = settings
        self._expiry = expiry_seconds
        self._clock = clock
        self._open = open_store

    def sweep(self) -> dict[str, list[str]]:
        """One pass over every repository: the upload ids removed, by repository."""
        removed: dict[str, list[str]] = {}
        for repo in self._repositories():
            kind, where, _prefix = parse_storage_namespace(repo.storage_namespace)
            if kind == "local" and not os.path.isdir(where):
                continue  # no upload there; opening a local store would create its directory
            try:
                with self._open(repo.storage_namespace, self._settings) as store:
                    gone = sweep_abandoned_uploads(store, self._expiry, self._clock())
            except Exception:
                log.warning(
                    "sweeping abandoned multipart uploads of %s failed",
                    repo.name,
                    exc_info=True,
                )
                continue
            if gone:
                removed[repo.name] = gone
        return removed


def abort_multipart_upload(ctx: Context, request: Request) -> Response:
    repo = _repository(ctx, request.target.bucket)
    upload_id = request.param("uploadId") or ""
    with open_blob_store(repo.storage_namespace, ctx.settings) as store:
        _load_upload(ctx, store, request, upload_id)
        _remove_upload(store, upload_id)
    return Response(204)


def list_parts(ctx: Context, request: Request) -> Response:
    repo = _repository(ctx, request.target.bucket)
    upload_id = request.param("uploadId") or ""
    with open_blob_store(repo.storage_namespace, ctx.settings) as store:
        _load_upload(ctx, store, request, upload_id)
        stored = sorted(_parts(store, upload_id).items())
    max_parts = _count_param(request, "max-parts", MAX_PARTS)
    marker = _count_param(request, "part-number-marker", 0)
    after = [(number, part) for number, part in stored if number > marker]
    page = after[:max_parts]
    truncated = len(after) > len(page)
    parts = [
        [
            ("PartNumber", number),
            ("LastModified", xmlserde.timestamp(part.modified)),
            ("ETag", _etag(part.md5)),
            ("Size", part.size),
        ]
        for number, part in page
    ]
    return xml_response(
        xmlserde.document(
            "ListPartsResult",
            [
                ("Bucket", request.target.bucket),
                ("Key", request.target.key),
                ("UploadId", upload_id),
                ("PartNumberMarker", marker),
                ("NextPartNumberMarker", page[-1][0] if truncated else None),
                ("MaxParts", max_parts),
                ("IsTruncated", truncated),
                ("Part", parts),
            ],
        )
    )


def _count_param(request: Request, name: str, default: int) -> int:
    """A non-negative integer query parameter (`default` when absent), capped at MAX_PARTS;
    InvalidArgument otherwise."""
    text = request.param(name)
    if text is None:
        return default
    if not _is_count(text):
        raise invalid_argument(f"{name} must be a non-negative integer")
    return min(int(text), MAX_PARTS)


def list_multipart_uploads(ctx: Context, request: Request) -> Response:
    """The caller's uploads in progress, by key then upload id, with S3's paging
    (`max-uploads`, `key-marker` / `upload-id-marker`, NextKeyMarker / NextUploadIdMarker)
    and `prefix` / `delimiter` grouping (a common prefix counts as one item of a page)."""
    repo = _repository(ctx, request.target.bucket)
    prefix = request.param("prefix") or ""
    delimiter = request.param("delimiter") or ""
    key_marker = request.param("key-marker") or ""
    id_marker = request.param("upload-id-marker") or ""
    max_uploads = min(_count_param(request, "max-uploads", 1000), 1000)
    found: list[tuple[str, str, float]] = []
    with open_blob_store(repo.storage_namespace, ctx.settings) as store:
        for info in store.list(MULTIPART_PREFIX):
            if not info.key.endswith("/upload.json"):
                continue
            upload_id = info.key.rstrip("/").split("/")[-2]
            try:
                record = json.loads(store.get(_upload_dir(upload_id) + "upload.json"))
            except (ObjectNotFound, S3Error, ValueError):
                continue
            if record.get("owner") != ctx.user_id or not record["key"].startswith(prefix):
                continue
            found.append((record["key"], upload_id, record["initiated"]))
    found.sort()

    def after_markers(key: str, upload_id: str) -> bool:
        if not key_marker:
            return True
        if id_marker:  # the rest of the marker key's uploads, then later keys
            return key > key_marker or (key == key_marker and upload_id > id_marker)
        return key > key_marker

    uploads: list[tuple[str, str, float]] = []
    common: list[str] = []
    last: tuple[str, str] = ("", "")
    truncated = False
    for key, upload_id, initiated in found:
        if not after_markers(key, upload_id):
            continue
        grouped = ""
        if delimiter:
            cut = key.find(delimiter, len(prefix))
            grouped = key[: cut + len(delimiter)] if cut >= 0 else ""
        if grouped and (grouped in common or grouped <= key_marker):
            continue
        if len(uploads) + len(common) >= max_uploads:
            # Asked for none (max-uploads=0): nothing to page through, as ListObjectsV2's
            # max-keys=0 answers; else there is more after this page.
            truncated = max_uploads > 0
            break
        if grouped:
            common.append(grouped)
            last = (grouped, "")
        else:
            uploads.append((key, upload_id, initiated))
            last = (key, upload_id)
    listed = [
        [("Key", key), ("UploadId", upload_id), ("Initiated", xmlserde.timestamp(initiated))]
        for key, upload_id, initiated in uploads
    ]
    return xml_response(
        xmlserde.document(
            "ListMultipartUploadsResult",
            [
                ("Bucket", request.target.bucket),
                ("KeyMarker", key_marker),
                ("UploadIdMarker", id_marker),
                ("NextKeyMarker", last[0] if truncated else None),
                ("NextUploadIdMarker", last[1] if truncated and last[1] else None),
                ("Delimiter", delimiter or None),
                ("Prefix", prefix),
                ("MaxUploads", max_uploads),
                ("IsTruncated", truncated),
                ("Upload", listed),
                ("CommonPrefixes", [[("Prefix", p)] for p in common]),
            ],
        )
    )
