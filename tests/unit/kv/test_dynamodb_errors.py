"""DynamoDBStore's retry and error mapping for what dynalite never does (throttling,
unprocessed batch items, a dead endpoint). Responses are stubbed with botocore's Stubber,
which validates every request against the real DynamoDB API model."""

from __future__ import annotations

import socket

import pytest
from botocore.stub import ANY, Stubber

from quarry.kv import store
from quarry.kv.dynamodb import DynamoDBOptions, DynamoDBStore

P = b"staging/unit-m"


@pytest.fixture
def ddb():
    # Port 9 (discard) on loopback: nothing is ever sent while the Stubber is active.
    s = DynamoDBStore(
        "unit-table",
        endpoint_url="http://127.0.0.1:9",
        create_table=False,
        options=DynamoDBOptions(max_throttle_retries=3, backoff_base=0.001, backoff_max=0.005),
    )
    with Stubber(s.client) as stub:
        yield s, stub
        stub.assert_no_pending_responses()


def _item(k: bytes, v: bytes) -> dict:
    return {"pk": {"B": P}, "k": {"B": k}, "v": {"B": v}}


def test_throttling_is_retried_then_succeeds(ddb):
    s, stub = ddb
    stub.add_client_error("put_item", "ThrottlingException", http_status_code=400)
    stub.add_client_error(
        "put_item", "ProvisionedThroughputExceededException", http_status_code=400
    )
    stub.add_response("put_item", {})
    s.set(P, b"k", b"v")


def test_persistent_throttling_raises_throttled_with_retry_delay(ddb):
    s, stub = ddb
    for _ in range(4):  # the first attempt + max_throttle_retries
        stub.add_client_error("get_item", "RequestLimitExceeded", http_status_code=400)
    with pytest.raises(store.Throttled) as e:
        s.get(P, b"k")
    assert e.value.retry_delay and e.value.retry_delay > 0
    assert e.value.code.name == "RESOURCE_EXHAUSTED"


def test_conditional_check_failure_is_predicate_failed(ddb):
    s, stub = ddb
    stub.add_client_error(
        "put_item",
        "ConditionalCheckFailedException",
        http_status_code=400,
        expected_params={
            "TableName": "unit-table",
            "Item": _item(b"k", b"v"),
            "ConditionExpression": "attribute_not_exists(pk)",
        },
    )
    with pytest.raises(store.PredicateFailed):
        s.set_if(P, b"k", b"v", store.ABSENT)


def test_server_errors_are_unavailable(ddb):
    s, stub = ddb
    stub.add_client_error("delete_item", "InternalServerError", http_status_code=500)
    with pytest.raises(store.BackendUnavailable):
        s.delete(P, b"k")


def test_unprocessed_batch_items_are_resent_until_done(ddb):
    s, stub = ddb
    items = [(P, b"k%02d" % i, b"v") for i in range(25)]
    left = [{"PutRequest": {"Item": _item(k, v)}} for _, k, v in items[20:]]
    stub.add_response("batch_write_item", {"UnprocessedItems": {"unit-table": left}})
    # The resend carries exactly the unprocessed items.
    stub.add_response(
        "batch_write_item",
        {"UnprocessedItems": {}},
        expected_params={"RequestItems": {"unit-table": left}},
    )
    s.batch_set(items)


def test_batch_get_without_progress_ends_throttled(ddb):
    s, stub = ddb
    keys = {
        "Keys": [{"pk": {"B": P}, "k": {"B": b"a"}}],
        "ConsistentRead": True,
        "ProjectionExpression": "pk, k, v",
    }
    for _ in range(4):
        stub.add_response(
            "batch_get_item",
            {"Responses": {}, "UnprocessedKeys": {"unit-table": keys}},
            expected_params={"RequestItems": {"unit-table": ANY}},
        )
    with pytest.raises(store.Throttled):
        s.batch_get([(P, b"a")])


def test_unreachable_endpoint_is_unavailable():
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    s = DynamoDBStore(
        "unit-table",
        endpoint_url=f"http://127.0.0.1:{port}",
        create_table=False,
        options=DynamoDBOptions(connect_timeout=1),
    )
    with pytest.raises(store.BackendUnavailable):
        s.get(P, b"k")
    with pytest.raises(store.BackendUnavailable):  # and at construction, creating the table
        DynamoDBStore(
            "unit-table",
            endpoint_url=f"http://127.0.0.1:{port}",
            options=DynamoDBOptions(connect_timeout=1),
        )


def test_the_throttle_retries_are_the_settings(tmp_path):
    """QUARRY_KV_THROTTLE_*: how often a throttled call is retried, and the backoff bounds,
    reach the DynamoDB store that open_store builds (the kv-gateway's path)."""
    from quarry.config import load_settings
    from quarry.kv import ThrottleRetry, open_store

    settings = load_settings(
        env={
            "QUARRY_KV_THROTTLE_RETRIES": "1",
            "QUARRY_KV_THROTTLE_BACKOFF_BASE_SECONDS": "0.001",
            "QUARRY_KV_THROTTLE_BACKOFF_CAP_SECONDS": "0.002",
        },
        home=str(tmp_path),
    )
    s = open_store(
        "dynamodb://unit-table?endpoint_url=http://127.0.0.1:9&create_table=false",
        ThrottleRetry.from_settings(settings),
    )
    assert (s.backoff_base, s.backoff_max) == (0.001, 0.002)
    with Stubber(s.client) as stub:
        for _ in range(2):  # the first attempt + 1 retry, then Throttled
            stub.add_client_error("get_item", "ThrottlingException", http_status_code=400)
        with pytest.raises(store.Throttled):
            s.get(P, b"k")
        stub.assert_no_pending_responses()


def test_the_settings_defaults_are_the_librarys():
    """One default for each limit: a Settings default that drifted from the library's
    would make a service behave unlike the library it is built from."""
    from quarry.config import Settings
    from quarry.graveler.retry import DEFAULT_RETRY, MERGE_RETRY
    from quarry.kv import ThrottleRetry

    settings = Settings()
    throttle = ThrottleRetry()
    assert settings.kv_throttle_retries == throttle.retries
    assert settings.kv_throttle_backoff_base_seconds == throttle.base_seconds
    assert settings.kv_throttle_backoff_cap_seconds == throttle.cap_seconds
    assert settings.branch_retry_attempts == DEFAULT_RETRY.max_attempts
    assert settings.branch_retry_base_seconds == DEFAULT_RETRY.base_seconds
    assert settings.branch_retry_cap_seconds == DEFAULT_RETRY.cap_seconds
    assert settings.merge_retry_attempts == MERGE_RETRY.max_attempts
