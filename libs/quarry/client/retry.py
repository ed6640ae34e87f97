"""Retrying remote calls: jittered exponential backoff inside a total time budget.

Only the retryable codes are retried: ABORTED and UNAVAILABLE, and RESOURCE_EXHAUSTED
when it carries a google.rpc.RetryInfo (throttling; without one it is permanent, e.g. a
message over a size limit, and fails at once). A RetryInfo the server attaches
(`exc.retry_delay`) replaces the computed delay. Every retry
is recorded as a `quarry.client.retry` event on the current OpenTelemetry span.

A retry re-sends the very same request message, so a mutating call keeps its request_id
(set once per logical call by quarry.client.Client) across attempts: a retry after a lost
answer is answered by the server with the first result (ABORTED / REQUEST_IN_PROGRESS,
retried here, while the first attempt still runs).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from opentelemetry import trace

from quarry import errors, jitter
from quarry.jitter import fraction as random_fraction
from quarry.runtime.errors import RETRYABLE_CODES, is_retryable

T = TypeVar("T")

RETRY_EVENT = "quarry.client.retry"


@dataclass(frozen=True)
class RetryPolicy:
    """How the client retries calls that failed with a retryable code.

    The n-th retry waits ``min(max_delay, base_delay * multiplier**(n-1))`` scaled by a
    random factor in ``[1 - jitter, 1]``, or exactly the server's RetryInfo delay when it
    sends one. No retry starts after ``budget`` seconds from the first attempt (a sleep that
    would end past the budget is not taken), and at most ``max_attempts`` attempts are made
    (0 = limited by the budget only).
    """

    max_attempts: int = 10
    base_delay: float = 0.05
    max_delay: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.5
    budget: float = 30.0
    retryable_codes: frozenset = RETRYABLE_CODES

    def __post_init__(self) -> None:
        if self.max_attempts < 0:
            raise ValueError("max_attempts may not be negative")
        if self.base_delay < 0 or self.max_delay < 0 or self.budget < 0:
            raise ValueError("delays and budget may not be negative")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be within [0, 1]")
        if self.multiplier < 1:
            raise ValueError("multiplier must be at least 1")

    @classmethod
    def none(cls) -> RetryPolicy:
        """Never retry."""
        return cls(max_attempts=1)

    def replace(self, **changes: Any) -> RetryPolicy:
        return dataclasses.replace(self, **changes)

    def backoff(self, retry_number: int, rng: Callable[[], float] = random_fraction) -> float:
        """The jittered delay before retry `retry_number` (1-based)."""
        return jitter.backoff(
            retry_number - 1,
            self.base_delay,
            self.max_delay,
            low=1.0 - self.jitter,
            multiplier=self.multiplier,
            draw=rng,
        )

    def is_retryable(self, exc: errors.QuarryError) -> bool:
        return is_retryable(exc, self.retryable_codes)


class Retrier:
    """Runs one logical call under a RetryPolicy. `attempt()` raises QuarryError."""

    def __init__(
        self,
        policy: RetryPolicy,
        method: str,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.policy = policy
        self.method = method
        self._sleep = sleep
        self._clock = clock

    def run(
        self,
        attempt: Callable[[int], T],
        before_retry: Callable[[errors.QuarryError], bool] | None = None,
    ) -> T:
        """Call `attempt(attempt_number)` until it returns or fails for good.

        `before_retry(exc)` may veto a retry (return False), e.g. when a stream cannot be
        replayed, or adjust the next request."""
        policy = self.policy
        start = self._clock()
        number = 1
        while True:
            try:
                return attempt(number)
            except errors.QuarryError as exc:
                if not policy.is_retryable(exc):
                    raise
                if policy.max_attempts and number >= policy.max_attempts:
                    raise
                if exc.retry_delay is not None and exc.retry_delay >= 0:
                    delay, source = exc.retry_delay, "server"
                else:
                    delay, source = policy.backoff(number), "backoff"
                elapsed = self._clock() - start
                if elapsed + delay > policy.budget:
                    raise
                if before_retry is not None and before_retry(exc) is False:
                    raise
                _record_retry(self.method, number, exc, delay, source, elapsed)
                if delay > 0:
                    self._sleep(delay)
                number += 1


def _record_retry(
    method: str, attempt: int, exc: errors.QuarryError, delay: float, source: str, elapsed: float
) -> None:
    span = trace.get_current_span()
    code = getattr(exc.code, "name", str(exc.code))
    span.add_event(
        RETRY_EVENT,
        {
            "rpc.method": method,
            "quarry.retry.attempt": attempt,
            "rpc.grpc.status_code": code,
            "quarry.error.reason": exc.reason,
            "quarry.error.message": str(exc)[:500],
            "quarry.retry.delay_seconds": float(delay),
            "quarry.retry.delay_source": source,
            "quarry.retry.elapsed_seconds": float(elapsed),
        },
    )


__all__ = ["RetryPolicy", "Retrier", "RETRY_EVENT"]
