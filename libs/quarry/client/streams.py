"""The client's streaming writes: one PutObjects stream, replayed whole on a retry.

`PutObjectsStream` turns the caller's entries into PutObjectsRequest messages once (cut by
quarry.batching), remembering what was sent so a retry re-sends the same stream (staging is
idempotent by entry identity); `stage_stream` runs it under the client's retry policy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from quarry import errors
from quarry.batching import batches
from quarry.client.entries import as_entry, batch_request_id
from quarry.client.retry import Retrier, RetryPolicy
from quarry.runtime.errors import domain_errors
from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import types_pb2

# A PutObjects message is closed at this many serialized entry bytes even if it holds
# fewer than batch_size entries (entries can carry up to 8 KB of metadata each).
MAX_BATCH_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class StreamTarget:
    """Where a PutObjects stream stages (named by its first message) and how it is cut."""

    repository: str
    branch: str
    batch_size: int = 1000
    max_batch_bytes: int = MAX_BATCH_BYTES
    # "" for none; else message i carries batch_request_id(request_id, i).
    request_id: str = ""


class PutObjectsStream:
    """Turns entries into PutObjectsRequest batches once, remembering what was sent, so a
    retry re-sends the same stream (staging is idempotent by entry identity).

    Each attempt iterates `new_attempt()`; starting a new attempt retires the old iterator,
    so a gRPC consumer thread left over from a failed attempt cannot pull batches from the
    source. An exception of the caller's iterable is kept in `error` and cancels the call
    (instead of surfacing as gRPC's 'Exception iterating requests!')."""

    def __init__(
        self,
        target: StreamTarget,
        entries: Iterable[Any],
        replay: bool,
        progress: Callable[[int], None] | None,
    ) -> None:
        self._target = target
        self._source = batches(
            map(as_entry, entries),
            target.batch_size,
            target.max_batch_bytes,
            types_pb2.Entry.ByteSize,
        )
        self._sent: list[bm.PutObjectsRequest] = []
        self._replay = replay
        self._progress = progress
        self._lock = threading.Lock()
        self._generation = 0
        self.pulled = 0  # requests taken from the source
        self.entries_pulled = 0
        self.exhausted = False
        self.error: BaseException | None = None
        self.call: Any = None

    @property
    def replayable(self) -> bool:
        return self._replay or self.pulled == 0

    def new_attempt(self) -> Iterator[bm.PutObjectsRequest]:
        with self._lock:
            self._generation += 1
            generation = self._generation
        return self._requests(generation)

    def _requests(self, generation: int) -> Iterator[bm.PutObjectsRequest]:
        index = 0
        while True:
            with self._lock:
                if generation != self._generation or self.error is not None:
                    return
                if index < len(self._sent):
                    request = self._sent[index]
                elif self.exhausted:
                    if index > 0:
                        return
                    # An empty stream still names its target (one message, no entries).
                    request = bm.PutObjectsRequest(
                        repository=self._target.repository, branch=self._target.branch
                    )
                else:
                    try:
                        batch = next(self._source)
                    except StopIteration:
                        self.exhausted = True
                        continue
                    except BaseException as exc:  # the caller's iterable failed
                        self.error = exc
                        if self.call is not None:
                            self.call.cancel()
                        return
                    request = self._request(batch)
            index += 1
            yield request

    def _request(self, batch: list[types_pb2.Entry]) -> bm.PutObjectsRequest:
        """The next new message (called under the lock)."""
        request = bm.PutObjectsRequest(entries=batch)
        if self._target.request_id:
            request.request_id = batch_request_id(self._target.request_id, self.pulled)
        if self.pulled == 0:
            request.repository = self._target.repository
            request.branch = self._target.branch
        if self._replay:
            self._sent.append(request)
        self.pulled += 1
        self.entries_pulled += len(batch)
        if self._progress is not None:
            self._progress(self.entries_pulled)
        return request


def stage_stream(
    put_objects: Any,
    stream: PutObjectsStream,
    retry: RetryPolicy,
    timeout: float | None,
    metadata: tuple[tuple[str, str], ...] | None = None,
) -> int:
    """Send `stream` over the PutObjects stream-unary method `put_objects`, again from its
    first message on a retryable failure while the stream is replayable; the server's count.
    The caller's own exception (its iterable failed) wins over the cancelled call's."""

    def source_error() -> BaseException | None:
        return stream.error

    def attempt(_number: int) -> int:
        call = put_objects.future(stream.new_attempt(), timeout=timeout, metadata=metadata)
        stream.call = call
        if stream.error is not None:  # failed before the call object was known
            call.cancel()
        try:
            with domain_errors(source_error):
                count = call.result().count
        except grpc.FutureCancelledError:
            if stream.error is not None:
                raise stream.error from None
            raise errors.Cancelled("PutObjects was cancelled") from None
        if stream.error is not None:  # the stream ended early on the caller's error
            raise stream.error
        return count

    def before_retry(_exc: errors.QuarryError) -> bool:
        return stream.replayable

    return Retrier(retry, "BranchManager/PutObjects").run(attempt, before_retry)


__all__ = ["MAX_BATCH_BYTES", "StreamTarget", "PutObjectsStream", "stage_stream"]
