"""StagingReporter: branch-manager's side of the compactor-sensor.

`record(repository, branch, staging_token, puts, deletes)` is called after every
acknowledged write. It only adds to an in-memory dict under a lock: no I/O, never waits for
the sensor. A background thread sends everything recorded since the last flush every
`interval_seconds` in ONE ReportStagingActivity call with a short deadline. When the sensor
is down, slow or unreachable the batch is dropped and counted
(quarry_staging_reports_dropped_total, one per repository/branch/token line of a batch):
writes never wait or fail because of the sensor, and the sensor rebuilds what it missed
from the KV store. Memory is bounded: at most `max_pending` distinct lines wait between two
flushes (more are dropped and counted).
"""

from __future__ import annotations

import logging
import threading

import grpc
from prometheus_client import Counter

from quarry import telemetry
from quarry.runtime.channels import TokenSource, open_channel
from quarry.runtime.periodic import PeriodicWorker
from quarry.runtime.tls import ChannelSecurity
from quarry.telemetry.metrics import expose
from quarry.v1 import compactor_sensor_pb2 as pb
from quarry.v1 import compactor_sensor_pb2_grpc

log = logging.getLogger(__name__)

REPORTS_DROPPED = Counter(
    "quarry_staging_reports_dropped",
    "Staging activity report lines (repository, branch, staging token) branch-manager could "
    "not deliver to the compactor-sensor",
    registry=None,
)
REPORTS_SENT = Counter(
    "quarry_staging_reports_sent",
    "Staging activity report lines delivered to the compactor-sensor",
    registry=None,
)


class StagingReporter:
    def __init__(
        self,
        target: str | grpc.Channel,
        interval_seconds: float = 0.5,
        timeout_seconds: float = 1.0,
        max_pending: int = 100_000,
        token_source: TokenSource | None = None,
        security: ChannelSecurity | None = None,
    ):
        """`token_source`: branch-manager's service token, and `security` its channel
        security (open_channel), for a reporter opened on an address (the sensor takes
        reports from Quarry's services only)."""
        expose(REPORTS_DROPPED, REPORTS_SENT)
        if isinstance(target, str):
            # Flushed by a PeriodicWorker, i.e. under an unsampled context: background
            # batches belong to no user request, and neither end records a span for them.
            self._channel = open_channel(target, token_source=token_source, security=security)
            self._owns_channel = True
        else:
            self._channel, self._owns_channel = target, False
        self.target = target if isinstance(target, str) else ""
        self._stub = compactor_sensor_pb2_grpc.CompactorSensorStub(self._channel)
        self.interval_seconds = interval_seconds
        self.timeout_seconds = timeout_seconds
        self.max_pending = max_pending
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str, str], list[int]] = {}
        self._flush_lock = threading.Lock()  # one flush at a time (loop and stop)
        # An undelivered batch is dropped and logged by flush itself: keep the interval.
        self._worker = PeriodicWorker(
            "staging-reporter", self._flush_step, interval_seconds, retry_initial=interval_seconds
        )
        self._failing = False
        self.sent = 0  # report lines delivered / dropped by this reporter (tests, logs)
        self.dropped = 0

    # ---- the write path -------------------------------------------------------------------

    def record(
        self, repository: str, branch: str, staging_token: str, puts: int, deletes: int
    ) -> None:
        """Add a write's counts to the next batch. Memory only; never blocks on the sensor."""
        if not puts and not deletes:
            return
        key = (repository, branch, staging_token or "")
        with self._lock:
            counts = self._pending.get(key)
            if counts is not None:
                counts[0] += puts
                counts[1] += deletes
                return
            if len(self._pending) < self.max_pending:
                self._pending[key] = [puts, deletes]
                return
            self.dropped += 1
        REPORTS_DROPPED.inc()

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    # ---- the background side ------------------------------------------------------------------

    def flush(self) -> bool:
        """Send what was recorded since the last flush; drop it if the sensor does not take
        it within the deadline. True if delivered (or nothing to send)."""
        with self._flush_lock:
            with self._lock:
                batch, self._pending = self._pending, {}
            if not batch:
                return True
            request = pb.ReportStagingActivityRequest(
                reports=[
                    pb.StagingActivityReport(
                        repository=repository,
                        branch=branch,
                        staging_token=token,
                        puts=counts[0],
                        deletes=counts[1],
                    )
                    for (repository, branch, token), counts in batch.items()
                ]
            )
            try:
                with telemetry.background():  # also when stop() flushes from another thread
                    self._stub.ReportStagingActivity(request, timeout=self.timeout_seconds)
            except grpc.RpcError as error:
                REPORTS_DROPPED.inc(len(batch))
                with self._lock:
                    self.dropped += len(batch)
                if not self._failing:
                    self._failing = True
                    log.warning(
                        "compactor-sensor at %s did not take staging reports (%s); "
                        "dropping them until it does",
                        self.target or "channel",
                        error.code() if hasattr(error, "code") else error,
                    )
                return False
            REPORTS_SENT.inc(len(batch))
            with self._lock:
                self.sent += len(batch)
            if self._failing:
                self._failing = False
                log.info(
                    "compactor-sensor at %s takes staging reports again", self.target or "channel"
                )
            return True

    def start(self) -> StagingReporter:
        self._worker.start()
        return self

    def _flush_step(self) -> None:
        self.flush()

    def stop(self, flush: bool = True) -> None:
        """Stop the loop, send what is left (best effort, one short call), close."""
        self._worker.stop(timeout=self.timeout_seconds + 1)
        if flush:
            try:
                self.flush()
            except Exception:
                log.warning("staging reporter: final flush failed", exc_info=True)
        if self._owns_channel:
            self._channel.close()
