"""Throttling of Auth/Login: each attempt costs a scrypt of the secret (on purpose: a
guessed secret must be expensive), so an unauthenticated caller could otherwise spend the
server's CPU freely and guess at one key as fast as the CPU allows.

Two token buckets per attempt (quarry.kv.limiter's PartitionLimiter, the one token bucket of
the library): one per access key id, one per client address (the peer without its port).
Each holds a minute of attempts and refills continuously. An attempt is admitted only when
both have a token; otherwise RESOURCE_EXHAUSTED / LOGIN_THROTTLED with a RetryInfo saying
when to try again, and no scrypt is computed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from quarry import errors
from quarry.kv.capacity import READ
from quarry.kv.limiter import PartitionLimiter

DEFAULT_ATTEMPTS_PER_MINUTE_PER_KEY = 60
DEFAULT_ATTEMPTS_PER_MINUTE_PER_ADDRESS = 300
_MINUTE = 60.0


class LoginThrottled(errors.ResourceExhausted):
    """Too many Login attempts for this access key id or from this address."""

    reason = "LOGIN_THROTTLED"


def client_address(peer: str) -> str:
    """The address of a gRPC peer without its port ("ipv4:10.0.0.1:5123" → "ipv4:10.0.0.1",
    "ipv6:[::1]:5123" → "ipv6:[::1]"); a unix socket peer as it is."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6") and ":" in rest:
        return f"{kind}:{rest.rsplit(':', 1)[0]}"
    return peer


class LoginThrottle:
    def __init__(
        self,
        attempts_per_minute_per_key: int = DEFAULT_ATTEMPTS_PER_MINUTE_PER_KEY,
        attempts_per_minute_per_address: int = DEFAULT_ATTEMPTS_PER_MINUTE_PER_ADDRESS,
        clock: Callable[[], float] = time.monotonic,
    ):
        if attempts_per_minute_per_key < 1 or attempts_per_minute_per_address < 1:
            raise ValueError("login attempts per minute must be at least 1")
        self._by_key = self._limiter(attempts_per_minute_per_key, clock)
        self._by_address = self._limiter(attempts_per_minute_per_address, clock)

    @staticmethod
    def _limiter(per_minute: int, clock: Callable[[], float]) -> PartitionLimiter:
        rate = per_minute / _MINUTE
        return PartitionLimiter(rate, rate, clock=clock, burst_seconds=_MINUTE)

    def admit(self, access_key_id: str, peer: str) -> None:
        """Take one attempt for the key and for the caller's address, or LoginThrottled
        (nothing taken from the address when the key is refused)."""
        address = client_address(peer)
        for limiter, what, name in (
            (self._by_key, "access key id", access_key_id),
            (self._by_address, "client address", address),
        ):
            refusal = limiter.try_acquire(READ, {name.encode("utf-8", "replace")[:256]: 1})
            if refusal is not None:
                raise LoginThrottled(
                    f"too many login attempts for this {what}; retry in "
                    f"{refusal.retry_delay:.0f} s",
                    metadata={"throttled_by": what.replace(" ", "_")},
                    retry_delay=refusal.retry_delay,
                )


__all__ = ["LoginThrottle", "LoginThrottled", "client_address"]
