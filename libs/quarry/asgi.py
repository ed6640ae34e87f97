"""A request body read in pieces by synchronous code on a worker thread while the ASGI server
delivers it on the event loop: what the s3-gateway and the console's upload share, so a body
is never held whole (memory per request: the pieces in flight)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any


async def serves_http(scope: dict[str, Any], receive: Any, send: Any) -> bool:
    """Whether `scope` is an HTTP request for the application to answer. A lifespan scope
    (sent by servers run with lifespan on; serve_asgi runs uvicorn with it off) is answered
    here, start-up and shut-down alike, and anything else is ignored."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return False
    return scope["type"] == "http"


class ClientGone(Exception):
    """The client closed the connection mid-request."""


# A request body up to this size, announced by Content-Length and not waiting for `Expect:
# 100-continue`, is read on the event loop before the request goes to a worker thread.
PREFETCH_BYTES = 64 * 1024


class BodyReader:
    """Blocking read(n) of an ASGI request's body from a worker thread. Each crossing from the
    worker thread to the event loop and back costs a wake-up of both (a few ms on a loaded
    host), so a small body can be read before the worker starts (`prefetch`)."""

    def __init__(
        self, receive: Any, loop: asyncio.AbstractEventLoop, idle_seconds: float = 60.0
    ) -> None:
        self._receive = receive
        self._loop = loop
        self._idle_seconds = idle_seconds  # Settings.http_idle_seconds
        self.touched = time.monotonic()  # the last progress of the client (on_loop)
        self._buffer = b""
        self._more = True
        self._gone = False

    async def prefetch(self, headers: list[tuple[bytes, bytes]]) -> None:
        """Read a small body (Content-Length of 1 to PREFETCH_BYTES) here, on the event loop:
        it came with the headers, so this waits for nothing and spares the worker a hop.
        Never for `Expect: 100-continue` (asking for the body would send 100 Continue before
        the request was authenticated) nor a larger or unannounced body (streamed in
        pieces by the worker, as it reads them)."""
        length = 0
        for name, value in headers:
            if name == b"expect":
                return
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    return
        if not 0 < length <= PREFETCH_BYTES:
            return
        while self._more and len(self._buffer) < length:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._gone = True
                return
            self._buffer += message.get("body", b"")
            self._more = message.get("more_body", False)

    @property
    def exhausted(self) -> bool:
        """Whether every byte of the body was read."""
        return not self._more and not self._buffer

    def read(self, n: int) -> bytes:
        """Up to `n` bytes (n <= 0: what is buffered); b"" at the body's end; ClientGone when
        the client disconnected."""
        while not self._buffer and self._more:
            if self._gone:
                raise ClientGone("the client closed the connection")
            message = self.on_loop(self._receive())
            if message["type"] == "http.disconnect":
                raise ClientGone("the client closed the connection")
            self._buffer += message.get("body", b"")
            self._more = message.get("more_body", False)
        n = n if n > 0 else len(self._buffer)
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    def on_loop(self, coroutine: Any) -> Any:
        """Run `coroutine` on the event loop and wait for it while it makes progress: a
        client that sends nothing (a stalled upload) or reads nothing (a stalled download:
        the send waits on the transport) for idle_seconds is ClientGone, and its worker
        thread goes back to the pool. Progress is `touched` (the time of the last piece
        received, or sent: see the s3-gateway's send), so a slow client that keeps reading
        is never cut."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        self.touched = time.monotonic()
        while True:
            try:
                return future.result(timeout=min(self._idle_seconds, 1.0))
            except concurrent.futures.TimeoutError:
                if time.monotonic() - self.touched < self._idle_seconds:
                    continue
                future.cancel()
                self._gone = True
                raise ClientGone(
                    f"the client sent or read nothing for {self._idle_seconds:g} s"
                ) from None
