"""RemoteStore: the Store interface over the kv-gateway's gRPC API.

Domain code takes a Store and cannot tell this from a local backend: errors come back as
the same exception classes (rebuilt from the ErrorInfo reason).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from google.protobuf.message import Message

from quarry.batching import batches
from quarry.kv import store as kv
from quarry.runtime import deadlines
from quarry.runtime.channels import AUTHORIZATION_HEADER, TokenSource, channel_for
from quarry.runtime.errors import domain_errors
from quarry.v1 import kv_pb2, kv_pb2_grpc

# Items per BatchGet/BatchSet/BatchDelete request: keeps messages well under gRPC limits
# (1,000 items × 400 KB worst case would not be; staging items are small, so we also cap
# the bytes of a set batch).
BATCH_ITEMS = 1000
BATCH_BYTES = 8 * 1024 * 1024


def _predicate_fields(predicate: kv.Predicate | None) -> dict:
    if predicate is kv.ABSENT:
        return {"if_absent": True}
    if predicate is kv.EXISTS:
        return {"if_exists": True}
    if isinstance(predicate, kv.Equals):
        return {"if_equals": predicate.value}
    raise kv.MissingPredicate("set_if needs a predicate: ABSENT, EXISTS or Equals(value)")


Metadata = tuple[tuple[str, str], ...]


class RemoteStore(kv.Store):
    """`token_source`: the calling service's token source (quarry.auth.service_tokens);
    every call then carries `authorization: Bearer <token>` as call metadata, which costs
    far less per call than a client interceptor on the channel (the KV calls are the hot
    path of every read and write). None: the channel's own (if any) or no token."""

    def __init__(
        self,
        target: str | grpc.Channel,
        # Each call's own bound; serving a call, the smaller of it and what remains of that
        # call's deadline (quarry.runtime.deadlines).
        timeout: float = 30.0,
        token_source: TokenSource | None = None,
    ):
        self._channel, self._owns_channel = channel_for(target)
        self._stub = kv_pb2_grpc.KVGatewayStub(self._channel)
        self._timeout = timeout
        self._token_source = token_source
        self._metadata: tuple[str, Metadata | None] = ("", None)

    def call_metadata(self) -> Metadata | None:
        """The metadata every call carries: the current bearer token, if any (built again
        only when the source renews the token)."""
        if self._token_source is None:
            return None
        token = self._token_source()
        cached_token, metadata = self._metadata
        if token != cached_token or metadata is None:
            metadata = ((AUTHORIZATION_HEADER, f"Bearer {token}"),)
            self._metadata = (token, metadata)
        return metadata

    def _call(self, method: Callable[..., Any], request: Message) -> Any:
        with domain_errors():
            return method(
                request, timeout=deadlines.timeout(self._timeout), metadata=self.call_metadata()
            )

    def get(self, partition: bytes, key: bytes) -> kv.GetResult:
        response = self._call(
            self._stub.GetItem, kv_pb2.GetItemRequest(partition_key=partition, key=key)
        )
        return kv.GetResult(value=response.value, predicate=response.predicate)

    def set(self, partition: bytes, key: bytes, value: bytes) -> None:
        request = kv_pb2.SetItemRequest(partition_key=partition, key=key)
        if value is not None:
            request.value = value
        self._call(self._stub.SetItem, request)

    def set_if(self, partition: bytes, key: bytes, value: bytes, predicate: kv.Predicate) -> None:
        request = kv_pb2.SetItemIfRequest(
            partition_key=partition, key=key, **_predicate_fields(predicate)
        )
        if value is not None:
            request.value = value
        self._call(self._stub.SetItemIf, request)

    def delete(self, partition: bytes, key: bytes) -> None:
        self._call(
            self._stub.DeleteItem, kv_pb2.DeleteItemRequest(partition_key=partition, key=key)
        )

    def delete_if(self, partition: bytes, key: bytes, predicate: kv.Equals) -> None:
        kv.check_delete_predicate(predicate)
        self._call(
            self._stub.DeleteItem,
            kv_pb2.DeleteItemRequest(partition_key=partition, key=key, if_equals=predicate.value),
        )

    def scan(
        self,
        partition: bytes,
        start: bytes = b"",
        end: bytes | None = None,
        batch_size: int = kv.DEFAULT_SCAN_BATCH_SIZE,
    ) -> kv.ScanIterator:
        # Validate eagerly so a bad call fails where it is made, like local backends.
        kv.check_partition(partition)
        return _RemoteScanIterator(self, partition, start, end, batch_size)

    def batch_get(self, items: Sequence[tuple[bytes, bytes]]) -> list[kv.GetResult | None]:
        results: list[kv.GetResult | None] = []
        for chunk in batches(items, BATCH_ITEMS):
            response = self._call(
                self._stub.BatchGetItems,
                kv_pb2.BatchGetItemsRequest(
                    items=[kv_pb2.ItemKey(partition_key=p, key=k) for p, k in chunk]
                ),
            )
            results.extend(
                kv.GetResult(value=r.value, predicate=r.predicate) if r.found else None
                for r in response.items
            )
        return results

    def batch_set(self, items: Sequence[tuple[bytes, bytes, bytes]]) -> None:
        for p, k, v in items:
            if v is None:  # proto bytes cannot carry None; fail like local backends
                kv.check_item(p, k, v)
        for chunk in batches(items, BATCH_ITEMS, BATCH_BYTES, _item_size):
            self._call(
                self._stub.BatchSetItems,
                kv_pb2.BatchSetItemsRequest(
                    items=[kv_pb2.Item(partition_key=p, key=k, value=v) for p, k, v in chunk]
                ),
            )

    def set_then_get(
        self,
        items: Sequence[tuple[bytes, bytes, bytes]],
        then_get: Sequence[tuple[bytes, bytes]],
    ) -> list[kv.GetResult | None]:
        """One SetItemsThenGet call (the kv-gateway runs Store.set_then_get: the same
        operations as set/batch_set then batch_get); what does not fit one batch goes as the
        separate calls."""
        for p, k, v in items:
            if v is None:  # proto bytes cannot carry None; fail like local backends
                kv.check_item(p, k, v)
        if (
            len(items) > BATCH_ITEMS
            or len(then_get) > BATCH_ITEMS
            or sum(_item_size(item) for item in items) > BATCH_BYTES
        ):
            return super().set_then_get(items, then_get)
        response = self._call(
            self._stub.SetItemsThenGet,
            kv_pb2.SetItemsThenGetRequest(
                items=[kv_pb2.Item(partition_key=p, key=k, value=v) for p, k, v in items],
                then_get=[kv_pb2.ItemKey(partition_key=p, key=k) for p, k in then_get],
            ),
        )
        return [
            kv.GetResult(value=r.value, predicate=r.predicate) if r.found else None
            for r in response.items
        ]

    def batch_delete(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        for chunk in batches(items, BATCH_ITEMS):
            self._call(
                self._stub.BatchDeleteItems,
                kv_pb2.BatchDeleteItemsRequest(
                    items=[kv_pb2.ItemKey(partition_key=p, key=k) for p, k in chunk]
                ),
            )

    def capacity_report(self, top_n: int = 10) -> kv_pb2.GetCapacityReportResponse:
        return self._call(
            self._stub.GetCapacityReport, kv_pb2.GetCapacityReportRequest(top_n=top_n)
        )

    def close(self) -> None:
        if self._owns_channel:
            self._channel.close()


def _item_size(item: tuple[bytes, bytes, bytes]) -> int:
    return kv.item_size(*item)


class _RemoteScanIterator(kv.ScanIterator):
    """Client-driven paging: each page is one ScanItems call limited to `batch_size` items,
    resumed from the last key seen. Nothing is fetched ahead of the caller (a scan sees
    writes that land in pages it has not reached, like the local backends), and an
    abandoned iterator pins no gateway thread. seek_ge repositions inside the current page
    when it can, else the next page starts at the target key."""

    def __init__(
        self, store: RemoteStore, partition: bytes, start: bytes, end: bytes | None, batch_size: int
    ):
        self._store = store
        self._partition = partition
        self._end = end
        self._batch_size = max(1, batch_size)
        self._start = start
        self._lock = threading.Lock()
        self._reset(start)

    def _reset(self, start: bytes) -> None:
        self._next_start = start
        # After the first page, a page starts AT the last key seen (start keys are
        # inclusive and may not exceed the key size limit), which is then skipped.
        self._skip_key: bytes | None = None
        self._page: list[kv.KeyValue] = []
        self._page_keys: list[bytes] = []
        self._position = 0
        self._exhausted = False

    def _fetch_page(self) -> None:
        want = self._batch_size + (1 if self._skip_key is not None else 0)
        request = kv_pb2.ScanItemsRequest(
            partition_key=self._partition,
            start_key=self._next_start,
            end_key=self._end or b"",
            batch_size=want,
            limit=want,
        )
        with domain_errors():
            items = [
                kv.KeyValue(key=item.key, value=item.value)
                for response in self._store._stub.ScanItems(
                    request,
                    timeout=deadlines.timeout(self._store._timeout),
                    metadata=self._store.call_metadata(),
                )
                for item in response.items
            ]
        self._exhausted = len(items) < want
        if items and self._skip_key is not None and items[0].key == self._skip_key:
            items = items[1:]
        if items:
            self._next_start = self._skip_key = items[-1].key
        self._page = items
        self._page_keys = [item.key for item in items]
        self._position = 0

    def __next__(self) -> kv.KeyValue:
        with self._lock:
            while self._position >= len(self._page):
                if self._exhausted:
                    raise StopIteration
                self._fetch_page()
            item = self._page[self._position]
            self._position += 1
            return item

    def seek_ge(self, key: bytes) -> None:
        key = max(key, self._start)  # a seek never leaves the scan's bounds
        with self._lock:
            keys = self._page_keys
            if keys and keys[0] <= key <= keys[-1]:
                self._position = bisect.bisect_left(keys, key)
                return
            self._reset(key)

    def close(self) -> None:
        with self._lock:
            self._page, self._page_keys = [], []
            self._exhausted = True
