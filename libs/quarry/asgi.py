"""A request body read in pieces by synchronous code on a worker thread while the ASGI server
delivers it on the event loop: what the s3-gateway and the console's upload share, so a body
is never held whole (memory per request: the pieces in flight)."""

from __future__ import annotations

import asyncio
from typing import Any


class ClientGone(Exception):
    """The client closed the connection mid-request."""


class BodyReader:
    """Blocking read(n) of an ASGI request's body from a worker thread."""

    def __init__(self, receive: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._receive = receive
        self._loop = loop
        self._buffer = b""
        self._more = True

    @property
    def exhausted(self) -> bool:
        """Whether every byte of the body was read."""
        return not self._more and not self._buffer

    def read(self, n: int) -> bytes:
        """Up to `n` bytes (n <= 0: what is buffered); b"" at the body's end; ClientGone when
        the client disconnected."""
        while not self._buffer and self._more:
            message = asyncio.run_coroutine_threadsafe(self._receive(), self._loop).result()
            if message["type"] == "http.disconnect":
                raise ClientGone("the client closed the connection")
            self._buffer += message.get("body", b"")
            self._more = message.get("more_body", False)
        n = n if n > 0 else len(self._buffer)
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out
