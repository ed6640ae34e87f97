"""Random jitter for backoffs and retries, the library's only source of randomness for them.

Drawn from a generator of its own, never from the `random` module's global one: that state
belongs to the application (a seeded Spark job, a Hypothesis test), and a background thread
of Quarry's drawing from it would change the sequence the application sees.
"""

from __future__ import annotations

import random

_GENERATOR = random.Random()


def uniform(low: float, high: float) -> float:
    """A float in [low, high], without touching the global `random` state."""
    return _GENERATOR.uniform(low, high)


def fraction() -> float:
    """A float in [0, 1), without touching the global `random` state."""
    return _GENERATOR.random()


__all__ = ["fraction", "uniform"]
