"""The gateway's view of one HTTP request and its answer, independent of the ASGI server:
operations read a `Request` (headers, query, a body stream read in pieces) and return a
`Response` whose body is bytes or an iterator of chunks (streamed, never joined)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from quarry.s3gateway.paths import Target
from quarry.s3gateway.sigv4 import SignedRequest


@dataclass
class Request:
    method: str
    raw_path: str
    query: list[tuple[str, str]]
    headers: dict[str, list[str]]
    target: Target
    request_id: str
    read: Callable[[int], bytes]  # the raw body, n bytes at most per call; b"" at its end

    def header(self, name: str) -> str:
        values = self.headers.get(name)
        return values[0] if values else ""

    def param(self, name: str) -> str | None:
        for key, value in self.query:
            if key == name:
                return value
        return None

    def has(self, name: str) -> bool:
        return any(key == name for key, _ in self.query)

    def signed(self) -> SignedRequest:
        return SignedRequest(self.method, self.raw_path, self.query, self.headers)


@dataclass
class Response:
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes | Iterable[bytes] = b""
    close: Callable[[], None] | None = None  # called once the body is sent (or abandoned)


def xml_response(body: bytes, status: int = 200) -> Response:
    return Response(status, [("content-type", "application/xml")], body)
