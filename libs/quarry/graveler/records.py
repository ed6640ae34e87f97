"""Decoding stored KV records: the one place where bytes from the KV store become messages.

A record that cannot be decoded, or decodes into something its key contradicts (protobuf
parses many byte strings without complaint, so garbage could otherwise pass as an empty
record), is a `CorruptRecord`: DATA_LOSS with ErrorInfo reason CORRUPT_RECORD and the
partition and key in its metadata. It fails only the calls that need that record.

Listings are the exception: inside a `listing()` scope a corrupt record is skipped instead,
and counted three ways — a Prometheus counter, a log line naming partition and key, and the
scope's tally, which the servicers return as `skipped_corrupt_records` in the response.
Outside a listing scope (a commit reading its staged changes, a branch read for a write)
nothing is ever skipped: silently dropping a record there would lose data.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from google.protobuf.message import Message
from prometheus_client import Counter

# Defined with the core's other errors (clients rebuild it by its reason without loading
# this module's Prometheus counters); here for the decoders and their callers.
from quarry.graveler.errors import CorruptRecord, show

log = logging.getLogger(__name__)

CORRUPT_RECORDS_SKIPPED = Counter(
    "quarry_corrupt_records_skipped",
    "Stored KV records a listing or background scan skipped because they cannot be decoded",
    ["record"],
)
CORRUPT_RECORDS_PARKED = Counter(
    "quarry_corrupt_records_parked",
    "Corrupt work items a background loop moved aside (parked) so it could carry on",
    ["record"],
)


# ---- what each record must hold ---------------------------------------------------------------


M = TypeVar("M", bound=Message)
F = TypeVar("F", bound=Callable[..., Any])


def decode_record(
    message_type: type[M],
    partition: bytes,
    key: bytes,
    value: bytes,
    check: Callable[[Any, bytes], str | None] | None = None,
) -> M:
    """Parse `value` (stored at partition/key) as `message_type` and `check` what a record
    of that type must hold (quarry.graveler.layout knows that: it returns the problem, or
    None). CorruptRecord if either fails."""
    record = message_type.__name__
    try:
        message = message_type.FromString(value)
    except Exception as exc:  # DecodeError, and whatever else a parser raises
        raise CorruptRecord(
            f"corrupt {record} at {show(partition)}/{show(key)}: it cannot "
            f"be decoded ({type(exc).__name__})",
            partition=partition,
            key=key,
            record=record,
        ) from None
    problem = check(message, bytes(key)) if check is not None else None
    if problem:
        raise CorruptRecord(
            f"corrupt {record} at {show(partition)}/{show(key)}: {problem}",
            partition=partition,
            key=key,
            record=record,
        )
    return message


# ---- listings skip ------------------------------------------------------------------------------


class SkippedRecords:
    """The corrupt records a listing skipped (each counted once, however often re-read)."""

    def __init__(self) -> None:
        self.keys: set[tuple[bytes, bytes]] = set()

    @property
    def count(self) -> int:
        return len(self.keys)

    def leave_to_next_page(self, start_key: bytes) -> None:
        self.keys = {k for k in self.keys if k[1] < start_key}


_LISTING: contextvars.ContextVar[SkippedRecords | None] = contextvars.ContextVar(
    "quarry_listing_skips", default=None
)


@contextlib.contextmanager
def listing() -> Iterator[SkippedRecords]:
    """A scope in which corrupt records are skipped (see the module docstring). Nested
    scopes share the outer tally, so a servicer can read what the domain call skipped."""
    current = _LISTING.get()
    if current is not None:
        yield current
        return
    tally = SkippedRecords()
    token = _LISTING.set(tally)
    try:
        yield tally
    finally:
        _LISTING.reset(token)


def skips_corrupt_records(method: F) -> F:
    """Run a listing method in a listing() scope (joining the caller's, if any)."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with listing():
            return method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def skip(exc: CorruptRecord) -> None:
    """Inside a listing: count and log the corrupt record and return (the caller skips it).
    Outside: raise it — only a listing may leave a record out."""
    tally = _LISTING.get()
    if tally is None:
        raise exc
    note_skipped(exc)
    tally.keys.add((bytes(exc.partition), bytes(exc.key)))


def next_page_starts_at(start_key: bytes) -> None:
    """A listing page ended and the next one starts at `start_key`: the corrupt records
    skipped at or after it (read while looking for the end of this page) are the next
    page's, which sees them again, so this page's tally does not count them."""
    tally = _LISTING.get()
    if tally is not None:
        tally.leave_to_next_page(start_key)


def note_skipped(exc: CorruptRecord) -> None:
    """Metric and log line for a corrupt record a listing or background scan skipped."""
    CORRUPT_RECORDS_SKIPPED.labels(exc.record).inc()
    log.warning(
        "skipping corrupt record: partition=%s key=%s: %s",
        show(exc.partition),
        show(exc.key),
        exc.message,
    )


def decode_or_skip(
    message_type: type[M],
    partition: bytes,
    key: bytes,
    value: bytes,
    check: Callable[[Any, bytes], str | None] | None = None,
) -> M | None:
    """decode_record, but None (skipped and counted) for a corrupt record in a listing."""
    try:
        return decode_record(message_type, partition, key, value, check)
    except CorruptRecord as exc:
        skip(exc)
        return None


__all__ = [
    "CorruptRecord",
    "decode_record",
    "decode_or_skip",
    "listing",
    "skips_corrupt_records",
    "next_page_starts_at",
    "skip",
    "note_skipped",
    "SkippedRecords",
    "show",
    "CORRUPT_RECORDS_SKIPPED",
    "CORRUPT_RECORDS_PARKED",
]
