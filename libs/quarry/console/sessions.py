"""Console sessions: sealed cookies. At sign-in the session (a random serial, the user, the
token Auth/Login issued them, a CSRF token and its expiry) is sealed with AES-256-GCM under
the console's session key (QUARRY_CONSOLE_SESSION_KEY[_FILE]) into the HttpOnly session
cookie. Any console process holding the same key opens it: a session survives a restart of
the console and works on every replica, with nothing shared but the key. The browser holds
only ciphertext: it can neither read the token nor change a byte of the session.

Safety rules:
- A session is only ever minted here, at sign-in, with fresh random serial and CSRF token. A
  cookie that does not open under the key (planted, forged, tampered with, or sealed under
  another key) is no session and is never adopted (session fixation: an attacker who plants
  a cookie before the victim signs in gets nothing; sign-in always issues a new cookie and
  revokes the one it replaces).
- A state-changing request (every POST) must carry the session's CSRF token in its form;
  `check_csrf` compares in constant time and refuses an empty or missing one.
- A session never outlives the token Auth/Login issued for it: it expires at the token's
  expiry or after QUARRY_CONSOLE_SESSION_SECONDS, whichever is first, and an expired
  cookie opens as no session.
- Sign-out (and a sign-in that replaces a session, and a token the servers no longer
  accept) revokes the session's serial at once in this process, and the browser's cookie
  is cleared. The limit, stated honestly: Auth has no token revocation and the revoked
  serials are kept in each process's memory (bounded), so a copy of the cookie taken
  *before* sign-out still opens on another replica, or on this one after a restart, until
  the session expires (at most QUARRY_CONSOLE_SESSION_SECONDS; keep it short).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from quarry import errors
from quarry.auth.keys import read_key
from quarry.config import Settings

SESSION_COOKIE = "quarry_console_session"
# The sign-in form's CSRF token lives in its own short cookie (double submit): there is no
# session to keep it in yet.
LOGIN_COOKIE = "quarry_console_login"
# Memory bound of the per-process caches (a session's Client and policy answers): past this
# many, the least recently used is dropped and rebuilt on its next request.
MAX_SESSIONS = 10_000
# Memory bound of the revoked serials (~100 bytes each). Past it, after the expired ones, the
# one expiring soonest is forgotten first (the least time a copied cookie could still use).
MAX_REVOKED = 100_000
MIN_KEY_BYTES = 32
# The version of the sealed format: the seal's additional data, and the cookie's prefix.
_FORMAT = "s1"
_CONTEXT = b"quarry console session cookie v1"
_NONCE_BYTES = 12


class ConsoleSessionKeyMissing(errors.FailedPrecondition):
    """No session key configured (or a short one): the console refuses to start."""

    reason = "CONSOLE_SESSION_KEY_MISSING"


def session_key(settings: Settings) -> bytes:
    """The console's session key: QUARRY_CONSOLE_SESSION_KEY, else the contents of
    QUARRY_CONSOLE_SESSION_KEY_FILE (default `home`/console-session.key), stripped. Never
    invents one: replicas with keys of their own would refuse each other's cookies."""
    return read_key(
        settings.console_session_key,
        "QUARRY_CONSOLE_SESSION_KEY",
        Path(settings.effective_console_session_key_file),
        ConsoleSessionKeyMissing,
        what="the console session key",
        missing=lambda path: (
            f"the console has no session key: set QUARRY_CONSOLE_SESSION_KEY, or put one "
            f"(at least {MIN_KEY_BYTES} bytes) in {path} (QUARRY_CONSOLE_SESSION_KEY_FILE; "
            "`quarry up` creates it)"
        ),
        min_bytes=MIN_KEY_BYTES,
    )


def ensure_session_key(settings: Settings) -> None:
    """Create the session key file (mode 0600) when no key is configured and there is none
    (`quarry up`); never overwrites one."""
    from quarry.auth.keys import create_key_file

    if not settings.console_session_key:
        create_key_file(Path(settings.effective_console_session_key_file))


@dataclass
class Session:
    id: str  # the sealed cookie the browser holds (what sign-in sets, sign-out revokes)
    serial: str  # random, inside the seal: what revocation and this process's cache key on
    user_id: str
    token: str
    csrf: str
    expires_at: float
    # This process's cached answers about the session (its Client, the user's permissions:
    # quarry.console.permissions); rebuilt when absent.
    cache: dict = field(default_factory=dict)


class SessionStore:
    def __init__(
        self,
        key: bytes,
        lifetime_seconds: float = 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"the session key must be at least {MIN_KEY_BYTES} bytes")
        # A key of its own for the cookies, derived: the configured bytes may be any text.
        self._aead = AESGCM(hmac.new(key, _CONTEXT, hashlib.sha256).digest())
        self._lifetime = lifetime_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._caches: OrderedDict[str, dict] = OrderedDict()
        self._revoked: dict[str, float] = {}  # serial -> its session's expiry

    def create(self, user_id: str, token: str, expires_at: float, replaces: str = "") -> Session:
        """A new session with a fresh serial and CSRF token, sealed into a new cookie; the
        session of the cookie `replaces` (if it opens) is revoked."""
        if replaces:
            self.delete(replaces)
        serial = secrets.token_urlsafe(16)
        csrf = secrets.token_urlsafe(32)
        expires_at = min(expires_at, self._clock() + self._lifetime)
        payload = json.dumps(
            {"s": serial, "u": user_id, "t": token, "c": csrf, "e": expires_at},
            separators=(",", ":"),
        ).encode()
        nonce = os.urandom(_NONCE_BYTES)
        sealed = nonce + self._aead.encrypt(nonce, payload, _FORMAT.encode())
        cookie = f"{_FORMAT}.{base64.urlsafe_b64encode(sealed).decode().rstrip('=')}"
        return Session(cookie, serial, user_id, token, csrf, expires_at, self._cache(serial))

    def get(self, cookie: str) -> Session | None:
        """The live session sealed in `cookie`; None for one that does not open under the key,
        is expired, or was revoked here."""
        opened = self._open(cookie)
        if opened is None:
            return None
        serial, user_id, token, csrf, expires_at = opened
        if expires_at <= self._clock():
            return None
        with self._lock:
            if serial in self._revoked:
                return None
        return Session(cookie, serial, user_id, token, csrf, expires_at, self._cache(serial))

    def delete(self, cookie: str) -> None:
        """Revoke the session sealed in `cookie` in this process (see the module's limit)."""
        opened = self._open(cookie)
        if opened is None:
            return
        serial, expires_at = opened[0], opened[4]
        with self._lock:
            self._caches.pop(serial, None)
            if serial not in self._revoked:
                self._bound_revoked()
            self._revoked[serial] = expires_at

    def __len__(self) -> int:
        return len(self._caches)

    def _open(self, cookie: str) -> tuple[str, str, str, str, float] | None:
        version, _, body = cookie.partition(".")
        if version != _FORMAT or not body:
            return None
        try:
            sealed = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            if len(sealed) <= _NONCE_BYTES:
                return None
            plain = self._aead.decrypt(
                sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:], _FORMAT.encode()
            )
            fields = json.loads(plain)
            return (
                str(fields["s"]),
                str(fields["u"]),
                str(fields["t"]),
                str(fields["c"]),
                float(fields["e"]),
            )
        except (InvalidTag, binascii.Error, ValueError, KeyError, TypeError):
            return None  # not sealed by us under this key: no session, never an error page

    def _cache(self, serial: str) -> dict:
        with self._lock:
            cache = self._caches.get(serial)
            if cache is None:
                cache = self._caches[serial] = {}
                while len(self._caches) > MAX_SESSIONS:
                    self._caches.popitem(last=False)
            else:
                self._caches.move_to_end(serial)
            return cache

    def _bound_revoked(self) -> None:
        if len(self._revoked) < MAX_REVOKED:
            return
        now = self._clock()
        for serial in [s for s, expiry in self._revoked.items() if expiry <= now]:
            del self._revoked[serial]
        while len(self._revoked) >= MAX_REVOKED:
            del self._revoked[min(self._revoked, key=self._revoked.__getitem__)]


def check_csrf(expected: str, given: str) -> bool:
    """Whether `given` is the CSRF token `expected`; never true for an empty one. Compared
    as UTF-8 bytes: compare_digest refuses non-ASCII text (a forged token was a 500)."""
    return (
        bool(expected)
        and bool(given)
        and hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogatepass"))
    )


def new_login_token() -> str:
    return secrets.token_urlsafe(32)
