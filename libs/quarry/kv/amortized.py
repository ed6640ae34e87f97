"""Amortized reads: identical concurrent `get`s share one backend read (ARCHITECTURE.md §3).

Hot keys (branch records above all: every staged write reads its branch twice) are read by
many requests at once. Instead of sending each to the backend, requests for the same
(partition, key) join a *flight*:

  1. the first request opens a flight and becomes its leader;
  2. the leader waits `window_seconds` so that others can join;
  3. the leader CLOSES the flight (no one can join any more) and only then issues the
     backend read;
  4. the result, or the error (KeyNotFound included), is handed to every member.

Read-after-write: a shared read may only answer requests that arrived before it was issued.
Step 3 guarantees it: joining and closing both happen under one lock, and closing happens
before the read is issued, so every member joined before the read started. A request that
arrives while a read is in progress finds no open flight and opens a new one, whose read is
issued after the request arrived, and therefore after any write that completed before it.

Everything other than `get` passes straight through.
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from quarry.kv import store


@dataclass(frozen=True)
class AmortizationStats:
    """Counters since construction: `requests` gets answered by `backend_reads` reads."""

    requests: int
    backend_reads: int


class _Flight:
    """One backend read shared by every request that joined before it was issued."""

    __slots__ = ("done", "result", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: store.GetResult | None = None
        self.error: BaseException | None = None


class AmortizedStore(store.Store):
    """Shares one backend `get` among identical requests arriving within `window_seconds`.

    Every `get` pays up to `window_seconds` of extra latency (the leader's wait); with
    `window_seconds=0` requests share a read only if they race into the same instant.
    `sleep` is injectable so tests can hold a flight open deterministically.
    """

    def __init__(self, inner: store.Store, window_seconds: float = 0.002,
                 sleep: Callable[[float], None] = time.sleep):
        if window_seconds < 0:
            raise ValueError(f"window_seconds must be >= 0, got {window_seconds}")
        self.inner = inner
        self.window_seconds = window_seconds
        self._sleep = sleep
        self._lock = threading.Lock()
        # Flights still accepting members, i.e. whose backend read is NOT yet issued.
        self._open_flights: dict[tuple[bytes, bytes], _Flight] = {}
        self._requests = 0
        self._backend_reads = 0

    def stats(self) -> AmortizationStats:
        with self._lock:
            return AmortizationStats(requests=self._requests, backend_reads=self._backend_reads)

    def get(self, partition: bytes, key: bytes) -> store.GetResult:
        flight_key = (_hashable(partition), _hashable(key))
        with self._lock:
            self._requests += 1
            flight = self._open_flights.get(flight_key)
            is_leader = flight is None
            if is_leader:
                flight = _Flight()
                self._open_flights[flight_key] = flight

        if is_leader:
            return self._lead(flight_key, flight)

        flight.done.wait()
        if flight.error is not None:
            # Each member gets its own copy: raising one exception object from several
            # threads would splice their tracebacks together.
            raise _copy_error(flight.error)
        return flight.result

    def _lead(self, flight_key: tuple[bytes, bytes], flight: _Flight) -> store.GetResult:
        try:
            try:
                if self.window_seconds > 0:
                    self._sleep(self.window_seconds)
            finally:
                # Close BEFORE issuing the read: later arrivals must open a new flight.
                with self._lock:
                    del self._open_flights[flight_key]
                    self._backend_reads += 1
            flight.result = self.inner.get(*flight_key)
            return flight.result
        except BaseException as error:
            # Whatever happened, the members waiting on this flight must hear about it.
            flight.error = error
            raise
        finally:
            flight.done.set()

    # ---- pass-through ----------------------------------------------------------------

    def set(self, partition: bytes, key: bytes, value: bytes) -> None:
        self.inner.set(partition, key, value)

    def set_if(self, partition: bytes, key: bytes, value: bytes,
               predicate: store.Predicate) -> None:
        self.inner.set_if(partition, key, value, predicate)

    def delete(self, partition: bytes, key: bytes) -> None:
        self.inner.delete(partition, key)

    def scan(self, partition: bytes, start: bytes = b"", end: bytes | None = None,
             batch_size: int = store.DEFAULT_SCAN_BATCH_SIZE) -> store.ScanIterator:
        return self.inner.scan(partition, start, end, batch_size)

    def batch_get(self, items: Sequence[tuple[bytes, bytes]]) -> list[store.GetResult | None]:
        return self.inner.batch_get(items)

    def batch_set(self, items: Sequence[tuple[bytes, bytes, bytes]]) -> None:
        self.inner.batch_set(items)

    def batch_delete(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        self.inner.batch_delete(items)

    def close(self) -> None:
        self.inner.close()


def _hashable(name: bytes) -> bytes:
    # Callers may pass bytearray/memoryview, which cannot be dict keys.
    return bytes(name) if isinstance(name, (bytearray, memoryview)) else name


def _copy_error(error: BaseException) -> BaseException:
    try:
        return copy.copy(error)
    except Exception:
        # Some exception types cannot be rebuilt from their args; share the original.
        return error
