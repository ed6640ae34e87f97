"""Backoff and its random jitter: the library's one backoff formula (`backoff`, over
`exponential`) and only source of randomness for it. Every retry loop (branch CAS retries,
the client's retries, periodic workers, DynamoDB throttling) computes its delays here.

Drawn from a generator of its own, never from the `random` module's global one: that state
belongs to the application (a seeded Spark job, a Hypothesis test), and a background thread
of Quarry's drawing from it would change the sequence the application sees.
"""

from __future__ import annotations

import random
from collections.abc import Callable

_GENERATOR = random.Random()


def uniform(low: float, high: float) -> float:
    """A float in [low, high], without touching the global `random` state."""
    return _GENERATOR.uniform(low, high)


def fraction() -> float:
    """A float in [0, 1), without touching the global `random` state."""
    return _GENERATOR.random()


def exponential(attempt: int, base: float, cap: float, multiplier: float = 2.0) -> float:
    """min(cap, base * multiplier**attempt): the un-jittered delay after failed attempt
    `attempt` (0-based)."""
    return min(cap, base * multiplier**attempt)


def backoff(  # noqa: PLR0913 — the formula's parameters, each with its default
    attempt: int,
    base: float,
    cap: float,
    *,
    low: float = 0.5,
    high: float = 1.0,
    multiplier: float = 2.0,
    draw: Callable[[], float] | None = None,
) -> float:
    """The jittered delay after failed attempt `attempt` (0-based): exponential(...) scaled
    by a factor from `high` down to `low` (`high - (high - low) * draw()`; `draw` a float
    in [0, 1), this module's own generator unless given, e.g. by a test). low=0 is "full
    jitter" (DynamoDB's advice for throttling), low=0.5 "equal jitter"."""
    factor = high - (high - low) * (draw or fraction)()
    return exponential(attempt, base, cap, multiplier) * factor


__all__ = ["backoff", "exponential", "fraction", "uniform"]
