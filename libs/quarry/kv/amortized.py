"""Amortized reads: identical concurrent `get`s share one backend read (docs/architecture.md §3).

Hot keys (branch records above all: every staged write reads its branch twice) are read by
many requests at once. Rather than send each of them to the backend, requests for the same
(partition, key) are grouped into *flights*, one backend read each, by "follower batching":

  * per key there is at most one flight IN PROGRESS (its backend read already issued) and at
    most one NEXT flight (its read not issued yet; it is still collecting members);
  * a `get` that finds no read in progress for its key issues its own read at once and
    becomes the in-progress flight: an uncontended `get` waits for nothing but the backend;
  * a `get` that finds a read in progress must not be answered by it (see below), so it
    joins the NEXT flight, creating it (and becoming its leader) if there is none;
  * the leader of NEXT waits for the in-progress flight to finish, then promotes NEXT to
    in-progress and issues its read; every member gets the result, or its own copy of the
    error (KeyNotFound included). Requests arriving after the promotion form a new NEXT;
  * when an in-progress flight finishes with no NEXT behind it, the key is forgotten.

So reads are shared only under concurrency, and then every backend read answers all the
requests that queued up while the previous one was running: at most two reads per key are
ever outstanding or pending, however many requests arrive.

Read-after-write: a shared read may only answer requests that arrived before it was issued
(a write that completed before a request arrived is then visible to the read). Joining a
flight and promoting it (issuing its read) both happen under one lock, and a request only
ever joins a flight whose read has not been issued (a brand-new one or NEXT), never the one
in progress. Hence every member of a flight joined before its read was issued.

Everything other than `get` passes straight through.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from quarry.kv import store
from quarry.runtime import deadlines


@dataclass(frozen=True)
class AmortizationStats:
    """Counters since construction: `requests` gets answered by `backend_reads` reads."""

    requests: int
    backend_reads: int


class _Gate:
    """A one-shot signal: `wait` returns once `open` has been called (exactly once).

    It is a raw lock held while the gate is closed. Each waiter takes the lock and at once
    hands it on, so opening wakes the waiters one after another inside the lock's C code.
    threading.Event would make every woken waiter re-take the Event's Condition lock under
    the GIL, one by one: on a hot branch with 16 clients that was ~10% of branch-manager's
    GIL time. Server threads get no asynchronous exceptions, so a waiter that took the lock
    always hands it on."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def open(self) -> None:
        self._lock.release()

    def wait(self) -> None:
        self._lock.acquire()
        self._lock.release()


class _Flight:
    """One backend read shared by every request that joined before it was issued."""

    __slots__ = ("done", "finished", "result", "error")

    def __init__(self) -> None:
        # Created (under the store's lock) by the first request that waits for this flight:
        # an uncontended get, the common case, allocates no gate and wakes no one.
        self.done: _Gate | None = None
        # Set under the store's lock when the flight ends (before `done` is set).
        self.finished = False
        self.result: store.GetResult | None = None
        self.error: BaseException | None = None

    def waiter(self) -> _Gate:
        """The gate opened when this flight ends. Call under the store's lock, before the
        flight can have finished (a flight still reachable from the map has not)."""
        if self.done is None:
            self.done = _Gate()
        return self.done

    def outcome(self, done: _Gate) -> store.GetResult:
        """For members: wait for the flight (`done`: its waiter()) and return its result or
        raise its error."""
        done.wait()
        if self.error is not None:
            # Each member gets its own copy: raising one exception object from several
            # threads would splice their tracebacks together.
            raise _copy_error(self.error)
        assert self.result is not None  # a flight that did not fail has its result
        return self.result


class _KeyFlights:
    """The flights of one (partition, key): the one in progress and the one collecting."""

    __slots__ = ("in_progress", "next")

    def __init__(self, in_progress: _Flight) -> None:
        self.in_progress = in_progress
        self.next: _Flight | None = None


class AmortizedStore(store.Store):
    """Shares one backend `get` among identical requests that queue up behind a read of the
    same key. Adds no latency when a key is not being read concurrently."""

    def __init__(self, inner: store.Store):
        self.inner = inner
        self._lock = threading.Lock()
        # Keys with a read in progress (and possibly a NEXT flight queued behind it).
        self._flights: dict[tuple[bytes, bytes], _KeyFlights] = {}
        self._requests = 0
        self._backend_reads = 0

    def stats(self) -> AmortizationStats:
        with self._lock:
            return AmortizationStats(requests=self._requests, backend_reads=self._backend_reads)

    def keys_in_flight(self) -> int:
        """Keys with a backend read in progress or queued (0 once every get has returned)."""
        with self._lock:
            return len(self._flights)

    def get(self, partition: bytes, key: bytes) -> store.GetResult:
        flight_key = (_hashable(partition), _hashable(key))
        with self._lock:
            self._requests += 1
            flights = self._flights.get(flight_key)
            if flights is None:
                # Nothing in progress: read now.
                flight = _Flight()
                self._flights[flight_key] = _KeyFlights(flight)
                self._backend_reads += 1
                leads, wait_for = True, None
            elif flights.next is None:
                # A read is in progress, issued before we arrived: lead the next one.
                flight = flights.next = _Flight()
                leads, wait_for = True, flights.in_progress.waiter()
            else:
                flight = flights.next
                leads, wait_for = False, flight.waiter()

        if not leads:
            assert wait_for is not None
            return flight.outcome(wait_for)
        if wait_for is not None:
            self._wait_and_promote(flight_key, flight, wait_for)
        return self._read(flight_key, flight)

    def _wait_and_promote(
        self, flight_key: tuple[bytes, bytes], flight: _Flight, previous_done: _Gate
    ) -> None:
        """As leader of NEXT: wait out the read in progress (`previous_done`: its waiter),
        then make `flight` the one in progress (the caller issues its read). The previous
        read failing does not matter here."""
        try:
            previous_done.wait()
            with self._lock:
                flights = self._flights[flight_key]
                flights.in_progress = flight
                flights.next = None
                self._backend_reads += 1
        except BaseException as error:
            # Interrupted before issuing the read: the members must not wait forever.
            flight.error = error
            self._finish(flight_key, flight)
            raise

    def _read(self, flight_key: tuple[bytes, bytes], flight: _Flight) -> store.GetResult:
        try:
            # Shared by every member of the flight, so it works for none of their calls: its
            # timeout is the store's own, never one caller's deadline, and one caller's
            # cancelling never fails the others (quarry.runtime.deadlines).
            with deadlines.serving(None):
                flight.result = self.inner.get(*flight_key)
            return flight.result
        except BaseException as error:
            # Whatever happened, the members waiting on this flight must hear about it.
            flight.error = error
            raise
        finally:
            self._finish(flight_key, flight)

    def _finish(self, flight_key: tuple[bytes, bytes], flight: _Flight) -> None:
        """End `flight` (in progress, or a NEXT abandoned before its read) and wake its
        members; forget the key once nothing is in progress or queued for it."""
        done = None
        try:
            with self._lock:
                flight.finished = True
                # Every waiter registered under this lock before now; none can after.
                done = flight.done
                flights = self._flights.get(flight_key)
                if flights is not None:
                    if flights.next is flight:
                        flights.next = None
                    if flights.in_progress.finished and flights.next is None:
                        del self._flights[flight_key]
        finally:
            # Also wakes the leader of the NEXT flight, if any, which then promotes it.
            done = done or flight.done
            if done is not None:
                done.open()

    # ---- pass-through ----------------------------------------------------------------

    def set(self, partition: bytes, key: bytes, value: bytes) -> None:
        self.inner.set(partition, key, value)

    def set_if(
        self, partition: bytes, key: bytes, value: bytes, predicate: store.Predicate
    ) -> None:
        self.inner.set_if(partition, key, value, predicate)

    def delete(self, partition: bytes, key: bytes) -> None:
        self.inner.delete(partition, key)

    def delete_if(self, partition: bytes, key: bytes, predicate: store.Equals) -> None:
        self.inner.delete_if(partition, key, predicate)

    def scan(
        self,
        partition: bytes,
        start: bytes = b"",
        end: bytes | None = None,
        batch_size: int = store.DEFAULT_SCAN_BATCH_SIZE,
    ) -> store.ScanIterator:
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
