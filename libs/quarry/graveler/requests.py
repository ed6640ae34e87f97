"""RequestLog: a mutating call that carries a request_id (AIP-155) takes effect at most once.

Safety rule: while a call's successful result is recorded (within the retention window) or
its first run still holds a live claim, a repeat with the same id must NEVER run the call
again, and must never be answered with a result recorded for a *different* request (the
fingerprints must match, else REQUEST_ID_REUSED). Failed calls are never recorded: their
retries run again.

Record: key `requests/<id>` (KEY_PREFIX) → RequestRecord, in the partition the call changes:
the repository's (`repo/<repo>/<instance>`), or `quarry` for CreateRepository and
DeleteRepository (whose effect outlives or precedes the repository's partition).

A call with an id (fresh id: 2 conditional KV writes, no read; a repeat: 1 failed
conditional write + 1 read; a failed call: 2 conditional writes):
1. claim: SetIf-absent PENDING{fingerprint, owner, now}. If the key exists, Get it:
   DONE within the retention window → same fingerprint: the stored response, nothing runs;
   PENDING whose lease is live → same fingerprint: ABORTED / REQUEST_IN_PROGRESS (retry);
   RELEASED, DONE past the retention window, PENDING past its lease → taken over with
   SetIf-equals (a crashed first attempt does not block its id for longer than the lease).
2. the call runs; a background renewer refreshes the PENDING record (SetIf-equals) every
   lease/3 while it runs, so a live call keeps its claim however long it takes (short calls
   cost no renewal).
3. success: SetIf-equals(our PENDING) → DONE{response}; failure: → RELEASED, re-raised.

Remaining windows (the KV store has no multi-key transactions, so the effect and the DONE
record are two writes):
- the process dies after the effect and before the DONE write. (A DONE write that fails,
  e.g. the KV store is unreachable, is retried by the renewer while the claim's lease
  lasts, and the answer is returned meanwhile: a repeat gets the first answer once the
  store is back.) The window is those KV writes: work that follows the effect without
  changing the answer (post-event hooks) runs after the DONE write (`after_recorded`).
  After the lease a repeat runs the call again (a Commit then answers NO_CHANGES or
  commits what was staged since; a Merge merges again, usually nothing);
- a call whose renewals fail for a whole lease (KV unreachable, process stalled) may be
  taken over by a repeat; both may then take effect (the stalled one's DONE write fails
  and is logged);
- a repository deleted and re-created under the same name has a new partition: a repeat
  of a call made on the old one runs on the new one.

Expired records are not deleted on expiry: an expired record counts as absent and is
overwritten in place by the next use of its id; every record of a repository goes with its
partition when the repository is deleted; and each process runs `purge_expired` hourly over
the partitions it wrote records to (RequestLog's background thread).
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf import message as pb_message
from opentelemetry import trace
from prometheus_client import Counter

from quarry import errors
from quarry.graveler import layout, names
from quarry.graveler.layout import QUARRY_PARTITION, REQUESTS_PREFIX
from quarry.kv import store as kv
from quarry.runtime import deadlines
from quarry.runtime.periodic import PeriodicWorker
from quarry.storage.v1 import records_pb2

log = logging.getLogger(__name__)

KEY_PREFIX = REQUESTS_PREFIX  # the storage layout's (quarry.graveler.layout)
DEFAULT_RETENTION_SECONDS = 24 * 3600.0
DEFAULT_LEASE_SECONDS = 30.0
PURGE_INTERVAL_SECONDS = 3600.0
# Claim attempts when the record keeps changing under us (takeovers racing each other).
MAX_CLAIM_ATTEMPTS = 5

_UUID = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
    r"[0-9a-fA-F]{12}$"
)

PENDING = records_pb2.REQUEST_STATE_PENDING
DONE = records_pb2.REQUEST_STATE_DONE
RELEASED = records_pb2.REQUEST_STATE_RELEASED

T = TypeVar("T")

# run: the call ran under a claim; replayed: answered from the record; in_progress /
# reused: refused; unrecorded: the call ran but its outcome could not be recorded (see
# "remaining windows").
CALLS = Counter("graveler_request_id_calls", "Calls carrying a request id, by outcome", ["outcome"])


class InvalidRequestId(errors.InvalidArgument):
    reason = "INVALID_REQUEST_ID"


class RequestIdReused(errors.InvalidArgument):
    """The id was used for a different request (or another RPC) within the window."""

    reason = "REQUEST_ID_REUSED"


class RequestInProgress(errors.Aborted):
    """A call with this id is running; retry (the repeat then gets its result)."""

    reason = "REQUEST_IN_PROGRESS"


class CorruptRequestRecord(errors.QuarryError):
    code = errors.Code.DATA_LOSS
    reason = "CORRUPT_REQUEST_RECORD"


def check_request_id(request_id: str) -> str:
    """The id in canonical form (lower case); InvalidRequestId unless a 36-character UUID."""
    if not _UUID.match(request_id):
        shown = request_id[:80] + ("..." if len(request_id) > 80 else "")
        raise InvalidRequestId(
            f"request_id {shown!r} is not a UUID (8-4-4-4-12 hex digits, e.g. {uuid.uuid4()})",
            metadata={"request_id": shown},
        )
    return request_id.lower()


def fingerprint(request: pb_message.Message, ignore: Iterable[str] = ()) -> bytes:
    """SHA-256 over the request's message type and its deterministic serialization with
    `request_id` (and the fields in `ignore`, hints that do not change the effect) cleared.
    Every RPC has its own request type, so the same id on another RPC never matches."""
    copy = type(request)()
    copy.CopyFrom(request)
    copy.ClearField("request_id")
    for name in ignore:
        copy.ClearField(name)
    digest = hashlib.sha256(request.DESCRIPTOR.full_name.encode())
    digest.update(b"\x00")
    digest.update(copy.SerializeToString(deterministic=True))
    return digest.digest()


@dataclass(eq=False)  # hashed by identity: kept in a set while it runs
class _Claim:
    partition: bytes
    key: bytes
    value: bytes  # our PENDING record as stored (the SetIf-equals predicate)
    record: records_pb2.RequestRecord
    renewed_at: float
    lock: threading.Lock
    lost: bool = False


@dataclass(frozen=True)
class _Recorded:
    response: bytes


# Work a call asks to run once its outcome is recorded (post-event hooks: they do not change
# the answer, and may take their timeout). None outside RequestLog.run.
_after_recorded: ContextVar[list[Callable[[], None]] | None] = ContextVar(
    "quarry_after_recorded", default=None
)


def after_recorded(work: Callable[[], None]) -> None:
    """Run `work` once the current call's outcome is recorded as DONE (RequestLog.run), or
    now when the call carries no request id. This keeps what follows a call's effect out of
    the window between that effect and its DONE record: a repeat after a crash in that
    window runs the call again (the module's "remaining windows"), so the window must be
    as short as the KV writes themselves, not as long as a webhook's timeout."""
    pending = _after_recorded.get()
    if pending is None:
        work()
    else:
        pending.append(work)


def _run_recorded_work(pending: list[Callable[[], None]]) -> None:
    for work in pending:
        try:
            work()
        except Exception:  # it never changes the answer already recorded
            log.exception("work after a recorded request failed")


class RequestLog:
    """The request log over a KV store (see the module docstring). Thread-safe."""

    def __init__(
        self,
        store: kv.Store,
        repository_partition: Callable[[str], bytes],
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        clock: Callable[[], float] = time.time,
    ):
        """`repository_partition(name)`: the partition of an existing repository
        (NOT_FOUND otherwise), e.g. `lambda n: refs.get_repository(n).partition`."""
        if retention_seconds < 0 or lease_seconds <= 0:
            raise ValueError("retention may not be negative and the lease must be positive")
        self.kv = store
        self._repository_partition = repository_partition
        self.retention_seconds = retention_seconds
        self.lease_seconds = lease_seconds
        self._clock = clock
        self._claims: set[_Claim] = set()  # guarded by _claims_lock; renewed in background
        # Outcomes whose write failed (the KV store unreachable as the call ended), with the
        # record to write: retried by the renewer while the claim's lease lasts, so a repeat
        # gets the first answer once the store is back, not REQUEST_IN_PROGRESS for the
        # whole lease. Guarded by _claims_lock.
        self._unrecorded: dict[_Claim, bytes] = {}
        self._claims_lock = threading.Lock()
        # Renews live claims and purges expired records (a PeriodicWorker, started with
        # the first claim).
        self._renewer = PeriodicWorker("request-claim-renewer", self._renew_step, lease_seconds / 6)
        self._closed = threading.Event()
        # Partitions this process wrote records to since its last purge pass: the background
        # thread purges them every PURGE_INTERVAL_SECONDS (each process cleans up after the
        # calls it served; a partition nobody writes to any more holds only what its last
        # writers left, at most one retention window's worth, until its repository goes).
        self._used: set[bytes] = set()
        self._last_purge = clock()

    # ---- where records live ------------------------------------------------------------

    def partition_for(self, repository: str | None) -> bytes:
        """The repository's partition; the `quarry` partition for None (installation-wide
        calls: CreateRepository, DeleteRepository)."""
        if repository is None:
            return QUARRY_PARTITION
        names.check_repository_name(repository)
        return self._repository_partition(repository)

    # ---- the one entry point -----------------------------------------------------------

    def run(
        self,
        partition: bytes,
        request_id: str,
        request_fingerprint: bytes,
        call: Callable[[], T],
        encode: Callable[[T], bytes],
        decode: Callable[[bytes], T],
    ) -> T:
        """`call()` at most once for `request_id` (see the module docstring): its result, or
        the decoded result of the first successful call with this id and fingerprint."""
        key = layout.request_key(check_request_id(request_id))
        claim = self._claim(partition, key, request_fingerprint)
        if isinstance(claim, _Recorded):
            CALLS.labels("replayed").inc()
            trace.get_current_span().set_attribute("quarry.request_id.replayed", True)
            return decode(claim.response)
        CALLS.labels("run").inc()
        self._track(claim)
        pending: list[Callable[[], None]] = []
        token = _after_recorded.set(pending)
        try:
            result = call()
        except BaseException:
            self._untrack(claim)
            # Outside the caller's deadline: a call that failed because it expired must
            # still release its id at once (it stayed blocked for the claim's lease).
            with deadlines.serving(None):
                self._finish(claim, RELEASED, b"")
            raise
        finally:
            _after_recorded.reset(token)
        self._untrack(claim)
        # Outside the caller's deadline: the effect happened, so its record must be written
        # even when the deadline ran out just after (a retry was answered NO_CHANGES).
        with deadlines.serving(None):
            self._finish(claim, DONE, encode(result))
        _run_recorded_work(pending)
        return result

    def _claim(
        self, partition: bytes, key: bytes, request_fingerprint: bytes
    ) -> _Claim | _Recorded:
        record = records_pb2.RequestRecord(
            state=PENDING, fingerprint=request_fingerprint, owner=uuid.uuid4().hex
        )
        predicate: kv.Predicate = kv.ABSENT
        for _ in range(MAX_CLAIM_ATTEMPTS):
            now = self._clock()
            record.updated_at_ms = int(now * 1000)
            value = layout.encode_request(record)
            deadlines.check()  # the last point to stop: a claim not sent holds nothing
            try:
                # Once sent it completes (the caller's deadline cannot cut it in flight): a
                # claim that landed unanswered held the id for the whole lease.
                with deadlines.serving(None):
                    self.kv.set_if(partition, key, value, predicate)
                return _Claim(partition, key, value, record, now, threading.Lock())
            except kv.PredicateFailed:
                pass
            try:
                current = self.kv.get(partition, key)
            except kv.KeyNotFound:  # purged meanwhile
                predicate = kv.ABSENT
                continue
            existing = _parse(partition, key, current.value)
            age = now - existing.updated_at_ms / 1000.0
            if self._live(existing, age):
                if existing.fingerprint != request_fingerprint:
                    raise _reused(key)
                if existing.state == DONE:
                    return _Recorded(existing.response)
                raise self._in_progress(key, age)
            # Released, expired, or a dead claim: take it over, unless someone else does.
            predicate = kv.Equals(current.predicate)
        raise self._in_progress(key, 0.0)

    def check_not_reused(
        self, partition: bytes, request_id: str, request_fingerprint: bytes
    ) -> None:
        """RequestIdReused if `run` would refuse this id now because it is live for a
        different request; nothing is claimed (one read, no write). For a call made of
        several units of work with ids of their own (PutObjects messages), so a reused id
        is refused before any unit runs; a reuse racing the call is still refused by `run`."""
        key = layout.request_key(check_request_id(request_id))
        try:
            current = self.kv.get(partition, key)
        except kv.KeyNotFound:
            return
        existing = _parse(partition, key, current.value)
        age = self._clock() - existing.updated_at_ms / 1000.0
        if self._live(existing, age) and existing.fingerprint != request_fingerprint:
            raise _reused(key)

    def _live(self, record: records_pb2.RequestRecord, age: float) -> bool:
        """A record that answers or blocks its id: DONE within the retention window, or a
        PENDING claim within its lease."""
        return (record.state == DONE and age <= self.retention_seconds) or (
            record.state == PENDING and age <= self.lease_seconds
        )

    def _in_progress(self, key: bytes, age: float) -> RequestInProgress:
        CALLS.labels("in_progress").inc()
        request_id = layout.name_of(key, KEY_PREFIX)
        return RequestInProgress(
            f"a call with request_id {request_id} is in progress; retry to get its result",
            metadata={"request_id": request_id},
            retry_delay=min(0.5, max(0.05, (self.lease_seconds - age) / 10)),
        )

    def _finish(
        self, claim: _Claim, state: records_pb2.RequestState.ValueType, response: bytes
    ) -> None:
        """Record the outcome over our own PENDING value only. Never raises: the call's
        answer (or error) matters more than its record (see "remaining windows")."""
        with claim.lock:
            record = records_pb2.RequestRecord(
                state=state,
                fingerprint=claim.record.fingerprint,
                response=response,
                owner=claim.record.owner,
                updated_at_ms=int(self._clock() * 1000),
            )
            value = layout.encode_request(record)
            try:
                self.kv.set_if(claim.partition, claim.key, value, kv.Equals(claim.value))
            except kv.PredicateFailed:
                CALLS.labels("unrecorded").inc()
                log.warning(
                    "request %s: the claim was taken over while the call ran; its "
                    "outcome is not recorded",
                    claim.key.decode(),
                )
            except kv.ItemTooLarge:
                # A response too large to keep (a dry-run merge with huge conflicts): let a
                # repeat run again rather than block the id.
                self._release_quietly(claim)
            except Exception:  # see the docstring
                log.warning(
                    "request %s: recording the outcome failed; retried while its claim lasts",
                    claim.key.decode(),
                    exc_info=True,
                )
                self._record_later(claim, value)

    def _release_quietly(self, claim: _Claim) -> None:
        record = records_pb2.RequestRecord(
            state=RELEASED, owner=claim.record.owner, updated_at_ms=int(self._clock() * 1000)
        )
        value = layout.encode_request(record)
        try:
            self.kv.set_if(claim.partition, claim.key, value, kv.Equals(claim.value))
        except kv.PredicateFailed:
            pass  # taken over: not ours to release
        except Exception:
            log.warning("request %s: releasing the claim failed", claim.key.decode(), exc_info=True)
            self._record_later(claim, value)

    def _record_later(self, claim: _Claim, value: bytes) -> None:
        with self._claims_lock:
            if self._closed.is_set():
                CALLS.labels("unrecorded").inc()
                return
            self._unrecorded[claim] = value
            if not self._renewer.running:
                self._renewer.start()

    def _record_unrecorded(self) -> None:
        """Write each outcome whose write failed, over our own PENDING value only; given up
        (a repeat after the lease runs the call again) once the claim's lease has passed or
        the claim was taken over."""
        with self._claims_lock:
            pending = list(self._unrecorded.items())
        for claim, value in pending:
            done = True
            if self._clock() - claim.renewed_at > self.lease_seconds:
                CALLS.labels("unrecorded").inc()
                log.warning("request %s: its outcome was never recorded", claim.key.decode())
            else:
                try:
                    self.kv.set_if(claim.partition, claim.key, value, kv.Equals(claim.value))
                    log.info("request %s: its outcome recorded late", claim.key.decode())
                except kv.PredicateFailed:
                    CALLS.labels("unrecorded").inc()  # taken over meanwhile
                except Exception:
                    done = False  # the store is still away: the next round
            if done:
                with self._claims_lock:
                    self._unrecorded.pop(claim, None)

    # ---- keeping live claims alive -----------------------------------------------------

    def _track(self, claim: _Claim) -> None:
        with self._claims_lock:
            self._claims.add(claim)
            self._used.add(claim.partition)
            if not self._renewer.running and not self._closed.is_set():
                self._renewer.start()

    def _untrack(self, claim: _Claim) -> None:
        with self._claims_lock:
            self._claims.discard(claim)

    def _renew_step(self) -> None:
        """One pass of the renewer: renew claims older than a third of the lease, and purge
        expired records every PURGE_INTERVAL_SECONDS."""
        interval = self.lease_seconds / 3
        with self._claims_lock:
            claims = list(self._claims)
        for claim in claims:
            if self._clock() - claim.renewed_at >= interval:
                self.renew(claim)
        self._record_unrecorded()
        if self._clock() - self._last_purge >= PURGE_INTERVAL_SECONDS:
            self.purge_used()

    def purge_used(self) -> int:
        """purge_expired over the partitions this process wrote records to; a partition is
        remembered until a pass finds no record left in it."""
        with self._claims_lock:
            used = set(self._used)
        self._last_purge = self._clock()
        deleted = 0
        for partition in used:
            try:
                count, kept = self._purge(partition, limit=10_000)
            except Exception:  # the next pass tries again
                log.warning(
                    "purging expired request records of %r failed", partition, exc_info=True
                )
                continue
            deleted += count
            if not kept:
                with self._claims_lock:
                    if not any(c.partition == partition for c in self._claims):
                        self._used.discard(partition)
        return deleted

    def renew(self, claim: _Claim) -> None:
        with claim.lock:
            with self._claims_lock:
                if claim not in self._claims or claim.lost:
                    return  # finished meanwhile
            now = self._clock()
            record = records_pb2.RequestRecord()
            record.CopyFrom(claim.record)
            record.updated_at_ms = int(now * 1000)
            value = layout.encode_request(record)
            try:
                self.kv.set_if(claim.partition, claim.key, value, kv.Equals(claim.value))
            except kv.PredicateFailed:
                claim.lost = True
                log.warning(
                    "request %s: the claim was taken over while the call runs", claim.key.decode()
                )
                return
            except Exception:  # retried on the next round
                log.warning(
                    "request %s: renewing the claim failed", claim.key.decode(), exc_info=True
                )
                return
            claim.value, claim.record, claim.renewed_at = value, record, now

    def close(self) -> None:
        with self._claims_lock:
            self._closed.set()
        self._renewer.stop(timeout=5)

    # ---- cleanup -----------------------------------------------------------------------

    def purge_expired(self, partition: bytes, limit: int = 1000) -> int:
        """Delete up to `limit` records of `partition` that count as absent (DONE past the
        retention window, RELEASED past the lease, PENDING past both). Each is re-read
        right before its (unconditional: the KV store has no conditional delete) delete, so
        only a takeover of that very id in the instant between the read and the delete can
        lose its claim (it then records nothing and logs it). Unreadable records are kept
        for a person to look at. Returns how many it deleted."""
        return self._purge(partition, limit)[0]

    def _purge(self, partition: bytes, limit: int) -> tuple[int, bool]:
        """(records deleted, whether any record was kept or left unread)."""
        now = self._clock()
        doomed: list[bytes] = []
        kept = False
        iterator = self.kv.scan(
            partition, KEY_PREFIX, layout.prefix_end(KEY_PREFIX), batch_size=min(limit, 1000)
        )
        try:
            for item in iterator:
                if len(doomed) >= limit:
                    kept = True
                    break
                if self._expired(item.value, now):
                    doomed.append(item.key)
                else:
                    kept = True
        finally:
            iterator.close()
        deleted = 0
        for key in doomed:
            try:
                current = self.kv.get(partition, key)
            except kv.KeyNotFound:
                continue
            if self._expired(current.value, now):
                self.kv.delete(partition, key)
                deleted += 1
            else:
                kept = True
        return deleted, kept

    def _expired(self, value: bytes, now: float) -> bool:
        record = layout.decode_request(value)
        if record is None:
            return False  # left for a person to look at; never read as a result
        age = now - record.updated_at_ms / 1000.0
        if record.state == DONE:
            return age > self.retention_seconds
        if record.state == PENDING:
            # A dead claim: well past any lease.
            return age > max(self.retention_seconds, self.lease_seconds)
        return record.state == RELEASED and age > self.lease_seconds


def _reused(key: bytes) -> RequestIdReused:
    CALLS.labels("reused").inc()
    request_id = layout.name_of(key, KEY_PREFIX)
    return RequestIdReused(
        f"request_id {request_id} was used for a different request",
        metadata={"request_id": request_id},
    )


def _parse(partition: bytes, key: bytes, value: bytes) -> records_pb2.RequestRecord:
    record = layout.decode_request(value)
    if record is None or record.state not in (PENDING, DONE, RELEASED):
        raise CorruptRequestRecord(
            f"the request record {key.decode(errors='replace')!r} in partition "
            f"{partition.decode(errors='replace')!r} cannot be read",
            metadata={
                "partition": partition.decode(errors="replace"),
                "key": key.decode(errors="replace"),
            },
        )
    return record
