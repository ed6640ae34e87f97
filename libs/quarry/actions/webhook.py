"""The webhook hook: a signed JSON POST to a URL an action file names.

Safety (what this must never do): call a link-local or cloud-metadata address
(169.254.0.0/16, fe80::/10, fd00:ec2::254), by IP or by a hostname that resolves to one,
or a host outside the allow-list when one is set. A user who can commit an action file can
pick the URL, so the guard runs on every call, on every address the name resolves to, and
the connection goes to the address that was checked (no second resolution to race)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import ipaddress
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

from quarry import errors

SIGNATURE_HEADER = "X-Quarry-Signature-256"
MAX_OUTPUT_BYTES = 4096

_FORBIDDEN_NETWORKS = (
    ipaddress.ip_network("169.254.0.0/16"),  # link-local, incl. 169.254.169.254 metadata
    ipaddress.ip_network("fe80::/10"),  # IPv6 link-local
    ipaddress.ip_network("fd00:ec2::254/128"),  # AWS IMDS over IPv6
)


class HookURLRefused(errors.FailedPrecondition):
    """A hook URL the guard refuses (link-local/metadata address, or not allow-listed)."""

    reason = "HOOK_URL_REFUSED"


@dataclass(frozen=True)
class Response:
    status: int  # 0: no HTTP answer (unreachable, timeout, refused)
    output: bytes  # the first MAX_OUTPUT_BYTES of the body, or the error
    error: str = ""


def _forbidden(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in net for net in _FORBIDDEN_NETWORKS)


def _allowed(host: str, allowed_hosts: tuple[str, ...]) -> bool:
    """Empty allow-list: any host (but never a forbidden address). `*.example.com` matches
    subdomains; `loopback` stands for 127.0.0.0/8, ::1 and localhost."""
    if not allowed_hosts:
        return True
    host = host.lower().strip("[]")
    for allowed in allowed_hosts:
        allowed = allowed.lower().strip()
        if allowed == "loopback":
            if host == "localhost":
                return True
            try:
                if ipaddress.ip_address(host).is_loopback:
                    return True
            except ValueError:
                pass
        elif allowed.startswith("*.") and host.endswith(allowed[1:]) or host == allowed:
            return True
    return False


def check_url(url: str, allowed_hosts: tuple[str, ...]) -> tuple[urllib.parse.SplitResult, str]:
    """The URL's parts and the one address to connect to, after the guard; HookURLRefused
    otherwise. Every address the host resolves to must pass (an attacker's DNS answering
    one good and one metadata address gets nothing)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HookURLRefused(f"hook URL {url!r} is not an http(s) URL", metadata={"url": url})
    host = parts.hostname
    _refuse_forbidden(url, [host] if _is_ip(host) else [])  # before the allow-list: always
    if not _allowed(host, allowed_hosts):
        raise HookURLRefused(
            f"hook URL host {host!r} is not in the allowed hosts (QUARRY_ACTIONS_ALLOWED_HOSTS)",
            metadata={"url": url, "host": host},
        )
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except OSError as failed:
        raise HookURLRefused(
            f"hook URL host {host!r} does not resolve: {failed}", metadata={"url": url}
        ) from None
    addresses = [str(info[4][0]) for info in infos]
    _refuse_forbidden(url, addresses)
    return parts, addresses[0]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def _refuse_forbidden(url: str, addresses: list[str]) -> None:
    for address in addresses:
        if _forbidden(address):
            raise HookURLRefused(
                f"hook URL {url!r} points at a link-local/metadata address ({address}); refused",
                metadata={"url": url, "address": address},
            )


def sign(secret: bytes | str, body: bytes) -> str:
    """The signature header's value: sha256=<hex HMAC-SHA256 of the body>. A str secret
    (as a receiver reads it from its environment) is its UTF-8 bytes."""
    key = secret.encode() if isinstance(secret, str) else secret
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def verify(secret: bytes | str, body: bytes, header: str) -> bool:
    """For receivers: does the header carry this body's signature under the secret (bytes,
    or a str as read from the environment)?"""
    return hmac.compare_digest(sign(secret, body), header)


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to the address the guard checked, sending the URL's Host."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def post(  # noqa: PLR0913 — one call, its parts
    url: str,
    body: dict,
    query_params: Sequence[tuple[str, str]],
    timeout: float,
    secret: bytes,
    allowed_hosts: tuple[str, ...],
    headers: dict[str, str] | None = None,
) -> Response:
    """POST the event; never raises for the receiver's behaviour (a timeout, a refused
    connection, a 500 are a failed Response), only HookURLRefused for the guard."""
    parts, address = check_url(url, allowed_hosts)
    data = json.dumps(body, sort_keys=True).encode()
    query = urllib.parse.parse_qsl(parts.query) + [(k, str(v)) for k, v in query_params]
    target = (parts.path or "/") + ("?" + urllib.parse.urlencode(query) if query else "")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    kind = _PinnedHTTPSConnection if parts.scheme == "https" else _PinnedHTTPConnection
    connection = kind(parts.hostname or "", port, address, timeout)
    send = {
        "Content-Type": "application/json",
        "User-Agent": "quarry-actions",
        SIGNATURE_HEADER: sign(secret, data),
        **(headers or {}),
    }
    deadline = time.monotonic() + timeout
    # `timeout` bounds the whole call, not each socket operation: a receiver that answers a
    # byte a second would otherwise hold the hook (and the caller's thread) for as long as
    # it likes. At the deadline the socket is shut down, which ends a blocked read at once.
    cutoff = threading.Timer(timeout, _shut_down, (connection,))
    cutoff.daemon = True
    cutoff.start()
    timed_out = f"timed out after {timeout:g}s"
    try:
        connection.request("POST", target, body=data, headers=send)
        answer = connection.getresponse()
        output = answer.read(MAX_OUTPUT_BYTES)
        if time.monotonic() >= deadline:
            return Response(0, output, timed_out)
        return Response(answer.status, output)
    except TimeoutError:
        return Response(0, b"", timed_out)
    except OSError as failed:
        return Response(
            0, b"", timed_out if time.monotonic() >= deadline else f"unreachable: {failed}"
        )
    except http.client.HTTPException as failed:
        if time.monotonic() >= deadline:
            return Response(0, b"", timed_out)
        return Response(0, b"", f"bad HTTP answer: {failed!r}")
    finally:
        cutoff.cancel()
        connection.close()


def _shut_down(connection: http.client.HTTPConnection) -> None:
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
