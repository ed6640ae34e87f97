"""DynamoDB KV store (boto3 low-level client); tested against dynalite.

One table: binary partition key `pk` (HASH), binary sort key `k` (RANGE), binary value `v`
(store.ITEM_ATTRIBUTE_NAMES; store.item_size counts exactly these names, the way DynamoDB
sizes items). DynamoDB orders binary sort keys as unsigned bytes, which is the contract's
key order. Empty binary values are legal for non-key attributes, so values are stored as is.

Error mapping:
- ConditionalCheckFailedException -> PredicateFailed.
- Throttling (ProvisionedThroughputExceeded, Throttling, RequestLimitExceeded) and batch
  items left unprocessed without progress are retried here with jittered exponential
  backoff a bounded number of times, then raised as Throttled with a retry_delay.
- Connection failures and server-side errors -> BackendUnavailable.
botocore's own retries are switched off so this is the only retry loop (and a lost
conditional put is never silently re-sent).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import boto3
import botocore.config
import botocore.exceptions

from quarry import errors, jitter
from quarry.kv import ThrottleRetry, store
from quarry.kv.store import GetResult, KeyValue

PK, K, V = (n.decode() for n in store.ITEM_ATTRIBUTE_NAMES)

# DynamoDB's per-request limits.
BATCH_GET_MAX_KEYS = 100
BATCH_WRITE_MAX_ITEMS = 25

_THROTTLE_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
    }
)
_UNAVAILABLE_CODES = frozenset(
    {
        "InternalServerError",
        "ServiceUnavailable",
        "ResourceNotFoundException",  # the table is gone (or not created yet)
    }
)

T = TypeVar("T")


@dataclass(frozen=True)
class DynamoDBOptions:
    """Credentials, retries and timeouts of a DynamoDBStore (the defaults suit production)."""

    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    # Throttled calls are retried this many times with jittered exponential backoff
    # (quarry.kv.ThrottleRetry: the kv-gateway's come from Settings).
    max_throttle_retries: int = ThrottleRetry.retries
    backoff_base: float = ThrottleRetry.base_seconds
    backoff_max: float = ThrottleRetry.cap_seconds
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    max_pool_connections: int = 64


class DynamoDBStore(store.PagedStore):
    def __init__(
        self,
        table_name: str,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        create_table: bool = True,
        options: DynamoDBOptions | None = None,
    ):
        options = options or DynamoDBOptions()
        aws_access_key_id = options.aws_access_key_id
        aws_secret_access_key = options.aws_secret_access_key
        self.table_name = table_name
        self.max_throttle_retries = options.max_throttle_retries
        self.backoff_base = options.backoff_base
        self.backoff_max = options.backoff_max
        if endpoint_url and aws_access_key_id is None:
            # A local endpoint (dynalite) needs some credentials to sign with; do not make
            # boto3 search the environment/instance metadata for them. Real credentials
            # still win when the environment provides them.
            session = boto3.session.Session(region_name=region)
            if session.get_credentials() is None:
                aws_access_key_id, aws_secret_access_key = "local", "local"
        config = botocore.config.Config(
            retries={"mode": "standard", "total_max_attempts": 1},
            connect_timeout=options.connect_timeout,
            read_timeout=options.read_timeout,
            max_pool_connections=options.max_pool_connections,
        )
        # Low-level clients are thread-safe; sessions are not, so build one just for this.
        self._client = boto3.session.Session().client(
            "dynamodb",
            endpoint_url=endpoint_url,
            region_name=region,
            config=config,
            aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
        )
        if create_table:
            self._ensure_table()

    @property
    def client(self) -> Any:
        """The boto3 DynamoDB client this store calls (e.g. to inspect its endpoint, or to
        stub its responses with botocore's Stubber)."""
        return self._client

    # ---- table ----

    def _ensure_table(self) -> None:
        try:
            table = self._call(self._client.describe_table, TableName=self.table_name)["Table"]
        except store.BackendUnavailable as e:
            if _error_code(e.__cause__) != "ResourceNotFoundException":
                raise  # the endpoint is down, not the table missing
            try:
                self._call(
                    self._client.create_table,
                    TableName=self.table_name,
                    AttributeDefinitions=[
                        {"AttributeName": PK, "AttributeType": "B"},
                        {"AttributeName": K, "AttributeType": "B"},
                    ],
                    KeySchema=[
                        {"AttributeName": PK, "KeyType": "HASH"},
                        {"AttributeName": K, "KeyType": "RANGE"},
                    ],
                    BillingMode="PAY_PER_REQUEST",
                )
            except errors.QuarryError as e2:
                # Another process created it first: fine, wait for it like ours.
                if _error_code(e2.__cause__) != "ResourceInUseException":
                    raise
            self._client.get_waiter("table_exists").wait(
                TableName=self.table_name, WaiterConfig={"Delay": 1, "MaxAttempts": 120}
            )
            return
        schema = {(a["AttributeName"], a["KeyType"]) for a in table["KeySchema"]}
        if schema != {(PK, "HASH"), (K, "RANGE")}:
            raise errors.FailedPrecondition(
                f"DynamoDB table {self.table_name} has key schema {sorted(schema)}; "
                f"expected {PK} HASH + {K} RANGE"
            )
        if table["TableStatus"] != "ACTIVE":
            self._client.get_waiter("table_exists").wait(
                TableName=self.table_name, WaiterConfig={"Delay": 1, "MaxAttempts": 120}
            )

    # ---- calls, retries and error mapping ----

    def _backoff(self, attempt: int) -> float:
        # Full jitter: spreads retries of many clients hitting one hot partition.
        return jitter.backoff(attempt, self.backoff_base, self.backoff_max, low=0.0)

    def _call(self, fn: Callable[..., T], **kwargs: Any) -> T:
        """Call the client; retry throttling with backoff; map every error to a domain one."""
        attempt = 0
        while True:
            try:
                return fn(**kwargs)
            except botocore.exceptions.ClientError as e:
                code = _error_code(e)
                if code in _THROTTLE_CODES:
                    if attempt < self.max_throttle_retries:
                        time.sleep(self._backoff(attempt))
                        attempt += 1
                        continue
                    raise store.Throttled(
                        f"DynamoDB throttled after {attempt + 1} attempts: {code}",
                        retry_delay=jitter.exponential(
                            attempt, self.backoff_base, self.backoff_max
                        ),
                    ) from e
                raise _translate(e, code) from e
            except (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError) as e:
                raise store.BackendUnavailable(f"DynamoDB unreachable: {e}") from e

    def _key(self, partition: bytes, key: bytes) -> dict:
        return {PK: {"B": partition}, K: {"B": key}}

    # ---- operations ----

    def get(self, partition: bytes, key: bytes) -> GetResult:
        store.check_key(partition, key)
        resp = self._call(
            self._client.get_item,
            TableName=self.table_name,
            Key=self._key(partition, key),
            ConsistentRead=True,
            ProjectionExpression=V,
        )
        item = resp.get("Item")
        if item is None:
            raise store.KeyNotFound("key not found")
        value = item[V]["B"]
        return GetResult(value=value, predicate=value)

    def set(self, partition: bytes, key: bytes, value: bytes) -> None:
        store.check_item(partition, key, value)
        self._call(
            self._client.put_item, TableName=self.table_name, Item=self._item(partition, key, value)
        )

    def set_if(
        self, partition: bytes, key: bytes, value: bytes, predicate: store.Predicate
    ) -> None:
        store.check_item(partition, key, value)
        store.check_predicate(predicate)
        kwargs: dict = {"TableName": self.table_name, "Item": self._item(partition, key, value)}
        if predicate is store.ABSENT:
            kwargs["ConditionExpression"] = f"attribute_not_exists({PK})"
        elif predicate is store.EXISTS:
            kwargs["ConditionExpression"] = f"attribute_exists({PK})"
        else:
            assert isinstance(predicate, store.Equals)  # check_predicate allows nothing else
            # A comparison with a missing item's attribute is false, so no existence check.
            kwargs["ConditionExpression"] = f"{V} = :prev"
            kwargs["ExpressionAttributeValues"] = {":prev": {"B": predicate.value}}
        self._call(self._client.put_item, **kwargs)

    def delete(self, partition: bytes, key: bytes) -> None:
        store.check_key(partition, key)
        self._call(
            self._client.delete_item, TableName=self.table_name, Key=self._key(partition, key)
        )

    def delete_if(self, partition: bytes, key: bytes, predicate: store.Equals) -> None:
        store.check_key(partition, key)
        store.check_delete_predicate(predicate)
        # A comparison with a missing item's attribute is false: a missing key fails too.
        self._call(
            self._client.delete_item,
            TableName=self.table_name,
            Key=self._key(partition, key),
            ConditionExpression=f"{V} = :prev",
            ExpressionAttributeValues={":prev": {"B": predicate.value}},
        )

    def batch_get(self, items: Sequence[tuple[bytes, bytes]]) -> list[GetResult | None]:
        store.check_batch_keys(items)
        # DynamoDB refuses duplicate keys in one request: read each distinct key once.
        found: dict[tuple[bytes, bytes], bytes] = {}
        distinct = list(dict.fromkeys((bytes(p), bytes(k)) for p, k in items))
        for i in range(0, len(distinct), BATCH_GET_MAX_KEYS):
            chunk = distinct[i : i + BATCH_GET_MAX_KEYS]
            pending: dict = {
                self.table_name: {
                    "Keys": [self._key(p, k) for p, k in chunk],
                    "ConsistentRead": True,
                    "ProjectionExpression": f"{PK}, {K}, {V}",
                }
            }

            def send(request: dict) -> dict:
                resp = self._call(self._client.batch_get_item, RequestItems=request)
                for item in resp.get("Responses", {}).get(self.table_name, []):
                    found[(item[PK]["B"], item[K]["B"])] = item[V]["B"]
                return resp.get("UnprocessedKeys") or {}

            self._drain(pending, send, lambda req: len(req[self.table_name]["Keys"]))
        results: list[GetResult | None] = []
        for p, k in items:
            value = found.get((bytes(p), bytes(k)))
            results.append(None if value is None else GetResult(value, value))
        return results

    def batch_set(self, items: Sequence[tuple[bytes, bytes, bytes]]) -> None:
        store.check_batch_items(items)
        # Duplicate keys are refused in one request; the last write of a key wins, as if
        # the items had been written in order.
        last: dict[tuple[bytes, bytes], bytes] = {}
        for p, k, v in items:
            last.pop((bytes(p), bytes(k)), None)
            last[(bytes(p), bytes(k))] = bytes(v)
        self._batch_write(
            [{"PutRequest": {"Item": self._item(p, k, v)}} for (p, k), v in last.items()]
        )

    def batch_delete(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        store.check_batch_keys(items)
        distinct = dict.fromkeys((bytes(p), bytes(k)) for p, k in items)
        self._batch_write([{"DeleteRequest": {"Key": self._key(p, k)}} for p, k in distinct])

    def close(self) -> None:
        self._client.close()

    # ---- internals ----

    def _item(self, partition: bytes, key: bytes, value: bytes) -> dict:
        return {PK: {"B": partition}, K: {"B": key}, V: {"B": value}}

    def _batch_write(self, requests: list[dict]) -> None:
        for i in range(0, len(requests), BATCH_WRITE_MAX_ITEMS):
            pending = {self.table_name: requests[i : i + BATCH_WRITE_MAX_ITEMS]}

            def send(request: dict) -> dict:
                resp = self._call(self._client.batch_write_item, RequestItems=request)
                return resp.get("UnprocessedItems") or {}

            self._drain(pending, send, lambda req: len(req[self.table_name]))

    def _drain(
        self, request: dict, send: Callable[[dict], dict], count: Callable[[dict], int]
    ) -> None:
        """Send a batch request until nothing is left unprocessed.

        DynamoDB leaves items unprocessed both when throttled and when a response hits its
        size cap (16 MB for BatchGetItem; dynalite caps it near 1 MB). A round that made
        progress is retried at once; only rounds without progress back off and count
        toward the throttling bound.
        """
        stalled = 0
        while request:
            before = count(request)
            left = send(request)
            if left and count(left) >= before:
                if stalled >= self.max_throttle_retries:
                    raise store.Throttled(
                        f"DynamoDB left {count(left)} batch items unprocessed after "
                        f"{stalled + 1} attempts",
                        retry_delay=jitter.exponential(
                            stalled, self.backoff_base, self.backoff_max
                        ),
                    )
                time.sleep(self._backoff(stalled))
                stalled += 1
            request = left

    def _page(
        self, partition: bytes, lower: bytes, after: bytes | None, end: bytes | None, limit: int
    ) -> tuple[list[KeyValue], bytes | None]:
        values: dict = {":p": {"B": partition}}
        # A key condition takes one sort-key comparison. With both bounds, BETWEEN is
        # inclusive of `end`; PagedScanIterator drops a returned `end` key.
        if end is not None and lower:
            condition = f"{PK} = :p AND {K} BETWEEN :lo AND :end"
            values[":lo"], values[":end"] = {"B": lower}, {"B": end}
        elif end is not None:
            condition = f"{PK} = :p AND {K} < :end"
            values[":end"] = {"B": end}
        elif lower:
            condition = f"{PK} = :p AND {K} >= :lo"
            values[":lo"] = {"B": lower}
        else:
            condition = f"{PK} = :p"
        kwargs: dict = {
            "TableName": self.table_name,
            "KeyConditionExpression": condition,
            "ExpressionAttributeValues": values,
            "ConsistentRead": True,
            "Limit": limit,
            "ProjectionExpression": f"{K}, {V}",
        }
        if after is not None:
            # `after` was returned under this same condition, so it lies inside the query's
            # bounds (DynamoDB requires that); it need not still exist.
            kwargs["ExclusiveStartKey"] = self._key(partition, after)
        resp = self._call(self._client.query, **kwargs)
        page = [KeyValue(item[K]["B"], item[V]["B"]) for item in resp.get("Items", [])]
        # Pages end at `limit` items or at 1 MB of data; LastEvaluatedKey says which
        # (it is present, possibly needlessly, whenever the page was cut short).
        last = resp.get("LastEvaluatedKey")
        return page, (last[K]["B"] if last else None)


def _error_code(e: BaseException | None) -> str:
    if isinstance(e, botocore.exceptions.ClientError):
        return e.response.get("Error", {}).get("Code", "")
    return ""


def _translate(e: botocore.exceptions.ClientError, code: str) -> errors.QuarryError:
    message = e.response.get("Error", {}).get("Message", str(e))
    if code == "ConditionalCheckFailedException":
        return store.PredicateFailed("predicate failed")
    if code in _UNAVAILABLE_CODES:
        return store.BackendUnavailable(f"DynamoDB {code}: {message}")
    if code == "ValidationException":
        # Inputs are validated before the call; reaching here means a limit we do not know.
        return errors.InvalidArgument(f"DynamoDB rejected the request: {message}")
    return errors.Internal(f"DynamoDB {code}: {message}")
