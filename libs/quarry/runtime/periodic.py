"""PeriodicWorker: the one background-loop mechanism of the services.

A daemon thread calls `step()` every `interval` seconds until `stop()`. A step that fails
(raises, or returns False for "not yet") is retried sooner, after a jittered exponential
backoff from `retry_initial` up to `retry_max` seconds, and a step that succeeds resets the
backoff. `stop()` sets `stopping` (long steps check it between units of work) and waits a
bounded time for the thread: a worker never keeps its process from exiting. Steps run under
`telemetry.background()`: a loop's calls belong to no request and emit no spans (work worth
a trace of its own starts one with `telemetry.root_span`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from quarry import jitter, telemetry

log = logging.getLogger(__name__)


class PeriodicWorker:
    def __init__(
        self,
        name: str,
        step: Callable[[], object],  # False: "not yet" (retried sooner); else success
        interval: float,
        retry_initial: float | None = None,
        retry_max: float | None = None,
        first_delay: float | None = None,
    ):
        self.name = name
        self._step = step
        self.interval = interval
        self.retry_initial = interval if retry_initial is None else retry_initial
        self.retry_max = max(self.retry_initial, interval if retry_max is None else retry_max)
        self._first_delay = interval if first_delay is None else first_delay
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures = 0

    def next_delay(self, succeeded: bool) -> float:
        """Seconds until the next step: the interval after a success, else the backoff
        (exponential in the consecutive failures, with full jitter in its upper half)."""
        if succeeded:
            self._failures = 0
            return self.interval
        self._failures += 1
        return jitter.backoff(self._failures - 1, self.retry_initial, self.retry_max)

    def start(self, first_delay: float | None = None) -> PeriodicWorker:
        """Start the loop; its first step runs after `first_delay` (default: the one given
        at construction, else the interval)."""
        if self._thread is None:
            self.stopping.clear()
            if first_delay is not None:
                self._first_delay = first_delay
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        delay = self._first_delay
        while not self.stopping.wait(delay):
            try:
                with telemetry.background():
                    succeeded = self._step() is not False
            except Exception as exc:  # a background loop outlives any failure
                self._log_failure(exc)
                succeeded = False
            else:
                if succeeded and self._failures:
                    log.info(
                        "%s: working again after %d failed pass(es)", self.name, self._failures
                    )
            delay = self.next_delay(succeeded)

    def _log_failure(self, exc: Exception) -> None:
        """Once per streak of failures: a dependency that is down for an hour is one line,
        not thousands. Domain errors (e.g. UNAVAILABLE) without a traceback."""
        if self._failures:
            log.debug("%s: pass failed again: %s", self.name, exc)
            return
        from quarry import errors

        expected = isinstance(exc, errors.QuarryError)
        log.warning(
            "%s: pass failed; retrying with backoff: %s",
            self.name,
            getattr(exc, "message", None) or exc,
            exc_info=not expected,
        )

    def stop(self, timeout: float = 5.0) -> bool:
        """Ask the loop to end and wait up to `timeout` seconds. True if it ended (a step
        blocked past the timeout ends when its own deadline passes or its channel closes)."""
        self.stopping.set()
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        thread.join(timeout=timeout)
        if thread.is_alive():
            log.debug("%s: still busy %.1fs after stop; leaving it", self.name, timeout)
            return False
        return True
