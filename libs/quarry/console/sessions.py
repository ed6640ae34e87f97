"""Console sessions: a random session id in an HttpOnly cookie, the user's bearer token kept
on the server beside it (never in the browser), and a CSRF token per session.

Safety rules:
- A session id is only ever minted here, at sign-in, from the OS's CSRNG. An id a browser
  presents that this store did not mint is never adopted (session fixation: an attacker who
  plants a cookie before the victim signs in gets nothing; sign-in always issues a new id
  and drops any old one).
- A state-changing request (every POST) must carry the session's CSRF token in its form;
  `check_csrf` compares in constant time and refuses an empty or missing one.
- A session never outlives the token Auth/Login issued for it; sign-out forgets it at once.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

SESSION_COOKIE = "quarry_console_session"
# The sign-in form's CSRF token lives in its own short cookie (double submit): there is no
# session to keep it in yet.
LOGIN_COOKIE = "quarry_console_login"
# Memory bound: past this many live sessions, the oldest is forgotten (its user signs in
# again); expired ones go first.
MAX_SESSIONS = 10_000


@dataclass
class Session:
    id: str
    user_id: str
    token: str
    csrf: str
    expires_at: float
    # Cached answers about the user's own permissions (quarry.console.permissions).
    cache: dict = field(default_factory=dict)


class SessionStore:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def create(self, user_id: str, token: str, expires_at: float, replaces: str = "") -> Session:
        """A new session with a fresh id (the id `replaces`, if any, is forgotten)."""
        session = Session(
            id=secrets.token_urlsafe(32),
            user_id=user_id,
            token=token,
            csrf=secrets.token_urlsafe(32),
            expires_at=expires_at,
        )
        with self._lock:
            if replaces:
                self._sessions.pop(replaces, None)
            self._evict()
            self._sessions[session.id] = session
        return session

    def get(self, session_id: str) -> Session | None:
        """The live session of `session_id`; None for an unknown or expired one."""
        if not session_id:
            return None
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return None
            if session.expires_at <= self._clock():
                del self._sessions[session_id]
                return None
            return session

    def delete(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._sessions)

    def _evict(self) -> None:
        now = self._clock()
        for sid in [s.id for s in self._sessions.values() if s.expires_at <= now]:
            del self._sessions[sid]
        while len(self._sessions) >= MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]  # dicts keep insertion order


def check_csrf(expected: str, given: str) -> bool:
    """Whether `given` is the CSRF token `expected`; never true for an empty one."""
    return bool(expected) and bool(given) and hmac.compare_digest(expected, given)


def new_login_token() -> str:
    return secrets.token_urlsafe(32)
