"""The tokens Quarry's services present to each other, and the server-side auth of a service.

Every service process signs its own service tokens with the suite's signing key
(`TokenAuthority.issue_service_token(name)`); `ServiceTokens` is the token source its
outgoing channels ask on every call (quarry.runtime.channels.BearerToken): it mints once and
renews before expiry, so a long-running service never sends an expired token.

Safety rule: nothing here invents a signing key or turns auth off on its own: with auth on
and no key, `service_auth` raises SigningKeyMissing and the service does not start.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from quarry.auth.keys import resolve_signing_key
from quarry.auth.tokens import TokenAuthority
from quarry.config import Settings

# Renew this long before expiry (capped at a tenth of the lifetime for short lifetimes).
REFRESH_MARGIN_SECONDS = 60.0


class ServiceTokens:
    """A token source: the current service token of `service`, renewed before it expires."""

    def __init__(
        self,
        authority: TokenAuthority,
        service: str,
        lifetime: float,
        clock: Callable[[], float] = time.time,
    ):
        self._authority = authority
        self._service = service
        self._lifetime = lifetime
        self._clock = clock
        self._margin = min(REFRESH_MARGIN_SECONDS, lifetime / 10)
        self._lock = threading.Lock()
        self._token = ""
        self._expires_at = 0.0

    def __call__(self) -> str:
        with self._lock:
            if not self._token or self._clock() >= self._expires_at - self._margin:
                self._token, self._expires_at = self._authority.issue_service_token(
                    self._service, self._lifetime
                )
            return self._token


@dataclass(frozen=True)
class ServiceAuth:
    """What a service process needs for auth: the authority that verifies incoming tokens
    and the token source of its outgoing calls."""

    authority: TokenAuthority
    tokens: ServiceTokens


def service_auth(settings: Settings, service: str) -> ServiceAuth | None:
    """The auth of `service` under `settings`; None when auth is off. SigningKeyMissing
    (FAILED_PRECONDITION, with how to fix it) when auth is on and no key is configured."""
    if not settings.auth_enabled:
        return None
    authority = TokenAuthority(resolve_signing_key(settings))
    return ServiceAuth(
        authority,
        ServiceTokens(authority, service, float(settings.auth_token_lifetime_seconds)),
    )


def token_source(settings: Settings, service: str) -> Callable[[], str] | None:
    """The outgoing token source of `service` (None when auth is off)."""
    auth = service_auth(settings, service)
    return auth.tokens if auth is not None else None
