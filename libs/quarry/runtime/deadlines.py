"""Deadlines and cancellation across hops: the one mechanism.

A client's deadline (and its cancelling the call) must reach every call the work it asked
for makes, and the long loops of that work: otherwise a commit whose client gave up after
one second goes on for minutes in the committer and the range-writer, holding their
threads and cores, and may still move the branch long after the client was told it failed.

- `DeadlineInterceptor` (quarry.runtime.deadline_interceptor, on every server) records each incoming
  call's deadline (`context.time_remaining()`) and `context.is_active` in a context
  variable while its handler runs (in the handler's thread).
- Every outgoing call takes its timeout from `timeout(default)`: the smaller of its own
  default and what remains of the incoming call's deadline; a call made after the incoming
  one expired or was cancelled is not made (DeadlineExceeded / Cancelled). gRPC sends that
  timeout on as the callee's deadline, so the next hop carries it on the same way.
- Long work calls `check()` at its loop points (the range loops of apply and merge, the
  commit and merge flows before their branch swap): it raises DeadlineExceeded or
  Cancelled, so the work stops with nothing half-done (ranges already written are only
  unreferenced files for GC).

Work with no incoming call (background loops: the dropper, readiness probes, reporters) and
work handed to other threads sees no incoming call: its own defaults apply, as before.
`captured()` hands the current call to a thread that works for it (a request stream's
producer, which gRPC runs on a thread of its own).

This module imports no gRPC: the core (graveler, committed, kv) calls `check()` and
`timeout()` at its loop points and stays free of the RPC layer (tests/unit/test_architecture.py);
only the server-side interceptor, in its own module, knows gRPC.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from quarry import errors


@dataclass(frozen=True)
class IncomingCall:
    """The call being served: its deadline (time.monotonic() seconds; None = none) and
    whether the client is still waiting for it."""

    method: str
    deadline: float | None
    is_active: Callable[[], bool]

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def check(self) -> None:
        """Raise DeadlineExceeded once the deadline passed, Cancelled once the client
        cancelled (or the call otherwise ended)."""
        remaining = self.remaining()
        if remaining is not None and remaining <= 0:
            raise errors.DeadlineExceeded(
                f"{self.method}: the caller's deadline passed; stopped",
                metadata={"method": self.method},
            )
        if not self.is_active():
            raise errors.Cancelled(
                f"{self.method}: the caller cancelled the call; stopped",
                metadata={"method": self.method},
            )


_current: ContextVar[IncomingCall | None] = ContextVar("quarry_incoming_call", default=None)


def current() -> IncomingCall | None:
    """The incoming call this thread works for, if any."""
    return _current.get()


def check() -> None:
    """At a loop point of long work: stop (DeadlineExceeded / Cancelled) once the incoming
    call expired or was cancelled; nothing without an incoming call."""
    call = _current.get()
    if call is not None:
        call.check()


def timeout(default: float) -> float:
    """The timeout of an outgoing call: `default`, shortened to what remains of the incoming
    call's deadline. Raises instead of calling once the incoming call has ended."""
    call = _current.get()
    if call is None:
        return default
    call.check()
    remaining = call.remaining()
    return default if remaining is None else min(default, remaining)


@contextlib.contextmanager
def serving(call: IncomingCall | None) -> Iterator[None]:
    """Run the body as working for `call` (None: for no call)."""
    token = _current.set(call)
    try:
        yield
    finally:
        # A streaming handler's generator may be closed from another context (garbage
        # collection): the variable then dies with the thread's next call anyway.
        with contextlib.suppress(ValueError, RuntimeError):
            _current.reset(token)


def captured() -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A wrapper for an iterator consumed by another thread (a request stream, which gRPC
    reads on a thread of its own): the iterator then works for the current incoming call,
    and stops once that call expired or was cancelled."""
    call = _current.get()

    def wrap(items: Iterator[Any]) -> Iterator[Any]:
        with serving(call):
            for item in items:
                if call is not None:
                    call.check()
                yield item

    return wrap
