"""RemoteRangeWriter: CommittedManager's write API over the range-writer's gRPC API.

Reads (get_entry, iterate, diff) stay local: any process reads committed data straight from
the object store with its own CommittedManager. Only writes go through the range-writer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import grpc
import pyarrow as pa

from quarry import errors
from quarry.batching import batches
from quarry.blob import ownership as _ownership  # noqa: F401 — error reasons
from quarry.blob.ownership import NamespaceClaim
from quarry.committed import columns
from quarry.committed import errors as _committed_errors  # noqa: F401 — error reasons
from quarry.committed.apply import AppliedRanges
from quarry.committed.format import entry_bytes
from quarry.committed.spans import Span
from quarry.convert import (
    conflict_from_proto,
    put_or_delete_to_proto,
    range_info_from_proto,
    summary_from_proto,
)
from quarry.graveler.model import (
    ApplyResult,
    Change,
    ChangeType,
    DiffSummary,
    Entry,
    MergeResult,
    MergeStrategy,
    RangeInfo,
)
from quarry.runtime import deadlines
from quarry.runtime.channels import channel_for
from quarry.runtime.errors import domain_errors
from quarry.v1 import range_writer_pb2, range_writer_pb2_grpc, types_pb2

# Changes (or entries) per stream message, and a byte budget per message well under the
# 64 MiB gRPC limit (an entry may carry up to ~400 KB of metadata).
BATCH_ITEMS = 1000
BATCH_BYTES = 4 * 1024 * 1024


class _Failure:
    """Remembers an exception raised while producing the request stream: gRPC would only
    report the call as cancelled."""

    def __init__(self) -> None:
        self.error: BaseException | None = None


class RemoteRangeWriter:
    def __init__(
        self,
        target: str | grpc.Channel,
        # Each call's own bound; serving a call, the smaller of it and what remains of that
        # call's deadline (quarry.runtime.deadlines).
        timeout: float = 3600.0,
        batch_items: int = BATCH_ITEMS,
        batch_bytes: int = BATCH_BYTES,
    ):
        self._channel, self._owns_channel = channel_for(target)
        self._stub = range_writer_pb2_grpc.RangeWriterStub(self._channel)
        self._timeout = timeout
        self._batch_items = max(1, batch_items)
        self._batch_bytes = max(1, batch_bytes)

    def __enter__(self) -> RemoteRangeWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_channel:
            self._channel.close()

    def _stream(
        self, method: grpc.StreamUnaryMultiCallable, requests: Iterator[Any], failure: _Failure
    ) -> Any:
        # The request stream is produced on a thread gRPC runs for it: it works for the
        # incoming call too (its KV reads carry its deadline) and stops once that call
        # expired or was cancelled, which cancels this call and so the range-writer's work.
        call = deadlines.current()
        started: list[grpc.Future] = []

        def carried() -> Iterator[Any]:
            with deadlines.serving(call):
                try:
                    for request in requests:
                        deadlines.check()
                        yield request
                except GeneratorExit:
                    raise  # gRPC closing the stream (the call ended): not a producer failure
                except BaseException as exc:
                    if failure.error is None:
                        failure.error = exc
                    # Ends the stream and cancels the call rather than raising into gRPC's
                    # request consumer, which logs any exception there as an ERROR with a
                    # traceback (every cancelled import did). The caller raises the error.
                    if started:
                        started[0].cancel()

        with domain_errors(lambda: failure.error):
            future = method.future(carried(), timeout=deadlines.timeout(self._timeout))
            started.append(future)
            try:
                response = future.result()
            except grpc.FutureCancelledError:
                response = None
        # The producer failed: its error, whatever the call answered (a stream that ended
        # before the call could be cancelled may have been answered in full).
        if failure.error is not None:
            raise failure.error
        if response is None:
            raise errors.Cancelled("the range-writer call was cancelled")
        return response

    def _batches(
        self,
        items: Iterable[Any],
        add: Callable[[Any, Any], None],
        wrap: Callable[[], Any],
        size: Callable[[Any], int],
        failure: _Failure,
    ) -> Iterator[Any]:
        """Stream messages of at most batch_items / batch_bytes (by `size`, the one batcher
        quarry.batching); `add(message, item)` puts one item into a message made by `wrap`.
        An exception of `items` is remembered: gRPC reports the call only as cancelled."""
        try:
            for chunk in batches(items, self._batch_items, self._batch_bytes, size):
                message = wrap()
                for item in chunk:
                    add(message, item)
                yield message
        except GeneratorExit:
            raise  # closed with the stream: not a failure of its own
        except BaseException as exc:
            failure.error = exc
            raise

    def apply_changes(
        self,
        namespace: str,
        base_metarange_id: str,
        changes: Iterable[tuple[str, Entry | None] | Change],
    ) -> ApplyResult:
        """Same contract as CommittedManager.apply_changes, executed by the range-writer."""
        failure = _Failure()

        def path_and_entry(item: tuple[str, Entry | None] | Change) -> tuple[str, Entry | None]:
            if isinstance(item, Change):
                return item.path, None if item.type == ChangeType.REMOVED else item.entry
            return item

        def size(item: tuple[str, Entry | None] | Change) -> int:
            path, entry = path_and_entry(item)
            return entry_bytes(entry) if entry is not None else len(path) + 16

        def add(batch: Any, item: tuple[str, Entry | None] | Change) -> None:
            path, entry = path_and_entry(item)
            put_or_delete_to_proto(path, entry, batch.changes.add())

        def requests() -> Iterator[Any]:
            yield range_writer_pb2.ApplyChangesRequest(
                header=range_writer_pb2.ApplyChangesHeader(
                    storage_namespace=namespace, base_metarange_id=base_metarange_id or ""
                )
            )
            for batch in self._batches(changes, add, range_writer_pb2.ChangeBatch, size, failure):
                yield range_writer_pb2.ApplyChangesRequest(changes=batch)

        response = self._stream(self._stub.ApplyChanges, requests(), failure)
        return ApplyResult(
            response.metarange_id,
            summary_from_proto(response.summary),
            ranges_written=response.ranges_written,
            ranges_reused=response.ranges_reused,
        )

    def apply_span(self, namespace: str, base_metarange_id: str, span: Span) -> AppliedRanges:
        """CommittedManager.apply_span on the range-writer: the span's ranges, durable when
        this returns; no metarange (quarry.committed.spans.FanOut calls this on peers)."""
        failure = _Failure()

        def add(batch: Any, item: tuple[str, Entry | None]) -> None:
            put_or_delete_to_proto(item[0], item[1], batch.changes.add())

        def size(item: tuple[str, Entry | None]) -> int:
            return entry_bytes(item[1]) if item[1] is not None else len(item[0]) + 16

        def requests() -> Iterator[Any]:
            yield range_writer_pb2.ApplyChangesRequest(
                header=range_writer_pb2.ApplyChangesHeader(
                    storage_namespace=namespace,
                    base_metarange_id=base_metarange_id or "",
                    span=range_writer_pb2.ApplySpan(first_range=span.first, stop_range=span.stop),
                )
            )
            for batch in self._batches(
                span.changes, add, range_writer_pb2.ChangeBatch, size, failure
            ):
                yield range_writer_pb2.ApplyChangesRequest(changes=batch)

        response = self._stream(self._stub.ApplyChanges, requests(), failure)
        return AppliedRanges(
            [range_info_from_proto(r) for r in response.ranges],
            summary_from_proto(response.summary),
            response.ranges_written,
            response.ranges_reused,
        )

    def write_metarange(self, namespace: str, entries: Iterable[Entry]) -> ApplyResult:
        """Same contract as CommittedManager.write_metarange (summary.added = entries sent),
        sent in columns (write_columns)."""
        return self.write_columns(
            namespace, columns.entry_batches(entries, max_bytes=self._batch_bytes)
        )

    def write_columns(self, namespace: str, batches: Iterable[pa.RecordBatch]) -> ApplyResult:
        """Same contract as CommittedManager.write_columns: each batch one `entry_columns`
        message (an Arrow IPC stream) of WriteMetaRange; summary.added = rows sent."""
        failure = _Failure()
        count = 0

        def requests() -> Iterator[Any]:
            nonlocal count
            yield range_writer_pb2.WriteMetaRangeRequest(
                header=range_writer_pb2.WriteMetaRangeHeader(storage_namespace=namespace)
            )
            try:
                for batch in batches:
                    count += batch.num_rows
                    yield range_writer_pb2.WriteMetaRangeRequest(
                        entry_columns=columns.encode_batch(batch)
                    )
            except GeneratorExit:
                raise  # closed with the stream: not a failure of its own
            except BaseException as exc:
                failure.error = exc
                raise

        response = self._stream(self._stub.WriteMetaRange, requests(), failure)
        return ApplyResult(
            response.metarange_id,
            DiffSummary(added=count),
            ranges_written=response.ranges_written,
            ranges_reused=response.ranges_reused,
        )

    def replace_prefixes(
        self,
        namespace: str,
        base_metarange_id: str,
        prefixes: Sequence[str],
        import_metarange_id: str,
    ) -> ApplyResult:
        """Same contract as CommittedManager.replace_prefixes, executed by the range-writer."""
        request = range_writer_pb2.ReplacePrefixesRequest(
            storage_namespace=namespace,
            base_metarange_id=base_metarange_id or "",
            prefixes=list(prefixes),
            import_metarange_id=import_metarange_id or "",
        )
        with domain_errors():
            response = self._stub.ReplacePrefixes(request, timeout=self._timeout)
        return ApplyResult(
            response.metarange_id,
            summary_from_proto(response.summary),
            ranges_written=response.ranges_written,
            ranges_reused=response.ranges_reused,
        )

    def get_metarange(self, namespace: str, metarange_id: str) -> list[RangeInfo]:
        """Every range: the pages of GetMetaRange, followed to the end."""
        ranges: list[RangeInfo] = []
        token = ""
        while True:
            with domain_errors():
                response = self._stub.GetMetaRange(
                    range_writer_pb2.GetMetaRangeRequest(
                        storage_namespace=namespace, metarange_id=metarange_id, page_token=token
                    ),
                    timeout=deadlines.timeout(self._timeout),
                )
            ranges.extend(range_info_from_proto(r) for r in response.ranges)
            token = response.next_page_token
            if not token:
                return ranges

    def claim_namespace(
        self, namespace: str, marker: bytes, replace: bytes | None = None
    ) -> NamespaceClaim:
        """Same contract as CommittedManager.claim_namespace, executed by the range-writer
        (the writer of namespaces)."""
        request = range_writer_pb2.ClaimNamespaceRequest(storage_namespace=namespace, marker=marker)
        if replace is not None:
            request.replace_marker = replace
        with domain_errors():
            response = self._stub.ClaimNamespace(request, timeout=deadlines.timeout(self._timeout))
        return NamespaceClaim(
            claimed=response.claimed,
            existing_marker=(
                response.existing_marker if response.HasField("existing_marker") else None
            ),
            keys=tuple(response.keys),
            keys_truncated=response.keys_truncated,
        )

    def merge_metaranges(  # noqa: PLR0913 — the CommittedReader protocol's signature
        self,
        namespace: str,
        base_id: str,
        source_id: str,
        destination_id: str,
        strategy: MergeStrategy = MergeStrategy.DEFAULT,
        max_conflicts: int = 100,
        dry_run: bool = False,
    ) -> MergeResult:
        """Same contract as CommittedManager.merge_metaranges, executed by the range-writer.
        (The server may list fewer conflicts than asked when they are very large; the rest
        are always counted in more_conflicts.)"""
        if max_conflicts is None or max_conflicts < 0:
            raise errors.InvalidArgument("max_conflicts must be >= 0")
        # On the wire 0 means "the server's default": ask for one and drop it instead.
        request = range_writer_pb2.MergeMetaRangesRequest(
            storage_namespace=namespace,
            base=base_id or "",
            source=source_id or "",
            destination=destination_id or "",
            strategy=types_pb2.MergeStrategy.ValueType(int(strategy)),
            dry_run=dry_run,
            max_conflicts=min(max(1, int(max_conflicts)), 2**31 - 1),
        )
        with domain_errors():
            response = self._stub.MergeMetaRanges(request, timeout=deadlines.timeout(self._timeout))
        conflicts = tuple(conflict_from_proto(c) for c in response.conflicts)
        more = response.more_conflicts
        if max_conflicts == 0:
            conflicts, more = (), more + len(conflicts)
        return MergeResult(
            response.metarange_id,
            summary_from_proto(response.summary),
            conflicts,
            more,
            ranges_written=response.ranges_written,
            ranges_reused=response.ranges_reused,
        )
