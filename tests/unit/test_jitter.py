"""Quarry's backoff jitter never draws from the global `random` state: it belongs to the
application (a seeded Spark job, a Hypothesis test), and a draw from a background thread of
Quarry's (a readiness probe backing off) would change the sequence the application sees."""

import random

import pytest

from quarry.client.retry import RetryPolicy as ClientRetryPolicy
from quarry.graveler.retry import RetryPolicy as CasRetryPolicy
from quarry.kv.dynamodb import DynamoDBStore
from quarry.runtime.periodic import PeriodicWorker


def test_backoffs_leave_the_global_random_state_alone():
    random.seed(1234)
    expected = [random.random() for _ in range(3)]
    random.seed(1234)
    worker = PeriodicWorker("probe", lambda: True, 1.0, retry_initial=0.1, retry_max=2.0)
    delays = {worker.next_delay(succeeded=False) for _ in range(20)}
    client = ClientRetryPolicy()
    delays |= {client.backoff(2) for _ in range(20)}
    CasRetryPolicy(base_seconds=0.0001, cap_seconds=0.0001).backoff(0)
    dynamodb = object.__new__(DynamoDBStore)  # only its backoff formula, no table
    dynamodb.backoff_base, dynamodb.backoff_max = 0.05, 2.0
    delays |= {dynamodb._backoff(3) for _ in range(20)}
    assert len(delays) > 30  # jittered: they do draw random numbers...
    assert [random.random() for _ in range(3)] == expected  # ...but not from this state


def test_trace_and_span_ids_leave_the_global_random_state_alone():
    # With tracing on, every call's span draws ids: from Quarry's generator, not this state.
    from quarry import telemetry

    telemetry.use_in_memory_exporter()
    random.seed(99)
    expected = [random.random() for _ in range(3)]
    random.seed(99)
    ids = set()
    for _ in range(20):
        with telemetry.tracer().start_as_current_span("s") as span:
            ids.add((span.get_span_context().trace_id, span.get_span_context().span_id))
    assert len(ids) == 20 and all(trace_id and span_id for trace_id, span_id in ids)
    assert [random.random() for _ in range(3)] == expected


def test_one_backoff_formula_with_an_injectable_draw():
    from quarry import jitter

    assert [jitter.exponential(n, 0.1, 1.0) for n in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert jitter.exponential(2, 1.0, 100.0, multiplier=3.0) == 9.0
    # The factor runs from `high` (draw 0) down to `low` (draw → 1).
    assert jitter.backoff(3, 0.1, 1.0, draw=lambda: 0.0) == 0.8
    assert jitter.backoff(3, 0.1, 1.0, draw=lambda: 0.5) == 0.8 * 0.75
    assert jitter.backoff(3, 0.1, 1.0, low=0.0, draw=lambda: 0.5) == 0.4
    for attempt in range(10):
        delay = jitter.backoff(attempt, 0.01, 0.5)
        assert 0.5 * min(0.5, 0.01 * 2**attempt) <= delay <= min(0.5, 0.01 * 2**attempt)


def test_every_retry_loop_uses_it():
    """The client's policy, the CAS policy (whose sleep is injected: no real sleep here) and
    DynamoDB's throttling backoff are jitter.backoff with their own limits."""
    client = ClientRetryPolicy(base_delay=0.1, max_delay=1.0, jitter=0.5)
    assert client.backoff(1, rng=lambda: 0.0) == 0.1  # retry 1 waits the base delay
    assert client.backoff(4, rng=lambda: 0.0) == 0.8
    assert client.backoff(4, rng=lambda: 1.0) == 0.4  # down to (1 - jitter)
    slept: list[float] = []
    cas = CasRetryPolicy(max_attempts=4, base_seconds=0.01, cap_seconds=0.02, sleep=slept.append)
    taken = []
    with pytest.raises(LookupError):
        for attempt in cas.attempts(lambda: LookupError("exhausted")):
            taken.append(attempt)
    assert taken == [0, 1, 2, 3] and len(slept) == 3
    assert 0.005 <= slept[0] <= 0.01 and all(0.01 <= s <= 0.02 for s in slept[1:])
    dynamodb = object.__new__(DynamoDBStore)
    dynamodb.backoff_base, dynamodb.backoff_max = 0.05, 2.0
    assert all(0 <= dynamodb._backoff(10) <= 2.0 for _ in range(20))
