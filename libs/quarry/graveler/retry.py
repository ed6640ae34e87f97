"""The one retry policy of the core: a budget of attempts and a jittered exponential backoff.

Every loop that redoes work because the branch record (the only compare-and-swap point,
docs/architecture.md §4) changed under it runs through `RetryPolicy.attempts`, and every
compare-and-swap of a branch record through `RefManager.update_branch`, which uses it too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from opentelemetry import trace

from quarry import jitter
from quarry.errors import QuarryError

# The defaults; a service takes its limits from Settings (branch_retry_*, merge_retry_attempts,
# quarry.runtime.wiring) and the core carries them (Core.retries).
MAX_ATTEMPTS = 10
MAX_MERGE_ATTEMPTS = 5
BASE_SECONDS = 0.002
CAP_SECONDS = 0.2


def cas_retry(step: str, attempt: int) -> None:
    """A lost compare-and-swap (or a read invalidated by one), as an event on the current
    span: `cas.retry` {step, attempt}."""
    trace.get_current_span().add_event("cas.retry", {"step": step, "attempt": attempt})


@dataclass(frozen=True)
class RetryPolicy:
    """`max_attempts` attempts (a count, unlike the client's time budget); before attempt
    n+1 sleep jitter.backoff(n, base, cap): min(cap, base * 2**n) times a factor in
    (0.5, 1]. `sleep` is injectable (tests)."""

    max_attempts: int = MAX_ATTEMPTS
    base_seconds: float = BASE_SECONDS
    cap_seconds: float = CAP_SECONDS
    sleep: Callable[[float], None] = time.sleep

    def backoff(self, attempt: int) -> None:
        """Sleep before the retry that follows failed attempt number `attempt` (0-based)."""
        self.sleep(jitter.backoff(attempt, self.base_seconds, self.cap_seconds))

    def attempts(self, exhausted: Callable[[], QuarryError]) -> Iterator[int]:
        """Attempt numbers 0..max_attempts-1, backing off between them; when the caller asks for
        one more after the last, raises `exhausted()` (typically BranchContended). The
        caller leaves the loop (return/break) on success."""
        for attempt in range(self.max_attempts):
            if attempt:
                self.backoff(attempt - 1)
            yield attempt
        raise exhausted()


DEFAULT_RETRY = RetryPolicy()
# The merge's retry budget: each retry merges the previous result onto the new HEAD.
MERGE_RETRY = RetryPolicy(max_attempts=MAX_MERGE_ATTEMPTS)


@dataclass(frozen=True)
class Retries:
    """The core's retry limits (Core.retries): `branch` for every branch compare-and-swap
    and every loop that redoes work because a branch record changed under it; `merge` for
    a merge's attempts. A service's come from Settings (quarry.runtime.wiring)."""

    branch: RetryPolicy = DEFAULT_RETRY
    merge: RetryPolicy = MERGE_RETRY


DEFAULT_RETRIES = Retries()
# A single compare-and-swap against a record read earlier: the caller decides what a loss
# means (a merge resumes from its result, the sensor skips the branch).
ONCE = RetryPolicy(max_attempts=1)

__all__ = [
    "DEFAULT_RETRIES",
    "DEFAULT_RETRY",
    "MAX_ATTEMPTS",
    "MAX_MERGE_ATTEMPTS",
    "MERGE_RETRY",
    "ONCE",
    "Retries",
    "RetryPolicy",
]
