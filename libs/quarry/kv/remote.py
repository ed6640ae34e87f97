"""RemoteStore: the Store interface over the kv-gateway's gRPC API.

Domain code takes a Store and cannot tell this from a local backend: errors come back as
the same exception classes (rebuilt from the ErrorInfo reason).
"""

from __future__ import annotations

import bisect
import threading
from typing import Iterator, Sequence

import grpc

from quarry import telemetry
from quarry.kv import store as kv
from quarry.runtime.errors import from_rpc_error
from quarry.v1 import kv_pb2, kv_pb2_grpc

# Items per BatchGet/BatchSet/BatchDelete request: keeps messages well under gRPC limits
# (1,000 items × 400 KB worst case would not be; staging items are small, so we also cap
# the bytes of a set batch).
BATCH_ITEMS = 1000
BATCH_BYTES = 8 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


def _predicate_fields(predicate: kv.Predicate | None) -> dict:
    if predicate is kv.ABSENT:
        return {"if_absent": True}
    if predicate is kv.EXISTS:
        return {"if_exists": True}
    if isinstance(predicate, kv.Equals):
        return {"if_equals": predicate.value}
    raise kv.MissingPredicate("set_if needs a predicate: ABSENT, EXISTS or Equals(value)")


class RemoteStore(kv.Store):
    def __init__(self, target: str | grpc.Channel, timeout: float = 30.0):
        if isinstance(target, str):
            self._channel = telemetry.instrument_channel(
                grpc.insecure_channel(target, options=CHANNEL_OPTIONS))
            self._owns_channel = True
        else:
            self._channel = target
            self._owns_channel = False
        self._stub = kv_pb2_grpc.KVGatewayStub(self._channel)
        self._timeout = timeout

    def _call(self, method, request):
        try:
            return method(request, timeout=self._timeout)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    def get(self, partition: bytes, key: bytes) -> kv.GetResult:
        response = self._call(self._stub.GetItem,
                              kv_pb2.GetItemRequest(partition_key=partition, key=key))
        return kv.GetResult(value=response.value, predicate=response.predicate)

    def set(self, partition: bytes, key: bytes, value: bytes) -> None:
        request = kv_pb2.SetItemRequest(partition_key=partition, key=key)
        if value is not None:
            request.value = value
        self._call(self._stub.SetItem, request)

    def set_if(self, partition: bytes, key: bytes, value: bytes,
               predicate: kv.Predicate) -> None:
        request = kv_pb2.SetItemIfRequest(partition_key=partition, key=key,
                                          **_predicate_fields(predicate))
        if value is not None:
            request.value = value
        self._call(self._stub.SetItemIf, request)

    def delete(self, partition: bytes, key: bytes) -> None:
        self._call(self._stub.DeleteItem,
                   kv_pb2.DeleteItemRequest(partition_key=partition, key=key))

    def scan(self, partition: bytes, start: bytes = b"", end: bytes | None = None,
             batch_size: int = kv.DEFAULT_SCAN_BATCH_SIZE) -> kv.ScanIterator:
        # Validate eagerly so a bad call fails where it is made, like local backends.
        kv.check_partition(partition)
        return _RemoteScanIterator(self, partition, start, end, batch_size)

    def batch_get(self, items: Sequence[tuple[bytes, bytes]]) -> list[kv.GetResult | None]:
        results: list[kv.GetResult | None] = []
        for offset in range(0, len(items), BATCH_ITEMS):
            chunk = items[offset:offset + BATCH_ITEMS]
            response = self._call(self._stub.BatchGetItems, kv_pb2.BatchGetItemsRequest(
                items=[kv_pb2.ItemKey(partition_key=p, key=k) for p, k in chunk]))
            results.extend(kv.GetResult(value=r.value, predicate=r.predicate) if r.found
                           else None for r in response.items)
        return results

    def batch_set(self, items: Sequence[tuple[bytes, bytes, bytes]]) -> None:
        for p, k, v in items:
            if v is None:  # proto bytes cannot carry None; fail like local backends
                kv.check_item(p, k, v)
        for chunk in _chunks_by_size(items):
            self._call(self._stub.BatchSetItems, kv_pb2.BatchSetItemsRequest(
                items=[kv_pb2.Item(partition_key=p, key=k, value=v) for p, k, v in chunk]))

    def batch_delete(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        for offset in range(0, len(items), BATCH_ITEMS):
            chunk = items[offset:offset + BATCH_ITEMS]
            self._call(self._stub.BatchDeleteItems, kv_pb2.BatchDeleteItemsRequest(
                items=[kv_pb2.ItemKey(partition_key=p, key=k) for p, k in chunk]))

    def capacity_report(self, top_n: int = 10) -> kv_pb2.GetCapacityReportResponse:
        return self._call(self._stub.GetCapacityReport,
                          kv_pb2.GetCapacityReportRequest(top_n=top_n))

    def close(self) -> None:
        if self._owns_channel:
            self._channel.close()


def _chunks_by_size(items: Sequence[tuple[bytes, bytes, bytes]]):
    chunk: list[tuple[bytes, bytes, bytes]] = []
    size = 0
    for item in items:
        item_bytes = kv.item_size(*item)
        if chunk and (len(chunk) >= BATCH_ITEMS or size + item_bytes > BATCH_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += item_bytes
    if chunk:
        yield chunk


class _RemoteScanIterator(kv.ScanIterator):
    """Consumes one ScanItems stream; seek_ge repositions inside the current page when it
    can, and otherwise cancels the stream and opens a new one at the target key."""

    def __init__(self, store: RemoteStore, partition: bytes, start: bytes,
                 end: bytes | None, batch_size: int):
        self._store = store
        self._partition = partition
        self._end = end
        self._batch_size = batch_size
        self._lock = threading.Lock()
        self._call = None
        self._stream: Iterator | None = None
        self._page: list[kv.KeyValue] = []
        self._page_keys: list[bytes] = []
        self._position = 0
        self._exhausted = False
        self._open(start)

    def _open(self, start: bytes) -> None:
        self._cancel()
        request = kv_pb2.ScanItemsRequest(partition_key=self._partition, start_key=start,
                                          end_key=self._end or b"",
                                          batch_size=self._batch_size)
        self._call = self._store._stub.ScanItems(request)
        self._stream = iter(self._call)
        self._page, self._page_keys, self._position = [], [], 0
        self._exhausted = False

    def _cancel(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None

    def _next_page(self) -> bool:
        try:
            response = next(self._stream)
        except StopIteration:
            self._exhausted = True
            self._cancel()
            return False
        except grpc.RpcError as error:
            self._exhausted = True
            raise from_rpc_error(error) from None
        self._page = [kv.KeyValue(key=item.key, value=item.value) for item in response.items]
        self._page_keys = [item.key for item in self._page]
        self._position = 0
        return True

    def __next__(self) -> kv.KeyValue:
        with self._lock:
            while self._position >= len(self._page):
                if self._exhausted or not self._next_page():
                    raise StopIteration
            item = self._page[self._position]
            self._position += 1
            return item

    def seek_ge(self, key: bytes) -> None:
        with self._lock:
            keys = self._page_keys
            # Inside the buffered page (and not past its last key): reposition locally.
            if keys and keys[0] <= key <= keys[-1]:
                self._position = bisect.bisect_left(keys, key)
                return
            self._open(key)

    def close(self) -> None:
        with self._lock:
            self._cancel()
            self._exhausted = True
            self._page, self._page_keys = [], []
