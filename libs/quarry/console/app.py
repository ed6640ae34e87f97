"""The console's ASGI application: one request -> session -> CSRF check (POST) -> its page
-> HTML (or an object's bytes).

Pages are synchronous code (gRPC calls with the user's token); each runs on a worker thread
of the console's own pool. A download is streamed in pieces, never held whole; so is an
upload (a multipart/form-data post): its fields before the file are read here (bounded by
MAX_FORM_BYTES, so the CSRF check below covers them), its file by its page in pieces
(quarry.asgi.BodyReader, quarry.console.multipart).

Per request: one trace span (`console <route>`, the gRPC calls its children; a child of the
caller's span when the request carries a W3C traceparent), one log line,
and the quarry_console_requests_total / quarry_console_request_seconds metrics by route and
status. Errors become a page with the gRPC status and its ErrorInfo reason — never a stack
trace (an unexpected exception is logged with one and shown as INTERNAL with a request id).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import grpc
from opentelemetry import propagate
from opentelemetry.trace import SpanKind
from prometheus_client import Counter, Histogram

from quarry import errors, telemetry
from quarry.asgi import BodyReader, ClientGone, serves_http
from quarry.auth.throttle import LoginThrottle, LoginThrottled
from quarry.console import multipart, sessions
from quarry.console.http import (
    MAX_FORM_BYTES,
    Request,
    Response,
    parse_cookies,
    parse_form,
    parse_query,
    redirect,
    url,
)

log = logging.getLogger("quarry.console")

REQUESTS = Counter(
    "quarry_console_requests_total",
    "Console requests by route and HTTP status",
    ["route", "status"],
)
LATENCY = Histogram("quarry_console_request_seconds", "Console request latency by route", ["route"])

# gRPC status -> the HTTP status of its error page.
HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 409,
    "OUT_OF_RANGE": 400,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "ABORTED": 409,
    "PERMISSION_DENIED": 403,
    "UNAUTHENTICATED": 401,
    "RESOURCE_EXHAUSTED": 429,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
    "UNIMPLEMENTED": 501,
    "DATA_LOSS": 502,  # storage holds other bytes than the entry records
}
# Reasons whose page has a status of their own.
REASON_STATUS = {"UPLOAD_TOO_LARGE": 413}


@dataclass
class Console:
    """What the application needs: settings and the (plain) channels to branch-manager,
    committer and the compactor-sensor. Every call carries the signed-in user's token; the
    console's own is only ever a relay (below)."""

    settings: Any
    branch_manager: grpc.Channel
    committer: grpc.Channel
    compactor_sensor: grpc.Channel | None = None
    workers: int = 16
    secure: bool = False  # served over TLS (cookies get Secure)
    # Seals the session cookies (quarry.console.sessions); empty: read from the settings.
    session_key: bytes = b""
    # The console's service token source (None when auth is off), sent only as the relay of
    # the uploads it stages for a user (quarry.auth.checks.check_import), never as a call's
    # own authorization.
    relay: Callable[[], str] | None = None

    def client(self, token: str) -> Any:
        """A Client over the console's own channels carrying `token` (a user's, or "" for
        sign-in). The one place a session's client is made. Safety: every address it dials
        is one of these channels: a Client left to its defaults would send the user's token
        to whatever listens on a default port. A suite without a compactor-sensor channel
        sends its calls to branch-manager, which answers UNIMPLEMENTED."""
        from quarry.client import Client

        return Client(
            branch_manager=self.branch_manager,
            committer=self.committer,
            compactor_sensor=self.compactor_sensor or self.branch_manager,
            token=token,
            timeout=30.0,
            relayed_by=self.relay,
        )


@dataclass
class Context:
    """One page's view: the request, the session (None before sign-in), a Client with the
    user's token, and the renderer."""

    request: Request
    session: sessions.Session | None
    client: Any
    console: Console
    render: Callable[..., Response]
    store: sessions.SessionStore


Handler = Callable[[Context, dict[str, str]], Response]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    name: str
    handler: Handler
    public: bool = False  # reachable without a session (sign-in, health)


def same_origin(request: Request) -> bool:
    """Whether a browser says this request comes from the console's own pages.

    Safety: a post from another origin — another port of the same host included, which
    cookies do not tell apart — is refused (login CSRF: a page on another port could plant
    the sign-in form's cookie and sign the user in as the attacker). Browsers send
    Sec-Fetch-Site (same-origin, or none for what the user typed); older ones send Origin,
    compared with the Host the request was sent to. A client with neither is no browser,
    and no other site can make it post."""
    fetch_site = request.headers.get("sec-fetch-site", "")
    if fetch_site:
        return fetch_site in ("same-origin", "none")
    origin = request.headers.get("origin", "")
    if not origin:
        return True
    _, _, host = origin.partition("://")
    return origin != "null" and host.lower() == request.headers.get("host", "").lower()


def route(method: str, path: str, name: str, handler: Handler, public: bool = False) -> Route:
    """`path` with {name} segments (one path segment each, {name:path} the rest)."""
    regex = re.sub(r"\{(\w+):path\}", r"(?P<\1>.+)", path)
    regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", regex)
    return Route(method, re.compile(f"^{regex}$"), name, handler, public)


def _content_type(scope: dict[str, Any]) -> str:
    for name, value in scope["headers"]:
        if name.lower() == b"content-type":
            return str(value.decode("latin-1").lower())
    return ""


class ConsoleApp:
    """The ASGI application (uvicorn runs it)."""

    def __init__(self, console: Console, routes: list[Route] | None = None) -> None:
        from quarry.console import pages, templates

        self.console = console
        self.sessions = sessions.SessionStore(
            console.session_key or sessions.session_key(console.settings),
            lifetime_seconds=console.settings.console_session_seconds,
        )
        self._anonymous: dict[str, Any] = {}
        self._routes = routes if routes is not None else pages.ROUTES
        self._templates = templates.Templates()
        self._pool = ThreadPoolExecutor(console.workers, thread_name_prefix="console")
        # Sign-ins per browser address (and per access key id), before Auth/Login: Login's
        # own per-address bucket sees this console as one address for all its users.
        self._sign_ins = LoginThrottle(
            console.settings.auth_login_attempts_per_minute_per_key,
            console.settings.console_login_attempts_per_minute_per_address,
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not await serves_http(scope, receive, send):
            return
        loop = asyncio.get_running_loop()
        if _content_type(scope).startswith("multipart/form-data"):
            # An upload: the page reads its body in pieces as it stores them (never whole,
            # and not bounded by MAX_FORM_BYTES but by the upload setting).
            reader = BodyReader(receive, loop, float(self.console.settings.http_idle_seconds))
            response = await loop.run_in_executor(self._pool, self.handle, scope, b"", reader)
            await self._send(send, response, loop)
            return
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_FORM_BYTES:
                await self._send(
                    send, Response(413, [("content-type", "text/plain")], b"too large")
                )
                return
        response = await loop.run_in_executor(self._pool, self.handle, scope, body)
        await self._send(send, response, loop)

    async def _send(
        self, send: Any, response: Response, loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers]
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        try:
            if isinstance(response.body, bytes):
                await send({"type": "http.response.body", "body": response.body})
                return
            chunks: Iterator[bytes] = response.body
            assert loop is not None
            while True:
                chunk = await loop.run_in_executor(self._pool, next, chunks, None)
                if chunk is None:
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            if response.close is not None:
                response.close()

    # ---- one request, on a worker thread ----

    def parse(self, scope: dict[str, Any], body: bytes) -> Request:
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            headers[name.decode("latin-1").lower()] = value.decode("latin-1")
        client = scope.get("client") or ("", 0)
        return Request(
            method=scope["method"],
            path=scope["path"],
            query=parse_query(scope.get("query_string", b"")),
            headers=headers,
            cookies=parse_cookies(headers.get("cookie", "")),
            form=parse_form(body, headers.get("content-type", "")),
            secure=self.console.secure or scope.get("scheme") == "https",
            client=str(client[0]),
        )

    def handle(
        self, scope: dict[str, Any], body: bytes, reader: BodyReader | None = None
    ) -> Response:
        started = time.perf_counter()
        request = self.parse(scope, body)
        name = "unknown"
        # A caller's W3C traceparent (and tracestate) makes this request a span of its trace,
        # as at the s3-gateway; without one the request starts a trace of its own. The gRPC
        # calls of its page are children.
        with telemetry.tracer("quarry").start_as_current_span(
            "console request",
            context=propagate.extract(request.headers),
            kind=SpanKind.SERVER,
            attributes={"http.method": request.method},
        ) as span:
            try:
                if reader is not None:  # multipart: the fields before the file, then the file
                    request.form, request.upload = multipart.read_fields(
                        reader.read, request.headers.get("content-type", ""), MAX_FORM_BYTES
                    )
                matched = self._match(request)
                if matched is None:
                    response = self._page_error(request, None, 404, "NOT_FOUND", "no such page")
                else:
                    found, params = matched
                    name = found.name
                    span.update_name(f"console {name}")
                    response = self._dispatch(request, found, params)
            except ClientGone:
                response = Response(499, [], b"")  # no one is left to read an answer
            except errors.QuarryError as exc:  # a form that cannot be read
                response = self._page_error(
                    request, None, 400, exc.reason, exc.message, code=exc.code.name
                )
            except Exception:
                request_id = uuid.uuid4().hex[:16]
                log.exception(
                    "console %s %s failed (request id %s)",
                    name,
                    quote(request.path, safe="/"),
                    request_id,
                )
                response = self._page_error(
                    request, None, 500, "INTERNAL", f"an internal error (request id {request_id})"
                )
            # Inside the span: the line carries its trace_id and span_id (quarry.telemetry.logs).
            span.set_attribute("http.response.status_code", response.status)
            elapsed = time.perf_counter() - started
            REQUESTS.labels(name, str(response.status)).inc()
            LATENCY.labels(name).observe(elapsed)
            log.info(
                "console %s %s %s -> %d in %.1f ms",
                name,
                request.method,
                # Percent-encoded, as sent: a decoded %0A would forge a log line.
                quote(request.path, safe="/"),
                response.status,
                elapsed * 1000,
            )
        return response

    def _match(self, request: Request) -> tuple[Route, dict[str, str]] | None:
        method = "GET" if request.method == "HEAD" else request.method
        for candidate in self._routes:
            if candidate.method != method:
                continue
            found = candidate.pattern.match(request.path)
            if found:
                return candidate, found.groupdict()
        return None

    def _dispatch(self, request: Request, found: Route, params: dict[str, str]) -> Response:
        session = self.sessions.get(request.cookies.get(sessions.SESSION_COOKIE, ""))
        if request.method == "POST" and not same_origin(request):
            # Before the session and CSRF checks: a page of another origin may have planted
            # the sign-in form's double-submit cookie (cookies ignore ports), so it must not
            # sign a user in as someone else, nor post anything else.
            return self._page_error(
                request, session, 403, "CROSS_ORIGIN", "a form posted from another site"
            )
        if session is None and not found.public:
            if request.method == "GET":
                return redirect(url("/login", next=_return_to(request)), 303)
            return self._page_error(request, None, 401, "UNAUTHENTICATED", "sign in first")
        if found.name == "login" and request.method == "POST":
            refused = self._throttle_sign_in(request, session)
            if refused is not None:
                return refused
        # Every form post of a signed-in user carries the session's CSRF token.
        if (
            request.method == "POST"
            and session is not None
            and found.name != "login"
            and not sessions.check_csrf(session.csrf, request.field("csrf"))
        ):
            return self._page_error(
                request,
                session,
                403,
                "CSRF_TOKEN_INVALID",
                "the form's CSRF token is missing or wrong",
            )
        client = self._client(session)

        def render(template: str, status: int = 200, **values: Any) -> Response:
            return self._render(request, session, template, status, values)

        ctx = Context(request, session, client, self.console, render, self.sessions)
        try:
            return found.handler(ctx, params)
        except errors.QuarryError as exc:
            reason = exc.reason
            code = exc.code.name
            if code == "UNAUTHENTICATED" and session is not None:
                # The token expired or was revoked: the session is over.
                self.sessions.delete(session.id)
                return redirect(url("/login", next=_return_to(request)), 303)
            return self._page_error(
                request,
                session,
                REASON_STATUS.get(reason, HTTP_STATUS.get(code, 500)),
                reason,
                exc.message,
                code=code,
            )

    def _throttle_sign_in(
        self, request: Request, session: sessions.Session | None
    ) -> Response | None:
        """A 429 page (Retry-After) when this browser address, or the access key id it
        names, has used its sign-in attempts; None to go on to Auth/Login."""
        try:
            self._sign_ins.admit(
                request.field("access_key_id").strip(), f"browser:{request.client}"
            )
        except LoginThrottled as exc:
            response = self._page_error(
                request, session, 429, exc.reason, exc.message, code="RESOURCE_EXHAUSTED"
            )
            retry = max(1, math.ceil(exc.retry_delay or 1))
            response.headers.append(("retry-after", str(retry)))
            return response
        return None

    def _client(self, session: sessions.Session | None) -> Any:
        """The Client of a session, made once (a Client costs tens of ms to build: its stubs
        and interceptors), carrying the session's token; for pages without a session, one
        shared client with no token (sign-in)."""
        cache = session.cache if session is not None else self._anonymous
        client = cache.get("client")
        if client is None:
            client = self.console.client(session.token if session is not None else "")
            cache["client"] = client  # a lost race makes two; either serves (thread-safe)
        return client

    def _render(
        self,
        request: Request,
        session: sessions.Session | None,
        template: str,
        status: int,
        values: dict[str, Any],
    ) -> Response:
        html = self._templates.render(template, request=request, session=session, url=url, **values)
        return Response(
            status,
            [
                ("content-type", "text/html; charset=utf-8"),
                ("cache-control", "no-store"),
                # No script, frame or form target outside this origin; inline styles only.
                (
                    "content-security-policy",
                    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
                    "script-src 'self'; frame-ancestors 'none'; form-action 'self'",
                ),
                ("x-content-type-options", "nosniff"),
                ("referrer-policy", "same-origin"),
            ],
            html.encode(),
        )

    def _page_error(
        self,
        request: Request,
        session: sessions.Session | None,
        status: int,
        reason: str,
        message: str,
        code: str = "",
    ) -> Response:
        if not code:
            code = {401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND"}.get(
                status, "INTERNAL"
            )
        return self._render(
            request,
            session,
            "error.html",
            status,
            {"code": code, "reason": reason, "message": message, "status": status},
        )


def _return_to(request: Request) -> str:
    """Where sign-in sends the browser back: the path and query a signed-out GET asked for,
    percent-encoded (a shared link to an object keeps its ref and path)."""
    target = quote(request.path, safe="/")
    if request.query:
        target += "?" + urlencode(request.query)
    return target
