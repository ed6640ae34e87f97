"""RangeWriter servicer: proto <-> CommittedManager calls, nothing else."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from quarry import errors
from quarry.committed import CommittedManager, columns
from quarry.committed.errors import InvalidStream
from quarry.committed.merge import DEFAULT_MAX_CONFLICTS
from quarry.committed.spans import FanOut, Span
from quarry.config import Settings
from quarry.convert import (
    conflict_to_proto,
    entry_from_proto,
    merge_strategy_from_proto,
    put_or_delete_from_proto,
    range_infos_to_proto,
    summary_to_proto,
)
from quarry.services.range_writer.metrics import RangeWriterMetrics
from quarry.v1 import range_writer_pb2, range_writer_pb2_grpc

# Byte budget of the conflicts listed in one MergeMetaRangesResponse (well under the gRPC
# message limit); conflicts past it are counted in more_conflicts.
CONFLICT_BYTES = 16 * 1024 * 1024


def _header(request_iterator: Iterator, rpc: str):
    """The first message of a client stream, which must be its header."""
    try:
        first = next(request_iterator)
    except StopIteration:
        raise InvalidStream(f"{rpc}: empty stream; send a header first") from None
    if first.WhichOneof("part") != "header":
        raise InvalidStream(f"{rpc}: the first message must be the header")
    header = first.header
    if not header.storage_namespace:
        raise errors.InvalidArgument(f"{rpc}: storage_namespace is required")
    return header


def _parts(request_iterator: Iterator, rpc: str, field: str) -> Iterator:
    for request in request_iterator:
        which = request.WhichOneof("part")
        if which != field:
            raise InvalidStream(
                f"{rpc}: after the header, only {field} messages may follow"
                f" (got {which or 'an empty message'})"
            )
        yield getattr(request, field)


class RangeWriterServicer(range_writer_pb2_grpc.RangeWriterServicer):
    def __init__(
        self,
        manager: CommittedManager,
        max_response_bytes: int = Settings.max_response_bytes,
        fan_out: FanOut | None = None,
    ):
        self._manager = manager
        self._max_response_bytes = max_response_bytes
        self._metrics = RangeWriterMetrics(manager)
        # Large applies split into spans for peer range-writers (scale-out), if configured.
        self._apply = fan_out or manager

    def ApplyChanges(self, request_iterator, context):
        header = _header(request_iterator, "ApplyChanges")

        def changes():
            for batch in _parts(request_iterator, "ApplyChanges", "changes"):
                for message in batch.changes:
                    try:
                        yield put_or_delete_from_proto(message)
                    except ValueError as exc:
                        raise errors.InvalidArgument(str(exc)) from None

        if header.HasField("span"):
            span = header.span
            if not 0 <= span.first_range <= span.stop_range:
                raise errors.InvalidArgument("ApplyChanges: invalid span")
            with self._metrics.operation("apply_span") as done:
                applied = self._manager.apply_span(
                    header.storage_namespace,
                    header.base_metarange_id,
                    Span(span.first_range, span.stop_range, list(changes())),
                )
                done(applied.written, applied.reused)
            return range_writer_pb2.ApplyChangesResponse(
                summary=summary_to_proto(applied.summary),
                ranges_written=applied.written,
                ranges_reused=applied.reused,
                ranges=range_infos_to_proto(applied.ranges),
            )
        with self._metrics.operation("apply") as done:
            result = self._apply.apply_changes(
                header.storage_namespace, header.base_metarange_id, changes()
            )
            done(result.ranges_written, result.ranges_reused)
        return range_writer_pb2.ApplyChangesResponse(
            metarange_id=result.metarange_id,
            summary=summary_to_proto(result.summary),
            ranges_written=result.ranges_written,
            ranges_reused=result.ranges_reused,
        )

    def WriteMetaRange(self, request_iterator, context):
        header = _header(request_iterator, "WriteMetaRange")

        def batches() -> Iterator[pa.RecordBatch]:
            # Columns (what clients send) or, from older clients, entry messages: both
            # become record batches, the one way the manager writes new entries.
            for request in request_iterator:
                which = request.WhichOneof("part")
                if which == "entry_columns":
                    yield from columns.decode_batches(request.entry_columns)
                elif which == "entries":
                    yield from columns.entry_batches(
                        entry_from_proto(message) for message in request.entries.entries
                    )
                else:
                    raise InvalidStream(
                        "WriteMetaRange: after the header, only entry_columns or entries "
                        f"messages may follow (got {which or 'an empty message'})"
                    )

        with self._metrics.operation("write_metarange") as done:
            result = self._manager.write_columns(header.storage_namespace, batches())
            done(result.ranges_written, result.ranges_reused)
        return range_writer_pb2.WriteMetaRangeResponse(
            metarange_id=result.metarange_id,
            ranges_written=result.ranges_written,
            ranges_reused=result.ranges_reused,
        )

    def ReplacePrefixes(self, request, context):
        if not request.storage_namespace:
            raise errors.InvalidArgument("ReplacePrefixes: storage_namespace is required")
        with self._metrics.operation("replace_prefixes") as done:
            result = self._manager.replace_prefixes(
                request.storage_namespace,
                request.base_metarange_id,
                list(request.prefixes),
                request.import_metarange_id,
            )
            done(result.ranges_written, result.ranges_reused)
        return range_writer_pb2.ReplacePrefixesResponse(
            metarange_id=result.metarange_id,
            summary=summary_to_proto(result.summary),
            ranges_written=result.ranges_written,
            ranges_reused=result.ranges_reused,
        )

    def GetMetaRange(self, request, context):
        if not request.storage_namespace:
            raise errors.InvalidArgument("GetMetaRange: storage_namespace is required")
        ranges, token = self._manager.metarange_page(
            request.storage_namespace,
            request.metarange_id,
            request.page_size,
            request.page_token,
            self._max_response_bytes,
        )
        return range_writer_pb2.GetMetaRangeResponse(
            ranges=range_infos_to_proto(ranges), next_page_token=token
        )

    def ClaimNamespace(self, request, context):
        if not request.storage_namespace:
            raise errors.InvalidArgument("ClaimNamespace: storage_namespace is required")
        if not request.marker:
            raise errors.InvalidArgument("ClaimNamespace: marker is required")
        claim = self._manager.claim_namespace(
            request.storage_namespace,
            request.marker,
            request.replace_marker if request.HasField("replace_marker") else None,
        )
        response = range_writer_pb2.ClaimNamespaceResponse(
            claimed=claim.claimed, keys=claim.keys, keys_truncated=claim.keys_truncated
        )
        if claim.existing_marker is not None:
            response.existing_marker = claim.existing_marker
        return response

    def MergeMetaRanges(self, request, context):
        if not request.storage_namespace:
            raise errors.InvalidArgument("MergeMetaRanges: storage_namespace is required")
        try:
            strategy = merge_strategy_from_proto(request.strategy)
        except ValueError as exc:
            raise errors.InvalidArgument(f"MergeMetaRanges: {exc}") from None
        if request.max_conflicts < 0:
            raise errors.InvalidArgument("MergeMetaRanges: max_conflicts must be >= 0")
        with self._metrics.operation("merge") as done:
            result = self._manager.merge_metaranges(
                request.storage_namespace,
                request.base,
                request.source,
                request.destination,
                strategy=strategy,
                max_conflicts=request.max_conflicts or DEFAULT_MAX_CONFLICTS,
                dry_run=request.dry_run,
            )
            done(result.ranges_written, result.ranges_reused)
        response = range_writer_pb2.MergeMetaRangesResponse(
            metarange_id=result.metarange_id,
            summary=summary_to_proto(result.summary),
            ranges_written=result.ranges_written,
            ranges_reused=result.ranges_reused,
            more_conflicts=result.more_conflicts,
        )
        listed = 0
        for conflict in result.conflicts:
            message = conflict_to_proto(conflict)
            listed += message.ByteSize()
            if listed > CONFLICT_BYTES and len(response.conflicts):
                break  # entries may carry ~400 KB of metadata: stay under the message limit
            response.conflicts.append(message)
        response.more_conflicts += len(result.conflicts) - len(response.conflicts)
        return response
