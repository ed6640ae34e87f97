"""The gateway's ASGI application: one request -> authenticate (SigV4 via Auth/
VerifySignature) -> route to its operation -> stream the answer.

Operations are synchronous code (gRPC calls, blob-store I/O); each request runs on a worker
thread of the gateway's own pool, reading the request body from the ASGI server in pieces
and sending the answer in pieces through the event loop (the `_Bridge`), so a body is never
held whole: memory per request is a few MiB whatever the object's size.

Per request: one trace span (S3 <operation>, the gRPC calls its children; in the caller's
trace when the request carries a W3C traceparent header), one log line with
the S3 request id, and the quarry_s3_requests_total / quarry_s3_request_seconds metrics by
operation and status.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import grpc
from opentelemetry import propagate
from opentelemetry.trace import SpanKind
from prometheus_client import Counter, Histogram

from quarry import errors, telemetry, uploads
from quarry.asgi import BodyReader, ClientGone, serves_http
from quarry.lru import TTLCache
from quarry.s3gateway import operations as ops
from quarry.s3gateway import sigv4, xmlserde
from quarry.s3gateway.errors import S3Error, access_denied, not_implemented
from quarry.s3gateway.paths import resolve
from quarry.s3gateway.request import Request, Response
from quarry.s3gateway.verifier import SignatureVerifier

log = logging.getLogger("quarry.s3gateway")

REQUESTS = Counter(
    "quarry_s3_requests_total",
    "S3 gateway requests by operation and HTTP status",
    ["operation", "status"],
)
LATENCY = Histogram(
    "quarry_s3_request_seconds", "S3 gateway request latency by operation", ["operation"]
)
STAGING_CALLS = Counter(
    "quarry_s3_staging_calls_total",
    "Staging calls the S3 gateway made for its writes (PutObject, or PutObjects for writes "
    "that shared a call: quarry_s3_staged_entries_total / this is the mean batch)",
)
STAGED_ENTRIES = Counter(
    "quarry_s3_staged_entries_total", "Entries the S3 gateway's staging calls carried"
)


def _observe_staging(entries: int) -> None:
    STAGING_CALLS.inc()
    STAGED_ENTRIES.inc(entries)


def _content_length(headers: list[tuple[str, str]]) -> int | None:
    for name, value in headers:
        if name == "content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


@dataclass
class Gateway:
    """What the application needs: settings, the channels to branch-manager and committer,
    the Auth stub carrying the gateway's service token (None when auth is off)."""

    settings: Any
    branch_manager: grpc.Channel
    committer: grpc.Channel
    auth: Any  # quarry.v1 AuthStub over a channel with the gateway's service token, or None
    workers: int = 32
    # The gateway's service token source (None when auth is off): a user's staging calls
    # carry it as the relay of bytes the gateway wrote (quarry.auth.checks.check_import).
    relay: Callable[[], str] | None = None


# One branch per S3 operation, in S3's own order: a dispatch table read top to bottom.
def route(request: Request) -> tuple[str, Callable[..., Response], bool]:  # noqa: C901
    """(operation name, handler, whether the handler takes the signature)."""
    method = request.method
    bucket, key = request.target.bucket, request.target.key
    if not bucket:
        if method == "GET":
            return "ListBuckets", ops.list_buckets, False
        raise not_implemented(f"{method} on the service")
    if not key:
        if method == "HEAD":
            return "HeadBucket", ops.head_bucket, False
        if method == "GET":
            if request.has("location"):
                return "GetBucketLocation", ops.get_bucket_location, False
            if request.has("uploads"):
                return "ListMultipartUploads", ops.list_multipart_uploads, False
            known = {
                "list-type",
                "prefix",
                "delimiter",
                "marker",
                "max-keys",
                "continuation-token",
                "start-after",
                "encoding-type",
                "fetch-owner",
            }
            unknown = [k for k, _ in request.query if k not in known]
            if unknown:
                raise not_implemented(f"GET bucket ?{unknown[0]}")
            name = "ListObjectsV2" if request.param("list-type") == "2" else "ListObjects"
            return name, ops.list_objects, False
        if method == "POST" and request.has("delete"):
            return "DeleteObjects", ops.delete_objects, True
        if method == "PUT" and not request.query:
            return "CreateBucket", ops.create_bucket, False
        raise not_implemented(f"{method} on a bucket")
    for name, value in request.query:  # every one: a second versionId was not checked
        if name == "versionId":
            ops.check_version_id(value)
    if method == "GET" and request.has("uploadId"):
        return "ListParts", ops.list_parts, False
    if method == "GET":
        if any(
            request.has(s)
            for s in ("acl", "tagging", "retention", "legal-hold", "torrent", "attributes")
        ):
            raise not_implemented("object subresources")
        return "GetObject", ops.get_object, False
    if method == "HEAD":
        return "HeadObject", ops.head_object, False
    if method == "PUT":
        if request.has("uploadId"):
            if request.header("x-amz-copy-source"):
                return "UploadPartCopy", ops.upload_part_copy, False
            return "UploadPart", ops.upload_part, True
        if request.header("x-amz-copy-source"):
            return "CopyObject", ops.copy_object, False
        if any(request.has(s) for s in ("acl", "tagging", "retention", "legal-hold")):
            raise not_implemented("object subresources")
        return "PutObject", ops.put_object, True
    if method == "DELETE":
        if request.has("uploadId"):
            return "AbortMultipartUpload", ops.abort_multipart_upload, False
        return "DeleteObject", ops.delete_object, False
    if method == "POST":
        if request.has("uploads"):
            return "CreateMultipartUpload", ops.create_multipart_upload, False
        if request.has("uploadId"):
            return "CompleteMultipartUpload", ops.complete_multipart_upload, True
    raise not_implemented(f"{method} on an object")


# What one send to the transport carries at most: the unit of progress of a download.
SEND_PIECE = 256 * 1024


class _Bridge(BodyReader):
    """The worker thread's view of the ASGI channels: blocking read(n) and prefetch
    (quarry.asgi), and send: an answer's messages go over together (send(*messages)), one
    crossing to the event loop."""

    def __init__(
        self,
        receive: Any,
        send: Any,
        loop: asyncio.AbstractEventLoop,
        idle_seconds: float = 60.0,
    ) -> None:
        super().__init__(receive, loop, idle_seconds)
        self._send = send
        self.disconnected = False  # set by watch()
        self.started = False

    def unread_body(self, headers: dict[str, list[str]]) -> bool:
        """Whether the request announced a body this answer leaves (partly) unread."""
        announced = headers.get("content-length", ["0"])[0] not in ("", "0") or bool(
            headers.get("transfer-encoding")
        )
        return announced and not self.exhausted

    def send(self, *messages: dict[str, Any]) -> None:
        """Send the messages in order, in one crossing to the event loop."""
        self.on_loop(self._send_all(messages))

    async def watch(self) -> None:
        """Mark the client gone once `receive` says it disconnected (see S3App.__call__)."""
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                return

    async def _send_all(self, messages: tuple[dict[str, Any], ...]) -> None:
        for message in messages:
            if self.disconnected:
                raise ClientGone("the client closed the connection")
            body = message.get("body", b"")
            if len(body) <= SEND_PIECE:
                await self._send(message)
                self.touched = time.monotonic()
                continue
            # A large body goes in pieces, each a sign of progress (on_loop): a slow client
            # that keeps reading is never taken for a stalled one.
            more = message.get("more_body", False)
            view = memoryview(body)
            for start in range(0, len(body), SEND_PIECE):
                piece = view[start : start + SEND_PIECE]
                last = start + SEND_PIECE >= len(body)
                if self.disconnected:
                    raise ClientGone("the client closed the connection")
                await self._send(
                    {"type": message["type"], "body": piece, "more_body": more or not last}
                )
                self.touched = time.monotonic()


class S3App:
    """The ASGI application (uvicorn runs it)."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self._pool = ThreadPoolExecutor(gateway.workers, thread_name_prefix="s3-gateway")
        self._settings = gateway.settings
        cache_seconds = float(self._settings.s3_gateway_cache_seconds)
        self._verifier = (
            None if gateway.auth is None else SignatureVerifier(gateway.auth, cache_seconds)
        )
        self._lookups = ops.Lookups(cache_seconds)
        batch = int(self._settings.s3_gateway_staging_batch)
        self._staging = (
            uploads.SharedStaging(batch, observe=_observe_staging) if batch > 1 else None
        )
        # One client per user, with the token it calls with: a user's token changes every
        # time the verifier's reuse ends, and keyed by token the clients of past tokens
        # piled up (~300 KB each, each holding a bearer token) up to the cache's bound.
        self._clients = TTLCache(max(cache_seconds, 1.0), max_items=1000)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not await serves_http(scope, receive, send):
            return
        if scope["method"] == "GET" and scope["path"] in ("/_health", "/_health/"):
            # On the event loop, never behind the worker threads: a probe must see a live
            # gateway even while every thread serves (or waits on) a slow client.
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", b"3")],
                }
            )
            await send({"type": "http.response.body", "body": b"ok\n"})
            REQUESTS.labels("Health", "200").inc()
            return
        loop = asyncio.get_running_loop()
        bridge = _Bridge(receive, send, loop, float(self._settings.http_idle_seconds))
        await bridge.prefetch(scope["headers"])
        # A GET or HEAD reads no body: nothing else reads `receive`, so it is watched for
        # the client's disconnect, which stops a download at once instead of reading the
        # rest of the object for nobody (uvicorn drops what is sent after it silently).
        watcher = (
            asyncio.create_task(bridge.watch()) if scope["method"] in ("GET", "HEAD") else None
        )
        try:
            await loop.run_in_executor(self._pool, self._handle, scope, bridge)
        finally:
            if watcher is not None:
                watcher.cancel()

    # ---- one request, on a worker thread ----

    def _handle(self, scope: dict[str, Any], bridge: _Bridge) -> None:
        started = time.perf_counter()
        request_id = uuid.uuid4().hex[:16].upper()
        headers: dict[str, list[str]] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))
        raw_path = (
            (scope.get("raw_path") or scope["path"].encode()).decode("latin-1").partition("?")[0]
        )
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        host = headers.get("host", [""])[0]
        request = Request(
            method=scope["method"],
            raw_path=raw_path,
            query=query,
            headers=headers,
            target=resolve(raw_path, host, self._settings.s3_gateway_domain),
            request_id=request_id,
            read=bridge.read,
        )
        operation = "Unknown"
        status = 500
        # A caller's W3C traceparent (and tracestate) makes this request a span of its trace;
        # without one the request starts a trace of its own. The gRPC calls are children.
        parent = propagate.extract({name: values[0] for name, values in headers.items()})
        with telemetry.tracer("quarry").start_as_current_span(
            "S3 request",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"s3.request_id": request_id},
        ) as span:
            try:
                operation, handler, takes_signature = route(request)
                span.update_name(f"S3 {operation}")
                context, signature = self._authenticate(request)
                if takes_signature:
                    response = handler(context, request, signature)
                else:
                    response = handler(context, request)
                status = self._respond(bridge, request, response)
            except ClientGone:
                status = 499
                log.info("s3 %s %s: client closed the connection", operation, request_id)
            except S3Error as error:
                status = self._error(bridge, request, error)
            except errors.QuarryError as exc:
                status = self._error(bridge, request, ops.from_quarry(exc))
            except Exception:
                log.exception("s3 %s %s failed", operation, request_id)
                status = self._error(
                    bridge,
                    request,
                    S3Error(
                        "InternalError", "We encountered an internal error. Please try again.", 500
                    ),
                )
            # Inside the span: the line carries its trace_id and span_id (quarry.telemetry.logs),
            # to match the back-end services' lines of the same request.
            span.set_attribute("http.response.status_code", status)
            elapsed = time.perf_counter() - started
            REQUESTS.labels(operation, str(status)).inc()
            LATENCY.labels(operation).observe(elapsed)
            log.info(
                "s3 %s %s %s -> %d in %.1f ms (request id %s)",
                operation,
                request.method,
                raw_path,
                status,
                elapsed * 1000,
                request_id,
            )

    def _authenticate(self, request: Request) -> tuple[ops.Context, sigv4.Signature | None]:
        signed = request.signed()
        signature = sigv4.parse(signed)
        verifier = self._verifier
        if verifier is None:
            # Auth off (trusted development, benchmarks): no identity to check.
            token = ""
            user = "anonymous"
        else:
            if signature is None:
                raise access_denied("anonymous access is not supported: sign with SigV4")
            sigv4.check_time(
                signature, time.time(), float(self._settings.s3_gateway_max_skew_seconds)
            )
            sigv4.check_payload_hash(signature)
            sigv4.check_signed_headers(signed, signature)
            text = sigv4.string_to_sign(signed, signature)
            verified = verifier.verify(signature, [(text, signature.signature)])
            token, user = verified.token, verified.user_id
        if signature is not None:
            sigv4.check_payload_hash(signature)

        def check_chunks(chunks: list[tuple[str, str]]) -> None:
            if verifier is not None and signature is not None and chunks:
                verifier.verify(signature, chunks)

        context = ops.Context(
            client=self._client(user, token),
            user_id=user,
            settings=self._settings,
            region=self._settings.s3_gateway_region,
            sealed_check=check_chunks,
            lookups=self._lookups,
            staging=self._staging,
            authenticated=verifier is not None,
        )
        return context, signature

    def _client(self, user: str, token: str) -> Any:
        """A Quarry client calling as `user` with the bearer `token` over the gateway's
        channels, kept while the token is reused (a client is a set of stubs: cheap, but not
        free per request); a new token replaces the user's client."""
        from quarry.client import Client

        cached = self._clients.get(user)
        if cached is not None and cached[0] == token:
            return cached[1]
        gateway = self._gateway
        client = Client(
            branch_manager=gateway.branch_manager,
            committer=gateway.committer,
            token=token,
            relayed_by=gateway.relay,
        )
        self._clients.put(user, (token, client))
        return client

    def _respond(self, bridge: _Bridge, request: Request, response: Response) -> int:
        headers = [
            ("x-amz-request-id", request.request_id),
            ("x-amz-id-2", request.request_id),
            ("server", "Quarry"),
            *response.headers,
        ]
        if bridge.unread_body(request.headers):
            # An answer before the body was read (an error, or a refusal of an
            # `Expect: 100-continue` upload): the connection cannot carry another request.
            headers.append(("connection", "close"))
        body = response.body
        if isinstance(body, bytes) and not any(k == "content-length" for k, _ in headers):
            headers.append(("content-length", str(len(body))))
        start = {
            "type": "http.response.start",
            "status": response.status,
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers],
        }
        try:
            if request.method == "HEAD" or response.status == 304:
                chunks: Iterable[bytes] = ()
            elif isinstance(body, bytes):
                chunks = (body,)
            else:
                chunks = body
            self._send_body(bridge, start, chunks, _content_length(headers))
        finally:
            if response.close is not None:
                response.close()
        return response.status

    @staticmethod
    def _send_body(
        bridge: _Bridge, start: dict[str, Any], chunks: Iterable[bytes], length: int | None
    ) -> None:
        """The answer's start with its first piece of body, in one crossing to the event
        loop (a small answer is one crossing in all); a piece that completes the announced
        Content-Length ends the body itself. The start goes only once the first piece was
        read: a failure before it is still an ordinary error answer."""
        pending = [start]
        sent = 0
        for chunk in chunks:
            sent += len(chunk)
            last = length is not None and sent >= length
            pending.append({"type": "http.response.body", "body": chunk, "more_body": not last})
            bridge.started = True
            bridge.send(*pending)
            pending = []
            if last:
                return
        pending.append({"type": "http.response.body", "body": b""})
        bridge.started = True
        bridge.send(*pending)

    def _error(self, bridge: _Bridge, request: Request, error: S3Error) -> int:
        if bridge.started:
            # Headers are out: nothing to answer with but a cut connection (the client sees
            # a short body, never a wrong one). The answer is left unfinished: the server
            # closes the connection (one line in its log, no traceback), and this request
            # is logged, counted and traced with the failure's status as any other.
            log.warning("s3 %s failed mid-answer: %s", request.request_id, error.message)
            return error.status
        body = (
            b"" if request.method == "HEAD" else xmlserde.error_document(error, request.request_id)
        )
        response = Response(
            error.status,
            [("content-type", "application/xml"), ("content-length", str(len(body)))],
            body,
        )
        self._respond(bridge, request, response)
        return error.status
