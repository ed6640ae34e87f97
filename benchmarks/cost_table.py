"""DynamoDB cost per operation (issue 14, target 5), from the kv-gateway's capacity metering:
what DynamoDB would charge (read units: 1 per 4 KB strongly consistent read; write units:
1 per 1 KB written) for each public operation, at history depth 1 and 200, and the
hot-partition ceiling those units imply.

The suite runs as separate processes (`quarry serve ...`) with the kv-gateway's limiter ON
at DynamoDB's per-partition limits (3,000 RCU/s, 1,000 WCU/s): the table phase must see no
throttling. Each operation is measured on its own (capacity report before and after each
call, setup excluded) and averaged over REPEATS calls; the staging dropper is parked so no
background traffic lands in a delta.

Ceilings: the repository partition (`repo/<repo>/<instance>`) holds every branch record of a
repository, a staging partition (`staging/<token>`) one branch's staged writes. Per branch =
one hot branch (its staging partition and the repository partition); per repository = all
its branches together (the repository partition only: staging partitions scale out with
branches); per installation = the single `quarry` partition (repository records: writers
and ref-changing flows read theirs fresh) and the single `cleanup` queue, shared by every
repository. They are uncontended figures (every call pays its own branch read); concurrent
reads of one branch share branch reads (benchmarks/branch_reads.py measures how many).

The ceiling is then checked against the limiter itself, scaled down so that this machine can
reach it: a second suite whose limiter allows CHECK_RCU read / CHECK_WCU write units per
second per partition; one client drives StatObject (clean) and PutObject on one branch past
the ceiling, and the calls that succeed per second must come out at the predicted ceiling.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import (
    branch_manager_pb2_grpc,
    committer_pb2,
    committer_pb2_grpc,
    kv_pb2,
    kv_pb2_grpc,
    types_pb2,
)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from support.processes import free_port, quarry_env, wait_serving

SERVICES = ["kv-gateway", "range-writer", "branch-manager", "committer"]
REPEATS = int(os.environ.get("BENCH_COST_REPEATS", "20"))
DEEP = int(os.environ.get("BENCH_COST_DEPTH", "200"))
COMMITTED = 1000  # entries in main's first commit
COMMIT_CHANGES = 100  # staged changes per measured Commit
MERGE_CHANGES = 10  # committed changes on the source of a measured Merge
PAGE = 100  # ListObjects page size
PUT_BATCH = 500  # entries per measured PutObjects
READ_LIMIT, WRITE_LIMIT = 3000.0, 1000.0  # DynamoDB, per partition per second
CHECK_RCU = float(os.environ.get("BENCH_COST_CHECK_RCU", "150"))
CHECK_WCU = float(os.environ.get("BENCH_COST_CHECK_WCU", "50"))
CHECK_SECONDS = float(os.environ.get("BENCH_COST_CHECK_SECONDS", "4"))
CHECK_TOLERANCE = 0.2  # achieved within ±20% of the predicted ceiling
CLASSES = ("repo", "staging", "quarry", "cleanup")


@dataclass
class Units:
    """Read/write units by partition class (a delta of the capacity report)."""

    read: dict[str, float]
    write: dict[str, float]
    throttled: int = 0

    @property
    def rcu(self) -> float:
        return sum(self.read.values())

    @property
    def wcu(self) -> float:
        return sum(self.write.values())

    def scaled(self, factor: float) -> Units:
        return Units(
            {k: v * factor for k, v in self.read.items()},
            {k: v * factor for k, v in self.write.items()},
            self.throttled,
        )

    def __add__(self, other: Units) -> Units:
        keys = set(self.read) | set(other.read)
        return Units(
            {k: self.read.get(k, 0) + other.read.get(k, 0) for k in keys},
            {k: self.write.get(k, 0) + other.write.get(k, 0) for k in keys},
            self.throttled + other.throttled,
        )


ZERO = Units({}, {})


class Suite:
    def __init__(self, ports: dict[str, int], home: Path) -> None:
        self.home = home
        self.ports = ports
        self.bm = branch_manager_pb2_grpc.BranchManagerStub(
            grpc.insecure_channel(f"127.0.0.1:{ports['branch-manager']}")
        )
        self.cm = committer_pb2_grpc.CommitterStub(
            grpc.insecure_channel(f"127.0.0.1:{ports['committer']}")
        )
        self.kv = kv_pb2_grpc.KVGatewayStub(
            grpc.insecure_channel(f"127.0.0.1:{ports['kv-gateway']}")
        )

    def report(self) -> Units:
        report = self.kv.GetCapacityReport(kv_pb2.GetCapacityReportRequest(top_n=1))
        return Units(
            {c.partition_class: c.usage.read_units for c in report.classes},
            {c.partition_class: c.usage.write_units for c in report.classes},
            sum(c.usage.throttled for c in report.classes),
        )

    def measure(self, call: Callable[[], object]) -> Units:
        before = self.report()
        call()
        after = self.report()
        return Units(
            {k: after.read.get(k, 0) - before.read.get(k, 0) for k in after.read},
            {k: after.write.get(k, 0) - before.write.get(k, 0) for k in after.write},
            after.throttled - before.throttled,
        )


@contextmanager
def running_suite(**settings: str) -> Iterator[Suite]:
    home = Path(tempfile.mkdtemp(prefix="quarry-bench-cost-"))
    ports = {name: free_port() for name in SERVICES}
    for name, port in ports.items():
        prefix = f"QUARRY_{name.upper().replace('-', '_')}"
        settings[f"{prefix}_PORT"] = str(port)
        settings[f"{prefix}_ADDRESS"] = f"127.0.0.1:{port}"
    defaults = {
        "QUARRY_AUTH_ENABLED": "false",
        "QUARRY_KV_LIMITER_ENABLED": "true",
        # No background traffic in a measured delta: the dropper is parked.
        "QUARRY_STAGING_DROP_INTERVAL_SECONDS": "3600",
        "QUARRY_COMPACTOR_ENABLED": "false",
    }
    env = quarry_env(home, **{**defaults, **settings})
    children = []
    try:
        for name in SERVICES:
            children.append(
                subprocess.Popen(
                    [sys.executable, "-m", "quarry.cli.main", "serve", name],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            wait_serving(f"127.0.0.1:{ports[name]}", timeout=90)
        yield Suite(ports, home)
    finally:
        for child in reversed(children):
            child.terminate()
        for child in children:
            child.wait(20)


def entry(path: str, version: str = "1") -> types_pb2.Entry:
    return types_pb2.Entry(
        path=path, physical_address=f"s3://lake/{path}/{version}", size_bytes=100, checksum=version
    )


def put_entries(suite: Suite, repo: str, branch: str, entries: list[types_pb2.Entry]) -> None:
    suite.bm.PutObjects(
        iter(
            [
                bm.PutObjectsRequest(repository=repo, branch=branch, entries=entries[i : i + 1000])
                for i in range(0, len(entries), 1000)
            ]
        )
    )


def commit(suite: Suite, repo: str, branch: str, message: str) -> None:
    suite.cm.Commit(committer_pb2.CommitRequest(repository=repo, branch=branch, message=message))


def make_repository(suite: Suite, name: str, depth: int) -> None:
    """main: COMMITTED entries in its first commit, then depth - 1 more commits."""
    suite.bm.CreateRepository(
        bm.CreateRepositoryRequest(name=name, storage_namespace=str(suite.home / "lake" / name))
    )
    put_entries(suite, name, "main", [entry(f"data/f{i:05d}") for i in range(COMMITTED)])
    commit(suite, name, "main", "load")
    for i in range(depth - 1):
        put_entries(suite, name, "main", [entry(f"history/h{i:04d}")])
        commit(suite, name, "main", f"history {i}")


def stat(suite: Suite, repo: str, branch: str, i: int) -> None:
    suite.bm.StatObject(bm.StatObjectRequest(repository=repo, ref=branch, path=f"data/f{i:05d}"))


def cost_rows(suite: Suite, repo: str) -> dict[str, Units]:
    """Units per operation on `repo` (averaged over REPEATS calls, setup excluded)."""
    rows: dict[str, Units] = {}

    def average(name: str, calls: list[Callable[[], object]], per: float = 1.0) -> None:
        total = ZERO
        for call in calls:
            total = total + suite.measure(call)
        rows[name] = total.scaled(1.0 / (len(calls) * per))

    # Clean main: StatObject and a ListObjects page.
    suite.bm.CreateBranch(bm.CreateBranchRequest(repository=repo, name="reads", source_ref="main"))
    for i in range(3):  # warm the repository record and commit caches
        stat(suite, repo, "reads", i)
    average(
        "StatObject, clean branch",
        [lambda i=i: stat(suite, repo, "reads", i) for i in range(REPEATS)],
    )
    list_page = bm.ListObjectsRequest(repository=repo, ref="reads", prefix="data/", page_size=PAGE)
    average(f"ListObjects page ({PAGE}), clean", [lambda: suite.bm.ListObjects(list_page)] * 5)

    # Dirty: one staged object elsewhere on the branch.
    suite.bm.PutObject(bm.PutObjectRequest(repository=repo, branch="reads", entry=entry("other/x")))
    average(
        "StatObject, dirty branch",
        [lambda i=i: stat(suite, repo, "reads", i) for i in range(REPEATS)],
    )
    average(f"ListObjects page ({PAGE}), dirty", [lambda: suite.bm.ListObjects(list_page)] * 5)

    # Writes on their own branch: the first one of a commit cycle also sets the dirty flag.
    suite.bm.CreateBranch(bm.CreateBranchRequest(repository=repo, name="writes", source_ref="main"))
    average(
        "PutObject",
        [
            lambda i=i: suite.bm.PutObject(
                bm.PutObjectRequest(repository=repo, branch="writes", entry=entry(f"put/p{i:04d}"))
            )
            for i in range(REPEATS)
        ],
    )
    # Batches of PUT_BATCH: a whole batch lands in one staging partition, whose 1,000 WCU/s
    # a batch of 1,000 would use up; the bucket refills between the measured batches.
    batches = [[entry(f"bulk/b{b}/e{i:04d}") for i in range(PUT_BATCH)] for b in range(3)]

    total = ZERO
    for batch in batches:
        time.sleep(1.0)
        total = total + suite.measure(lambda batch=batch: put_entries(suite, repo, "writes", batch))
    rows[f"PutObjects, per entry (x{PUT_BATCH})"] = total.scaled(1.0 / (len(batches) * PUT_BATCH))

    # Commit of COMMIT_CHANGES staged changes; Merge of MERGE_CHANGES committed changes.
    commits = []
    for n in range(5):
        branch = f"commit-{n}"
        suite.bm.CreateBranch(
            bm.CreateBranchRequest(repository=repo, name=branch, source_ref="main")
        )
        put_entries(suite, repo, branch, [entry(f"c{n}/e{i:03d}") for i in range(COMMIT_CHANGES)])
        commits.append(lambda branch=branch: commit(suite, repo, branch, "measured"))
    average(f"Commit ({COMMIT_CHANGES} changes)", commits)
    merges = []
    for n in range(5):
        branch = f"merge-{n}"
        suite.bm.CreateBranch(
            bm.CreateBranchRequest(repository=repo, name=branch, source_ref="main")
        )
        put_entries(suite, repo, branch, [entry(f"m{n}/e{i:03d}") for i in range(MERGE_CHANGES)])
        commit(suite, repo, branch, "source")
        merges.append(
            lambda branch=branch: suite.cm.Merge(
                committer_pb2.MergeRequest(
                    repository=repo, source_ref=branch, destination_branch="main", message="m"
                )
            )
        )
    average(f"Merge ({MERGE_CHANGES} changes)", merges)
    return rows


def ceiling(units: Units, read_limit: float, write_limit: float, classes: tuple[str, ...]) -> float:
    """Requests/s before the first of `classes`' partitions throttles (inf: none is used)."""
    limits = []
    for cls in classes:
        if units.read.get(cls, 0) > 0:
            limits.append(read_limit / units.read[cls])
        if units.write.get(cls, 0) > 0:
            limits.append(write_limit / units.write[cls])
    return min(limits) if limits else float("inf")


def shown(rate: float) -> str:
    return "unbounded" if rate == float("inf") else f"{rate:,.0f}"


def drive(call: Callable[[int], object], seconds: float) -> tuple[float, int]:
    """(successful calls per second, throttled calls) of one client calling as fast as it
    can for `seconds`, after one second spent draining the limiter's burst."""
    i = 0
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # empty the bucket (one second of burst)
        try:
            call(i)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
        i += 1
    ok = throttled = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        try:
            call(i)
            ok += 1
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            throttled += 1
        i += 1
    return ok / (time.monotonic() - start), throttled


def main() -> None:
    with running_suite() as suite:
        make_repository(suite, "depth1", 1)
        make_repository(suite, "deep", DEEP)
        shallow = cost_rows(suite, "depth1")
        deep = cost_rows(suite, "deep")
        throttled = suite.report().throttled

    print(
        f"DynamoDB cost per operation (kv-gateway capacity metering; mean of {REPEATS} "
        f"calls for reads and PutObject, 5 for the rest; limiter on at {READ_LIMIT:,.0f} RCU/s, "
        f"{WRITE_LIMIT:,.0f} WCU/s per partition)"
    )
    header = (
        f"  {'operation':34}{'RCU':>8}{'WCU':>8}   {'repo R/W':>11}{'staging R/W':>13}"
        f"{'other R/W':>11}   {'depth ' + str(DEEP):>9}"
    )
    print(header)
    all_equal = True
    for name, row in shallow.items():
        other = deep[name]
        equal = abs(row.rcu - other.rcu) < 0.05 and abs(row.wcu - other.wcu) < 0.05
        all_equal &= equal

        def pair(cls: str, row: Units = row) -> str:
            return f"{row.read.get(cls, 0):.2f}/{row.write.get(cls, 0):.2f}"

        rest = Units(
            {k: v for k, v in row.read.items() if k not in ("repo", "staging")},
            {k: v for k, v in row.write.items() if k not in ("repo", "staging")},
        )
        print(
            f"  {name:34}{row.rcu:>8.2f}{row.wcu:>8.2f}   {pair('repo'):>11}{pair('staging'):>13}"
            f"{rest.rcu:>6.2f}/{rest.wcu:<4.2f}   "
            + ("same" if equal else f"{other.rcu:.2f}/{other.wcu:.2f}")
        )
    print(
        f"  equal at history depth 1 and {DEEP}: {'MET' if all_equal else 'MISSED'};  "
        f"throttled calls in the table phase: {throttled}"
    )
    print(
        f"  hot-partition ceiling (requests/s before a {READ_LIMIT:,.0f} RCU / "
        f"{WRITE_LIMIT:,.0f} WCU partition throttles; uncontended, no shared reads):"
    )
    print(f"    {'operation':34}{'per branch':>12}{'per repository':>16}{'per installation':>18}")
    for name, row in shallow.items():
        per_branch = ceiling(row, READ_LIMIT, WRITE_LIMIT, ("repo", "staging"))
        per_repo = ceiling(row, READ_LIMIT, WRITE_LIMIT, ("repo",))
        per_installation = ceiling(row, READ_LIMIT, WRITE_LIMIT, ("quarry", "cleanup"))
        print(
            f"    {name:34}{shown(per_branch):>12}{shown(per_repo):>16}"
            f"{shown(per_installation):>18}"
        )

    # The check: a limiter scaled down to CHECK_RCU / CHECK_WCU per partition.
    with running_suite(
        QUARRY_KV_LIMITER_READ_UNITS_PER_SECOND=str(CHECK_RCU),
        QUARRY_KV_LIMITER_WRITE_UNITS_PER_SECOND=str(CHECK_WCU),
    ) as suite:
        make_repository(suite, "check", 1)
        suite.bm.CreateBranch(
            bm.CreateBranchRequest(repository="check", name="writes", source_ref="main")
        )
        for i in range(3):
            stat(suite, "check", "main", i)
        stat_rate, stat_throttled = drive(
            lambda i: stat(suite, "check", "main", i % COMMITTED), CHECK_SECONDS
        )
        put_rate, put_throttled = drive(
            lambda i: suite.bm.PutObject(
                bm.PutObjectRequest(
                    repository="check", branch="writes", entry=entry(f"check/p{i:06d}")
                )
            ),
            CHECK_SECONDS,
        )
    print(
        f"  checked with the limiter scaled to {CHECK_RCU:,.0f} RCU/s, {CHECK_WCU:,.0f} WCU/s "
        f"per partition (one client, one branch, {CHECK_SECONDS:.0f} s past the burst):"
    )
    for name, rate, refused in (
        ("StatObject, clean branch", stat_rate, stat_throttled),
        ("PutObject", put_rate, put_throttled),
    ):
        predicted = ceiling(shallow[name], CHECK_RCU, CHECK_WCU, ("repo", "staging"))
        ok = refused > 0 and abs(rate / predicted - 1) <= CHECK_TOLERANCE
        print(
            f"    {name:34} predicted {predicted:>7,.1f}/s  achieved {rate:>7,.1f}/s  "
            f"({refused} throttled)   {'MET' if ok else 'MISSED'} (within "
            f"{CHECK_TOLERANCE:.0%}, throttling seen)"
        )


if __name__ == "__main__":
    main()
