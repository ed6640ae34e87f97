"""kv-gateway over gRPC: a staging token's shard partitions (docs/architecture.md §2 "Sharded
staging"). Safety rule: the gateway never lets a staged item land where a point read of its
path does not look: another shard of its token, another token's shard, a sharded token's bare
name or a shard index past its count. (The gateway knows no caller's token: what it enforces
is that a key written into a shard partition belongs to that shard.)"""

from __future__ import annotations

import grpc
import pytest

from quarry.kv.memory import MemoryStore
from quarry.kv.partitions import sharded_token, staging_partition_of, staging_partitions
from quarry.runtime.errors import from_rpc_error
from quarry.v1 import kv_pb2, kv_pb2_grpc
from support.auth import service_channel
from support.servers import kv_gateway

KEY = b"tables/events/part-00017.parquet"
MINE = sharded_token("1f0e4c2a9b", 4)
THEIRS = sharded_token("77aa01bd3c", 4)


@pytest.fixture(scope="module")
def gateway():
    backend = MemoryStore()
    with kv_gateway(backend) as (_server, target), service_channel(target) as channel:
        yield kv_pb2_grpc.KVGatewayStub(channel), backend


def _reason(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code(), from_rpc_error(caught.value).reason


def _writes(stub, partition: bytes, key: bytes):
    """Every way to write one item, as a zero-argument call each."""
    return [
        lambda: stub.SetItem(
            kv_pb2.SetItemRequest(partition_key=partition, key=key, value=b"v"), timeout=5
        ),
        lambda: stub.SetItemIf(
            kv_pb2.SetItemIfRequest(partition_key=partition, key=key, value=b"v", if_absent=True),
            timeout=5,
        ),
        lambda: stub.BatchSetItems(
            kv_pb2.BatchSetItemsRequest(
                items=[kv_pb2.Item(partition_key=partition, key=key, value=b"v")]
            ),
            timeout=5,
        ),
    ]


def test_a_caller_cannot_write_into_a_shard_that_is_not_the_keys(gateway):
    stub, backend = gateway
    own = staging_partition_of(MINE, KEY)
    wrong = [p for p in staging_partitions(MINE) if p != own]
    wrong += [p for p in staging_partitions(THEIRS) if p != staging_partition_of(THEIRS, KEY)]
    for partition in wrong:
        for write in _writes(stub, partition, KEY):
            assert _reason(write) == (grpc.StatusCode.INVALID_ARGUMENT, "WRONG_STAGING_SHARD")
    bare = b"staging/" + MINE.encode()
    past = b"staging/" + MINE.encode() + b".4"
    for partition in (bare, past):
        for write in _writes(stub, partition, KEY):
            assert _reason(write) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                "UNKNOWN_PARTITION_CLASS",
            )
    for token in (MINE, THEIRS):
        for partition in staging_partitions(token):
            assert list(backend.scan(partition)) == [], partition

    # The key's own shard takes it, and a point read of that one partition finds it.
    stub.SetItem(kv_pb2.SetItemRequest(partition_key=own, key=KEY, value=b"v"), timeout=5)
    got = stub.GetItem(kv_pb2.GetItemRequest(partition_key=own, key=KEY), timeout=5)
    assert got.value == b"v"


def test_a_batch_with_one_misplaced_key_writes_nothing(gateway):
    stub, backend = gateway
    token = sharded_token("5c5c5c5c5c", 4)
    good = [(f"ok/{i}".encode()) for i in range(8)]
    items = [
        kv_pb2.Item(partition_key=staging_partition_of(token, k), key=k, value=b"1") for k in good
    ]
    misplaced = b"bad/key"
    other = next(
        p for p in staging_partitions(token) if p != staging_partition_of(token, misplaced)
    )
    items.append(kv_pb2.Item(partition_key=other, key=misplaced, value=b"2"))
    code, reason = _reason(
        lambda: stub.BatchSetItems(kv_pb2.BatchSetItemsRequest(items=items), timeout=5)
    )
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "WRONG_STAGING_SHARD")
    assert all(list(backend.scan(p)) == [] for p in staging_partitions(token))
