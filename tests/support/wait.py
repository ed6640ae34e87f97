"""The one way tests wait for something to happen: poll a condition until it holds.

Never sleep a fixed time to order events; wait for the observable effect instead."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> T:
    """Call `predicate` until it returns a truthy value and return that value; AssertionError
    naming `what` after `timeout` seconds. Exceptions from `predicate` propagate."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)
