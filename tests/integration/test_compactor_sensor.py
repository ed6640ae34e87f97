"""The compactor-sensor in the suite (real gRPC servers on loopback, in-process): writes are
reported asynchronously by branch-manager, statistics and candidates are served over gRPC,
writes never slow down or fail when the sensor is gone, and a branch past a threshold gets
compacted by the committer."""

from __future__ import annotations

import io
import socket
from contextlib import redirect_stdout

import pytest
from prometheus_client import REGISTRY

from quarry.cli.main import main as quarry_main
from quarry.client import RetryPolicy
from support.suite import running_suite, suite_fixture
from support.wait import wait_until

# Small intervals keep the tests fast; the thresholds are tiny so a few writes cross them.
FAST = dict(
    staging_report_interval_seconds=0.05,
    compaction_check_interval_seconds=0.05,
    compaction_tombstones_threshold=5,
    compaction_min_interval_seconds=60.0,
)


def files(n, prefix="f"):
    return [
        {
            "path": f"{prefix}/{i:04d}",
            "physical_address": f"s3://b/{prefix}/{i}",
            "size_bytes": i + 1,
            "checksum": f"c{i}",
        }
        for i in range(n)
    ]


def dropped_reports():
    return REGISTRY.get_sample_value("quarry_staging_reports_dropped_total") or 0.0


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


suite = suite_fixture(compactor_sensor=True, **FAST)


@pytest.fixture
def client(suite):
    with suite.client(retry=RetryPolicy(budget=5.0), timeout=30) as c:
        yield c


# ---- reports and statistics ---------------------------------------------------------------------


def test_writes_are_reported_and_stats_show_them(suite, client):
    client.create_repository("reported", suite.namespace("reported"))
    first = client.branch_staging_stats("reported", "main")  # known from now on
    assert (first.puts, first.deletes, first.sealed_tokens) == (0, 0, 0)
    assert not first.HasField("last_compaction")

    client.put_objects("reported", "main", files(4))
    client.commit("reported", "main", "four files")
    client.put_object("reported", "main", **files(1, "single")[0])
    client.put_objects("reported", "main", files(2, "batch"))
    client.delete_objects("reported", "main", ["f/0000", "f/0001", "no/such/path"])

    # Only reports feed the counters of a known branch: they arrive asynchronously.
    def counted():
        stats = client.branch_staging_stats("reported", "main")
        return stats if (stats.puts, stats.deletes) == (3, 2) else None

    stats = wait_until(counted, what="the reported writes")
    assert stats.sealed_tokens == 0
    # The commit retired the token of the first four puts.
    in_memory = suite.sensor._stats(("reported", "main"))
    assert [(t.puts, t.deletes) for t in in_memory.tokens] == [(3, 2)]


def test_stats_of_unknown_refs_are_not_found(client):
    from quarry.graveler import errors as gerrors

    with pytest.raises(gerrors.RepositoryNotFound):
        client.branch_staging_stats("no-such-repo", "main")


@pytest.mark.parametrize(("repo", "branch"), [("..", "main"), ("r", "a\x00b"), ("r" * 300, "m")])
def test_stats_of_invalid_names_are_invalid_name(client, repo, branch):
    from quarry import errors

    with pytest.raises(errors.QuarryError) as refused:
        client.branch_staging_stats(repo, branch)
    assert refused.value.code.name == "INVALID_ARGUMENT"
    assert refused.value.reason == "INVALID_NAME"


def test_candidates_are_served_over_grpc(tmp_path):
    # No evaluation loop here (compactor_enabled=False on the sensor would also stop the
    # reports), so the list stays put: stop the loop, keep the servicer.
    with running_suite(tmp_path, compactor_sensor=True, **FAST) as suite:
        suite.sensor.stop()
        with suite.client(retry=RetryPolicy(budget=5.0)) as client:
            client.create_repository("cands", suite.namespace("cands"))
            client.create_branch("cands", "dev")
            for branch, n in (("main", 6), ("dev", 8)):
                client.put_objects("cands", branch, files(n))
                client.commit("cands", branch, "files")
                client.delete_objects("cands", branch, [f["path"] for f in files(n)])
            client.put_objects("cands", "main", files(3, "other"))

            # Every write's report first (they arrive asynchronously, in order): the first
            # stats read below counts the branch's staged items from the KV (it is not known
            # to be rebuilt), and a report still in flight then would count its items twice.
            def reported():
                found = {c.branch: (c.puts, c.deletes) for c in client.compaction_candidates()}
                return found == {"main": (6 + 3, 6), "dev": (8, 8)}

            wait_until(reported, what="every write's report")
            # The list is served from memory; reading the stats re-reads the branch records
            # and forgets the puts of the tokens the commits retired.
            for branch in ("main", "dev"):
                client.branch_staging_stats("cands", branch)
            candidates = client.compaction_candidates()
            assert [(c.repository, c.branch, c.puts, c.deletes, c.reason) for c in candidates] == [
                ("cands", "dev", 0, 8, "tombstones"),
                ("cands", "main", 3, 6, "tombstones"),
            ]
            assert len(client.compaction_candidates(page_size=1)) == 1


def test_stats_command(suite, client):
    client.create_repository("cli-stats", suite.namespace("cli-stats"))
    client.put_objects("cli-stats", "main", files(2))
    out = io.StringIO()
    with redirect_stdout(out):
        code = quarry_main(
            [
                "stats",
                "cli-stats",
                "main",
                "--compactor-sensor",
                suite.targets["compactor-sensor"],
                "--branch-manager",  # where the CLI logs in
                suite.targets["branch-manager"],
            ]
        )
    assert code == 0, out.getvalue()
    fields = dict(line.split(":", 1) for line in out.getvalue().splitlines())
    assert fields["staged entries"].strip() == "2"
    assert fields["staged tombstones"].strip() == "0"
    assert fields["last compaction"].strip() == "never"


# ---- writes never depend on the sensor ----------------------------------------------------------


def test_writes_do_not_fail_without_the_sensor(tmp_path):
    """PutObject calls on each of three suites: no reporter at all, a reporter dialing an
    address nobody listens on, and a reporter whose sensor was stopped; every write
    succeeds and the reporters drop their reports. (That a write never waits for the
    reporter is test_reporter.py::test_record_never_waits_for_a_slow_sensor; latency
    figures are `make bench`'s, not a test's.)"""
    calls = 50
    with (
        running_suite(tmp_path / "none") as plain,
        running_suite(
            tmp_path / "wrong",
            compactor_enabled=True,
            compactor_sensor_address=f"127.0.0.1:{closed_port()}",
            staging_report_interval_seconds=0.05,
        ) as wrong,
        running_suite(tmp_path / "stopped", compactor_sensor=True, **FAST) as stopped,
    ):
        stopped.stop("compactor-sensor")
        dropped_before = dropped_reports()
        suites = {"none": plain, "wrong address": wrong, "sensor stopped": stopped}
        clients = {
            name: s.client(retry=RetryPolicy(budget=0.0), timeout=10) for name, s in suites.items()
        }
        try:
            for name, client in clients.items():
                client.create_repository("lat", suites[name].namespace("lat"))
                for warmup in files(20, "warmup"):
                    client.put_object("lat", "main", **warmup)
            for f in files(calls):
                for client in clients.values():
                    client.put_object("lat", "main", **f)  # any failure fails the test
            wait_until(
                lambda: dropped_reports() > dropped_before, what="the reporters to drop reports"
            )
        finally:
            for client in clients.values():
                client.close()
        for client_suite in suites.values():
            assert (
                len(
                    client_suite.client()
                    .list_objects("lat", "main", prefix="f/", page_size=1000)
                    .entries
                )
                == calls
            )


# ---- the end-to-end trigger -------------------------------------------------------------------


def test_sensor_triggers_a_real_compaction(suite, client):
    client.create_repository("e2e", suite.namespace("e2e"))
    client.put_objects("e2e", "main", files(10))
    client.commit("e2e", "main", "ten files")
    client.delete_objects("e2e", "main", [f["path"] for f in files(6)])

    branch = wait_until(
        lambda: (b := client.get_branch("e2e", "main")).compacted_metarange_id and b,
        what="the compaction",
    )
    assert branch.compaction_start_time.seconds > 0
    assert [e.path for e in client.iter_objects("e2e", "main", prefix="f/")] == [
        f["path"] for f in files(10)[6:]
    ]
    stats = wait_until(
        lambda: (s := client.branch_staging_stats("e2e", "main")).deletes == 0 and s,
        what="the counters to reset",
    )
    assert stats.last_compaction.seconds > 0
    assert client.compaction_candidates() == [] or all(
        c.repository != "e2e" for c in client.compaction_candidates()
    )
    # Uncommitted changes survive compaction and commit as usual.
    summary = client.commit("e2e", "main", "six removed").summary
    assert summary.removed == 6


def test_compact_command(suite, client):
    client.create_repository("cli-compact", suite.namespace("cli-compact"))
    client.put_objects("cli-compact", "main", files(3))
    out = io.StringIO()
    with redirect_stdout(out):
        code = quarry_main(
            [
                "compact",
                "cli-compact",
                "main",
                "--committer",
                suite.targets["committer"],
                "--branch-manager",
                suite.targets["branch-manager"],
            ]
        )
    assert code == 0, out.getvalue()
    branch = client.get_branch("cli-compact", "main")
    assert branch.compacted_metarange_id
    assert branch.compacted_metarange_id in out.getvalue()
