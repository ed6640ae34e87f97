"""Client retries: only retryable codes, jittered backoff within a budget, RetryInfo,
span events, and PutObjects replayed as a whole stream."""

from __future__ import annotations

import logging
import time
from concurrent import futures

import grpc
import pytest

from quarry import errors, telemetry
from quarry.client import RETRY_EVENT, Client, RetryPolicy
from quarry.client.retry import Retrier
from quarry.graveler import errors as gerrors
from quarry.v1 import types_pb2
from support.client_fakes import entries

# ---- the policy on its own (fake clock, no sleeping) -------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_backoff_grows_exponentially_with_jitter_and_caps():
    policy = RetryPolicy(base_delay=0.1, max_delay=1.0, multiplier=2.0, jitter=0.5)
    assert policy.backoff(1, rng=lambda: 0.0) == pytest.approx(0.1)
    assert policy.backoff(1, rng=lambda: 1.0) == pytest.approx(0.05)
    assert policy.backoff(3, rng=lambda: 0.0) == pytest.approx(0.4)
    assert policy.backoff(10, rng=lambda: 0.0) == pytest.approx(1.0)
    delays = {policy.backoff(2) for _ in range(50)}
    assert len(delays) > 1 and all(0.1 <= d <= 0.2 for d in delays)


def test_retrier_stops_at_the_budget_without_oversleeping():
    clock = FakeClock()
    policy = RetryPolicy(base_delay=0.1, max_delay=0.4, jitter=0.0, budget=1.0, max_attempts=0)
    attempts = []

    def attempt(n):
        attempts.append(n)
        raise errors.Unavailable("down")

    with pytest.raises(errors.Unavailable):
        Retrier(policy, "X", sleep=clock.sleep, clock=clock).run(attempt)
    # 0.1 + 0.2 + 0.4 = 0.7; another 0.4 would end past the 1.0 s budget.
    assert clock.sleeps == pytest.approx([0.1, 0.2, 0.4])
    assert attempts == [1, 2, 3, 4]


def test_retrier_honours_max_attempts():
    clock = FakeClock()
    attempts = []

    def attempt(n):
        attempts.append(n)
        raise errors.ResourceExhausted("throttled", retry_delay=0.01)

    with pytest.raises(errors.ResourceExhausted):
        Retrier(RetryPolicy(max_attempts=3, budget=100), "X", sleep=clock.sleep, clock=clock).run(
            attempt
        )
    assert attempts == [1, 2, 3]


def test_retrier_uses_the_server_delay():
    clock = FakeClock()
    results = iter([errors.Aborted("busy", retry_delay=0.75), "ok"])

    def attempt(_n):
        item = next(results)
        if isinstance(item, Exception):
            raise item
        return item

    assert (
        Retrier(RetryPolicy(base_delay=0.01), "X", sleep=clock.sleep, clock=clock).run(attempt)
        == "ok"
    )
    assert clock.sleeps == [0.75]


def test_policy_rejects_nonsense():
    with pytest.raises(ValueError):
        RetryPolicy(jitter=2)
    with pytest.raises(ValueError):
        RetryPolicy(budget=-1)
    assert RetryPolicy.none().max_attempts == 1


# ---- against the fake server ---------------------------------------------------------------


def test_aborted_is_retried_until_it_succeeds(fake, client):
    fake.script.fail("GetBranch", *(errors.Aborted("lost a race") for _ in range(3)))
    branch = client.get_branch("repo", "main")
    assert branch.name == "main" and branch.commit_id == "c1"
    assert fake.script.calls["GetBranch"] == 4


def test_domain_subclass_with_retryable_code_is_retried(fake, client):
    fake.script.fail(
        "Commit",
        gerrors.BranchContended("kept changing"),
        errors.ResourceExhausted("throttled", retry_delay=0.01),
        errors.Unavailable("restarting"),
    )
    outcome = client.commit("repo", "main", "msg", metadata={"k": "v"})
    assert outcome.commit.id == "c2" and outcome.summary.added == 1
    assert fake.script.calls["Commit"] == 4


def test_failed_precondition_is_not_retried(fake, client):
    fake.script.fail("Commit", gerrors.NoChanges("nothing to commit", metadata={"branch": "main"}))
    with pytest.raises(errors.FailedPrecondition) as caught:
        client.commit("repo", "main", "msg")
    assert isinstance(caught.value, gerrors.NoChanges)
    assert caught.value.reason == "NO_CHANGES"
    assert caught.value.metadata == {"branch": "main"}
    assert str(caught.value) == "nothing to commit"
    assert fake.script.calls["Commit"] == 1


def test_gives_up_within_the_budget(fake):
    fake.script.fail_always("GetBranch", errors.Unavailable("still down"))
    policy = RetryPolicy(base_delay=0.02, max_delay=0.05, budget=0.3, max_attempts=0)
    with fake.client(retry=policy) as client:
        started = time.monotonic()
        with pytest.raises(errors.Unavailable, match="still down"):
            client.get_branch("repo", "main")
        elapsed = time.monotonic() - started
    # The budget plus the last call's own time, with room for a stalled CI machine (a run once
    # took 2.5 s here): a policy that ignored its budget (max_attempts=0: no attempt cap) would
    # retry until the test's timeout, and the attempts would exceed what the budget allows.
    assert elapsed < 0.3 + 5.0
    assert 4 <= fake.script.calls["GetBranch"] <= 0.3 / 0.02 + 2


def test_no_retry_policy(fake):
    fake.script.fail("GetBranch", errors.Aborted("lost"))
    with fake.client(retry=RetryPolicy.none()) as client, pytest.raises(errors.Aborted):
        client.get_branch("repo", "main")
    assert fake.script.calls["GetBranch"] == 1


def test_server_retry_delay_is_honoured(fake):
    fake.script.fail("GetBranch", errors.ResourceExhausted("slow down", retry_delay=0.25))
    with fake.client(retry=RetryPolicy(base_delay=0.001, budget=5)) as client:
        started = time.monotonic()
        client.get_branch("repo", "main")
        assert time.monotonic() - started >= 0.25
    assert fake.script.calls["GetBranch"] == 2


def test_server_retry_delay_beyond_the_budget_fails_at_once(fake):
    fake.script.fail("GetBranch", errors.ResourceExhausted("come back later", retry_delay=30))
    with fake.client(retry=RetryPolicy(budget=1.0)) as client:
        started = time.monotonic()
        with pytest.raises(errors.ResourceExhausted) as caught:
            client.get_branch("repo", "main")
        assert time.monotonic() - started < 5  # not the 30 s it was told to wait
    assert caught.value.retry_delay == pytest.approx(30)
    assert fake.script.calls["GetBranch"] == 1


def test_unreachable_server_is_unavailable_after_the_budget():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    policy = RetryPolicy(base_delay=0.01, max_delay=0.05, budget=0.3)
    with (
        Client(f"127.0.0.1:{port}", f"127.0.0.1:{port}", retry=policy, timeout=2) as client,
        pytest.raises(errors.Unavailable) as caught,
    ):
        client.get_repository("repo")
    assert caught.value.reason == "UNAVAILABLE"


def test_each_retry_is_a_span_event(fake, client):
    exporter = telemetry.use_in_memory_exporter()
    exporter.clear()
    fake.script.fail(
        "GetBranch",
        errors.Aborted("lost a race"),
        errors.ResourceExhausted("throttled", retry_delay=0.01),
    )
    with telemetry.tracer("test").start_as_current_span("caller") as span:
        client.get_branch("repo", "main")
    finished = [
        s
        for s in exporter.get_finished_spans()
        if s.context.span_id == span.get_span_context().span_id
    ]
    events = [e for e in finished[0].events if e.name == RETRY_EVENT]
    assert [e.attributes["quarry.retry.attempt"] for e in events] == [1, 2]
    assert events[0].attributes["rpc.grpc.status_code"] == "ABORTED"
    assert events[0].attributes["rpc.method"] == "BranchManager/GetBranch"
    assert events[0].attributes["quarry.retry.delay_source"] == "backoff"
    assert events[1].attributes["quarry.error.reason"] == "RESOURCE_EXHAUSTED"
    assert events[1].attributes["quarry.retry.delay_source"] == "server"
    assert events[1].attributes["quarry.retry.delay_seconds"] == pytest.approx(0.01)


def test_merge_retry_passes_the_hint_back(fake, client):
    hint = types_pb2.MergeRetryHint(hint_metarange_id="mr-123", attempts=5)
    fake.script.fail("Merge", errors.Aborted("head moved", details=[hint]))
    response = client.merge("repo", "feature", "main", strategy="source-wins")
    assert response.commit.id == "m1"
    first, second = fake.script.requests["Merge"]
    assert first.hint_metarange_id == ""
    assert second.hint_metarange_id == "mr-123"
    assert second.strategy == types_pb2.MERGE_STRATEGY_SOURCE_WINS


# ---- PutObjects ------------------------------------------------------------------------------


def test_put_objects_replays_the_whole_stream(fake, client):
    fake.branch_manager.stream_failures = 2
    fake.branch_manager.fail_after = 3
    progress: list[int] = []
    one_shot = (e for e in entries(2500))  # a generator: cannot be re-iterated
    count = client.put_objects("repo", "main", one_shot, batch_size=500, progress=progress.append)
    assert count == 2500
    streams = fake.branch_manager.streams
    assert len(streams) == 3
    final = streams[-1]
    assert [len(r.entries) for r in final] == [500] * 5
    assert (final[0].repository, final[0].branch) == ("repo", "main")
    assert all(not r.repository for r in final[1:])
    assert [e.path for r in final for e in r.entries] == [f"{i:05d}" for i in range(2500)]
    # Progress counts entries handed to the stream once, however often they are re-sent.
    assert progress == [500, 1000, 1500, 2000, 2500]


def test_put_objects_without_replay_is_not_retried_after_sending(fake, client):
    fake.branch_manager.stream_failures = 1
    with pytest.raises(errors.Aborted):
        client.put_objects("repo", "main", iter(entries(50)), batch_size=10, replay=False)
    assert len(fake.branch_manager.streams) == 1


def test_put_objects_non_retryable_error(fake, client):
    fake.branch_manager.stream_failures = 1
    fake.branch_manager.stream_error = gerrors.InvalidEntry("bad entry", metadata={"path": "x"})
    with pytest.raises(gerrors.InvalidEntry) as caught:
        client.put_objects("repo", "main", entries(30), batch_size=10)
    assert caught.value.metadata == {"path": "x"}
    assert len(fake.branch_manager.streams) == 1


def test_put_objects_surfaces_the_callers_exception(fake, client, caplog):
    def broken():
        yield from entries(25)
        raise ValueError("source broke")

    with caplog.at_level(logging.ERROR), pytest.raises(ValueError, match="source broke"):
        client.put_objects("repo", "main", broken(), batch_size=10)
    assert "Exception iterating requests" not in caplog.text


def test_put_objects_accepts_mappings_and_checks_them(fake, client):
    count = client.put_objects(
        "repo", "main", [{"path": "a", "size_bytes": 3, "mtime": 1.5}, types_pb2.Entry(path="b")]
    )
    assert count == 2
    sent = fake.branch_manager.streams[0][0].entries
    assert sent[0].mtime.seconds == 1 and sent[0].mtime.nanos == 500_000_000
    with pytest.raises(TypeError, match="unknown Entry fields: bogus"):
        client.put_objects("repo", "main", [{"path": "a", "bogus": 1}])


def test_put_objects_empty_stream_still_names_the_branch(fake, client):
    assert client.put_objects("repo", "main", []) == 0
    (only,) = fake.branch_manager.streams[0]
    assert (only.repository, only.branch, len(only.entries)) == ("repo", "main", 0)


def test_put_objects_splits_batches_by_bytes(fake, client):
    big = [types_pb2.Entry(path=f"p{i}", metadata={"k": "x" * 4000}) for i in range(10)]
    client.put_objects("repo", "main", big, batch_size=1000, max_batch_bytes=10_000)
    assert [len(r.entries) for r in fake.branch_manager.streams[0]] == [2] * 5


def test_errors_keep_grpc_codes_without_error_info(fake):
    fake.branch_manager.delay = 0.5
    with (
        fake.client(timeout=0.1, retry=RetryPolicy.none()) as client,
        pytest.raises(errors.QuarryError) as caught,
    ):
        client.get_repository("slow")
    assert caught.value.reason == "DEADLINE_EXCEEDED"
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    # A server without the service at all: UNIMPLEMENTED, no ErrorInfo.
    bare = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    port = bare.add_insecure_port("127.0.0.1:0")
    bare.start()
    try:
        with (
            Client(f"127.0.0.1:{port}", f"127.0.0.1:{port}") as client,
            pytest.raises(errors.Unimplemented) as caught,
        ):
            client.get_commit("repo", "main")
        assert caught.value.code == grpc.StatusCode.UNIMPLEMENTED
    finally:
        bare.stop(None)
