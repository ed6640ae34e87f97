"""A clock a test moves forward instead of sleeping past a constant (a cache's lifetime, a
grace period): real time plus what the test added."""

from __future__ import annotations

import time
from collections.abc import Callable


class MovableClock:
    def __init__(self, base: Callable[[], float] = time.monotonic) -> None:
        self._base = base
        self._offset = 0.0

    def __call__(self) -> float:
        return self._base() + self._offset

    def advance(self, seconds: float) -> None:
        self._offset += seconds
