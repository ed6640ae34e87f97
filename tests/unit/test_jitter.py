"""Quarry's backoff jitter never draws from the global `random` state: it belongs to the
application (a seeded Spark job, a Hypothesis test), and a draw from a background thread of
Quarry's (a readiness probe backing off) would change the sequence the application sees."""

import random

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
