"""KVGateway servicer: proto ⇄ Store calls, nothing else.

The store it is given already validates partitions, meters capacity (and throttles when the
limiter is on) and amortizes identical reads; see service.py for the composition.
"""

from __future__ import annotations

from collections.abc import Callable

from quarry.config import Settings
from quarry.kv import store as kv
from quarry.paging import PageBudget
from quarry.v1 import kv_pb2, kv_pb2_grpc


def _predicate(request: kv_pb2.SetItemIfRequest) -> kv.Predicate | None:
    which = request.WhichOneof("predicate")
    if which == "if_absent":
        return kv.ABSENT if request.if_absent else None
    if which == "if_exists":
        return kv.EXISTS if request.if_exists else None
    if which == "if_equals":
        return kv.Equals(request.if_equals)
    return None


def _value(request) -> bytes | None:
    # `value` is an optional field: unset means missing, b"" is a real (empty) value.
    return request.value if request.HasField("value") else None


def _results(
    results: list[kv.GetResult | None],
) -> list[kv_pb2.BatchGetItemsResponse.Result]:
    return [
        kv_pb2.BatchGetItemsResponse.Result(found=True, value=r.value, predicate=r.predicate)
        if r is not None
        else kv_pb2.BatchGetItemsResponse.Result(found=False)
        for r in results
    ]


class KVGatewayServicer(kv_pb2_grpc.KVGatewayServicer):
    def __init__(
        self,
        store: kv.Store,
        capacity_report: Callable[[int], kv_pb2.GetCapacityReportResponse],
        max_response_bytes: int = Settings.max_response_bytes,
    ):
        self._store = store
        self._capacity_report = capacity_report
        self._max_response_bytes = max_response_bytes

    def GetItem(self, request, context):
        result = self._store.get(request.partition_key, request.key)
        return kv_pb2.GetItemResponse(value=result.value, predicate=result.predicate)

    def BatchGetItems(self, request, context):
        results = self._store.batch_get([(i.partition_key, i.key) for i in request.items])
        return kv_pb2.BatchGetItemsResponse(items=_results(results))

    def SetItem(self, request, context):
        # A missing value (None) is the store's to refuse: MissingArgument, as for any Store.
        self._store.set(request.partition_key, request.key, _value(request))  # type: ignore[arg-type]
        return kv_pb2.SetItemResponse()

    def SetItemIf(self, request, context):
        predicate = _predicate(request)
        if predicate is None:
            raise kv.MissingPredicate(
                "set one of if_absent (true), if_exists (true) or if_equals (bytes)"
            )
        self._store.set_if(
            request.partition_key,
            request.key,
            _value(request),  # type: ignore[arg-type]  # None: the store refuses it
            predicate,
        )
        return kv_pb2.SetItemIfResponse()

    def DeleteItem(self, request, context):
        if request.HasField("if_equals"):
            self._store.delete_if(request.partition_key, request.key, kv.Equals(request.if_equals))
        else:
            self._store.delete(request.partition_key, request.key)
        return kv_pb2.DeleteItemResponse()

    def BatchSetItems(self, request, context):
        self._store.batch_set([(i.partition_key, i.key, i.value) for i in request.items])
        return kv_pb2.BatchSetItemsResponse()

    def SetItemsThenGet(self, request, context):
        results = self._store.set_then_get(
            [(i.partition_key, i.key, i.value) for i in request.items],
            [(i.partition_key, i.key) for i in request.then_get],
        )
        return kv_pb2.SetItemsThenGetResponse(items=_results(results))

    def BatchDeleteItems(self, request, context):
        self._store.batch_delete([(i.partition_key, i.key) for i in request.items])
        return kv_pb2.BatchDeleteItemsResponse()

    def ScanItems(self, request, context):
        batch_size = min(request.batch_size or kv.DEFAULT_SCAN_BATCH_SIZE, kv.MAX_SCAN_BATCH_SIZE)
        iterator = self._store.scan(
            request.partition_key, request.start_key, request.end_key or None, batch_size=batch_size
        )
        remaining = request.limit or -1
        page: list[kv_pb2.KeyValue] = []
        # A streamed message also ends by encoded size: batch_size items of up to 400 KB
        # would pass any client's message limit.
        budget = PageBudget(batch_size, self._max_response_bytes)
        try:
            for item in iterator:
                if remaining == 0 or not context.is_active():
                    break
                message = kv_pb2.KeyValue(key=item.key, value=item.value)
                if not budget.admit(message):
                    yield kv_pb2.ScanItemsResponse(items=page)
                    page = []
                    budget.reset()
                    budget.admit(message)
                page.append(message)
                remaining -= 1
                if budget.items >= batch_size:
                    yield kv_pb2.ScanItemsResponse(items=page)
                    page = []
                    budget.reset()
            if page:
                yield kv_pb2.ScanItemsResponse(items=page)
        finally:
            iterator.close()

    def GetCapacityReport(self, request, context):
        return self._capacity_report(request.top_n or 10)
