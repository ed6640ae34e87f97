"""The console's view of one HTTP request and its answer: parsed once (query, cookies, an
urlencoded form), handed to a page; no framework, the ASGI app (quarry.console.app) fills it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, quote_plus

# A form is a few fields: anything larger is refused before it is read whole.
MAX_FORM_BYTES = 1 << 20


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    cookies: dict[str, str]
    form: dict[str, str]
    secure: bool  # served over TLS: cookies get the Secure attribute
    client: str = ""
    # A multipart form's file part (quarry.console.multipart.FilePart), read in pieces by
    # the page; `form` then holds the fields before it.
    upload: Any = None

    def arg(self, name: str, default: str = "") -> str:
        return self.query.get(name, default)

    def field(self, name: str, default: str = "") -> str:
        return self.form.get(name, default)


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes | Iterator[bytes] = b""
    close: Callable[[], None] | None = None

    def set_cookie(
        self,
        name: str,
        value: str,
        *,
        secure: bool,
        max_age: int | None = None,
        same_site: str = "Strict",
        path: str = "/",
    ) -> None:
        """HttpOnly always (no script reads a session); Secure under TLS; SameSite so no
        other site's page can send it with a form post."""
        parts = [f"{name}={value}", f"Path={path}", "HttpOnly", f"SameSite={same_site}"]
        if secure:
            parts.append("Secure")
        if max_age is not None:
            parts.append(f"Max-Age={max_age}")
        self.headers.append(("set-cookie", "; ".join(parts)))


def parse_cookies(header: str) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except Exception:  # a malformed Cookie header is no cookie, never an error page
        return {}
    return {name: morsel.value for name, morsel in jar.items()}


def parse_form(body: bytes, content_type: str) -> dict[str, str]:
    if not body or not content_type.startswith("application/x-www-form-urlencoded"):
        return {}
    return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))


def parse_query(raw: bytes) -> dict[str, str]:
    return dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))


# quote_plus(text, safe="") of an ASCII text, as one str.translate (C) instead of a Python
# loop over its bytes: unreserved characters kept, space as "+", every other one %XX.
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")
_ASCII_QUOTED = {
    c: chr(c) if c in _UNRESERVED else "+" if c == 0x20 else f"%{c:02X}" for c in range(128)
}


def quote_value(value: str) -> str:
    """quote_plus(value, safe=""): what a query value becomes in a link."""
    return value.translate(_ASCII_QUOTED) if value.isascii() else quote_plus(value, safe="")


def url(base: str, /, **query: str | int | None) -> str:
    """`base` with the non-empty `query` arguments (a shareable address: ref and path in it).
    What urlencode makes, without its per-item checks (a page builds a link per row): the
    names are Python identifiers, so only the values need quoting."""
    kept = [f"{k}={quote_value(str(v))}" for k, v in query.items() if v not in (None, "")]
    return f"{base}?{'&'.join(kept)}" if kept else base


def redirect(location: str, status: int = 303) -> Response:
    """303 after a form post: the browser follows with GET (a reload never posts again)."""
    return Response(status, [("location", location), ("content-length", "0")])
