"""dynalite's own limits agree with quarry.kv.store's, byte for byte.

store.check_item refuses oversize items before any backend sees them, so the conformance
suite never shows what DynamoDB itself would do at the boundary. Here raw boto3 calls skip
our validation: if store.item_size ever drifted from DynamoDB's arithmetic, the store would
either refuse items DynamoDB accepts or pass on items it rejects.
"""

from __future__ import annotations

import boto3
import botocore.exceptions
import pytest

from quarry.kv import store
from quarry.kv.dynamodb import DynamoDBStore

TABLE = "quarry-dynalite-limits"


@pytest.fixture(scope="module")
def client(dynalite):
    DynamoDBStore(TABLE, endpoint_url=dynalite).close()  # creates the table
    c = boto3.client(
        "dynamodb",
        endpoint_url=dynalite,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )
    yield c
    c.close()


def put(client, partition: bytes, key: bytes, value: bytes) -> None:
    client.put_item(
        TableName=TABLE, Item={"pk": {"B": partition}, "k": {"B": key}, "v": {"B": value}}
    )


def refused(client, partition: bytes, key: bytes, value: bytes) -> str:
    with pytest.raises(botocore.exceptions.ClientError) as e:
        put(client, partition, key, value)
    assert e.value.response["Error"]["Code"] == "ValidationException"
    return e.value.response["Error"]["Message"]


def test_item_size_boundary_matches_store(client):
    p, k = b"staging/limits-m", b"key"
    fits = b"x" * (store.MAX_ITEM_BYTES - store.item_size(p, k, b""))
    assert store.item_size(p, k, fits) == store.MAX_ITEM_BYTES
    put(client, p, k, fits)  # exactly the limit: DynamoDB accepts it
    assert "size" in refused(client, p, k, fits + b"x")  # one byte more: refused


def test_key_size_boundaries_match_store(client):
    p = b"staging/limits-m"
    put(client, p, b"k" * store.MAX_KEY_BYTES, b"")
    assert "1024" in refused(client, p, b"k" * (store.MAX_KEY_BYTES + 1), b"")
    put(client, b"p" * store.MAX_PARTITION_KEY_BYTES, b"k", b"")
    assert "2048" in refused(client, b"p" * (store.MAX_PARTITION_KEY_BYTES + 1), b"k", b"")


def test_empty_binary_value_is_stored_as_is(client):
    put(client, b"staging/limits-m", b"empty", b"")
    item = client.get_item(
        TableName=TABLE,
        ConsistentRead=True,
        Key={"pk": {"B": b"staging/limits-m"}, "k": {"B": b"empty"}},
    )["Item"]
    assert item["v"]["B"] == b""
    # ...whereas an empty key is refused, which is why store.check_key requires one.
    refused(client, b"staging/limits-m", b"", b"v")
