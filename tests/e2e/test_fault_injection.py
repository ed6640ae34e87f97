"""Fault injection over real processes: writers (PutObject, with re-pointed addresses and
identical re-writes), a bulk writer (PutObjects), readers, a lister, a committer, a merger
(branch → main) and a compaction run work on one repository while a chaos thread SIGKILLs
and restarts kv-gateway, branch-manager, committer and range-writer (each several times).
Every invocation and completion goes into a history (logs/history.jsonl under the test's
home); support/history_check.py then checks it (see there for the guarantees).

The run happens once per module (fixture `run`); each test checks one guarantee, so a known
bug of issue 10 (item 1: a re-pointed address is lost at commit) is an xfail of its own and
does not hide the others. Budget: ~1 minute; QUARRY_CHAOS_ROUNDS and
QUARRY_CHAOS_SECONDS_BETWEEN_KILLS scale it. Staging shards: the repository starts unsharded
and is switched to STAGING_SHARDS between the two branches' creation, so one run covers N=1,
N=4 and the change-over (test_staging_shards_were_exercised).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import grpc
import pytest

from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import branch_manager_pb2_grpc, committer_pb2_grpc, types_pb2
from quarry.v1 import committer_pb2 as cm
from support.chaos import FAST_RECONNECT, Cluster, History, Op, env_int, run_logged
from support.history_check import REPOINT_SIZE, Timeline, Violation, check_final, check_observation
from support.reporting import report_lines

REPO = "chaos"
BRANCHES = ("b1", "b2")
KILLED = ("kv-gateway", "branch-manager", "committer", "range-writer")
# Two rounds: every service is killed at least twice under load (the second kill hits a
# restarted process: its recovery state is exercised too); more rounds cost `make test`
# about 20 s each and prove the same (QUARRY_CHAOS_ROUNDS=5 for a longer run).
ROUNDS = env_int("QUARRY_CHAOS_ROUNDS", 2)
CALL_TIMEOUT = 10.0
STUCK_TIMEOUT = 45.0
WRITERS_PER_BRANCH = 2
PATHS_PER_WRITER = 4
BULK_PATHS = 16
STAGING_SHARDS = 4  # from b2's creation on (b1: from its first seal)


def address(branch: str, path: str, version: int) -> str:
    return f"s3://chaos-lake/{branch}/{path}/v{version}"


@dataclass
class Run:
    history: History
    cluster: Cluster
    timelines: dict = field(default_factory=lambda: defaultdict(Timeline))
    reads: list = field(default_factory=list)  # (op, branch, path, address | None)
    listings: list = field(default_factory=list)  # (first op, last op, branch, {path: addr})
    commits: list = field(default_factory=list)  # ok commit ops (result: id)
    merges: list = field(default_factory=list)  # ok merge ops
    kills: Counter = field(default_factory=Counter)
    unexpected_exits: dict = field(default_factory=dict)
    recovery: dict = field(default_factory=dict)  # branch -> seconds to a write + commit
    stuck: list = field(default_factory=list)
    violations: list = field(default_factory=list)
    first_tokens: dict = field(default_factory=dict)  # branch -> staging token at creation
    last_tokens: dict = field(default_factory=dict)  # branch -> staging token at the end
    final: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)
    chaos_seconds: float = 0.0

    def lost(self, item1: bool | None = None) -> list[Violation]:
        return [v for v in self.violations if item1 is None or v.item1 == item1]


class Stubs:
    def __init__(self, cluster: Cluster):
        self.bm_channel = grpc.insecure_channel(
            cluster.target("branch-manager"), options=FAST_RECONNECT
        )
        self.cm_channel = grpc.insecure_channel(cluster.target("committer"), options=FAST_RECONNECT)
        self.bm = branch_manager_pb2_grpc.BranchManagerStub(self.bm_channel)
        self.cm = committer_pb2_grpc.CommitterStub(self.cm_channel)

    def close(self) -> None:
        self.bm_channel.close()
        self.cm_channel.close()


def _list_all(stubs: Stubs, ref: str, timeout: float = CALL_TIMEOUT) -> dict[str, str]:
    out, token = {}, ""
    while True:
        reply = stubs.bm.ListObjects(
            bm.ListObjectsRequest(repository=REPO, ref=ref, page_size=1000, page_token=token),
            timeout=timeout,
        )
        out.update({e.path: e.physical_address for e in reply.entries})
        token = reply.next_page_token
        if not token:
            return out


def _log_ids(stubs: Stubs, ref: str) -> set[str]:
    ids, token = set(), ""
    while True:
        reply = stubs.cm.Log(
            cm.LogRequest(repository=REPO, ref=ref, page_size=1000, page_token=token),
            timeout=CALL_TIMEOUT,
        )
        ids.update(c.id for c in reply.commits)
        token = reply.next_page_token
        if not token:
            return ids


def _retry(fn, deadline: float):
    """Call until it answers (for setup and the final checks, not the workload)."""
    while True:
        try:
            return fn()
        except grpc.RpcError as exc:
            if time.monotonic() > deadline or exc.code() not in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.ABORTED,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            ):
                raise
            time.sleep(0.2)


# ------------------------------------------------------------------------------ workload


def writer(run: Run, stubs: Stubs, stop: threading.Event, branch: str, n: int) -> None:
    """Owns PATHS_PER_WRITER paths; writes new versions (normal or re-pointed: same size, no
    checksum, new address) and identical re-writes, and reads a path back after its ack."""
    rng = random.Random(f"{branch}-{n}")
    actor = f"writer-{branch}-{n}"
    paths = [f"w{n}/p{k}" for k in range(PATHS_PER_WRITER)]
    version = Counter()
    last: dict[str, types_pb2.Entry] = {}
    while not stop.is_set():
        path = rng.choice(paths)
        roll = rng.random()
        if roll < 0.15 and path in last:
            entry, kind = last[path], "identical"
        else:
            version[path] += 1
            v = version[path]
            if roll < 0.5:
                entry, kind = (
                    types_pb2.Entry(
                        path=path,
                        physical_address=address(branch, path, v),
                        size_bytes=REPOINT_SIZE,
                    ),
                    "repoint",
                )
            else:
                entry, kind = (
                    types_pb2.Entry(
                        path=path,
                        physical_address=address(branch, path, v),
                        size_bytes=1000 + v,
                        checksum=f"c{v}",
                    ),
                    "put",
                )
        last[path] = entry
        op = run.history.invoke(actor, kind, branch, path=path, address=entry.physical_address)
        run.timelines[(branch, path)].add(
            entry.physical_address, entry.checksum, entry.size_bytes, op
        )
        try:
            stubs.bm.PutObject(
                bm.PutObjectRequest(repository=REPO, branch=branch, entry=entry),
                timeout=CALL_TIMEOUT,
            )
        except grpc.RpcError as exc:
            run.history.complete(op, exc.code().name, details=(exc.details() or "")[:200])
            time.sleep(0.05)
            continue
        run.history.complete(op, "ok")
        if rng.random() < 0.5:
            read_back(run, stubs, actor, branch, path)
        time.sleep(0.003)


def read_back(run: Run, stubs: Stubs, actor: str, branch: str, path: str) -> None:
    def stat():
        try:
            return stubs.bm.StatObject(
                bm.StatObjectRequest(repository=REPO, ref=branch, path=path), timeout=CALL_TIMEOUT
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    op, reply = run_logged(
        run.history,
        actor,
        "read",
        branch,
        stat,
        lambda r: {"address": r.entry.physical_address if r else None},
        path=path,
    )
    if op.ok:
        run.reads.append((op, branch, path, op.result["address"]))


def bulk_writer(run: Run, stubs: Stubs, stop: threading.Event, branch: str) -> None:
    """PutObjects streams of two messages, 10 paths of its own at one new version."""
    rng = random.Random(f"bulk-{branch}")
    paths = [f"bulk/p{k}" for k in range(BULK_PATHS)]
    v = 0
    while not stop.is_set():
        v += 1
        chosen = sorted(rng.sample(paths, 10))
        entries = [
            types_pb2.Entry(
                path=p,
                physical_address=address(branch, p, v),
                size_bytes=1000 + v,
                checksum=f"c{v}",
            )
            for p in chosen
        ]
        op = run.history.invoke("bulk-writer", "puts", branch, version=v, paths=chosen)
        for e in entries:
            run.timelines[(branch, e.path)].add(e.physical_address, e.checksum, e.size_bytes, op)
        requests = [
            bm.PutObjectsRequest(repository=REPO, branch=branch, entries=entries[:5]),
            bm.PutObjectsRequest(repository=REPO, branch=branch, entries=entries[5:]),
        ]
        try:
            reply = stubs.bm.PutObjects(iter(requests), timeout=CALL_TIMEOUT)
        except grpc.RpcError as exc:
            run.history.complete(op, exc.code().name, details=(exc.details() or "")[:200])
            time.sleep(0.05)
            continue
        run.history.complete(op, "ok", count=reply.count)
        time.sleep(0.02)


def lister(run: Run, stubs: Stubs, stop: threading.Event) -> None:
    while not stop.is_set():
        for branch in BRANCHES:
            op, listing = run_logged(
                run.history,
                "lister",
                "list",
                branch,
                lambda b=branch: _list_all(stubs, b),
                lambda r: {"entries": len(r)},
            )
            if op.ok:
                run.listings.append((op, branch, listing))
        time.sleep(0.2)


def committer(run: Run, stubs: Stubs, stop: threading.Event, compact_at: list[float]) -> None:
    """Commits each branch in turn; at the times in compact_at runs a compaction of both."""
    n = 0
    while not stop.is_set():
        for branch in BRANCHES:
            n += 1
            op, reply = run_logged(
                run.history,
                "committer",
                "commit",
                branch,
                lambda b=branch, i=n: stubs.cm.Commit(
                    cm.CommitRequest(repository=REPO, branch=b, message=f"chaos {i}"),
                    timeout=CALL_TIMEOUT,
                ),
                lambda r: {"id": r.commit.id},
            )
            if op.ok:
                run.commits.append(op)
        if compact_at and time.monotonic() >= compact_at[0]:
            compact_at.pop(0)
            for branch in BRANCHES:
                run_logged(
                    run.history,
                    "committer",
                    "compact",
                    branch,
                    lambda b=branch: stubs.cm.Compact(
                        cm.CompactRequest(repository=REPO, branch=b), timeout=30
                    ),
                    lambda r: {"metarange": r.compacted_metarange_id, "tokens": r.tokens_compacted},
                )
        time.sleep(0.3)


def merger(run: Run, stubs: Stubs, stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        for branch in BRANCHES:
            n += 1
            op, reply = run_logged(
                run.history,
                "merger",
                "merge",
                "main",
                lambda b=branch, i=n: stubs.cm.Merge(
                    cm.MergeRequest(
                        repository=REPO,
                        source_ref=b,
                        destination_branch="main",
                        message=f"merge {i}",
                    ),
                    timeout=CALL_TIMEOUT,
                ),
                lambda r: {"id": r.commit.id, "parents": list(r.commit.parents)},
                source=branch,
            )
            if op.ok:
                run.merges.append(op)
        time.sleep(0.7)


def load_short_of_the_floor(run: Run) -> list[str]:
    """What the load still lacks for the run to be proof (test_chaos_really_happened)."""
    ops = run.history.ops
    done = {
        "acknowledged PutObject": sum(
            1 for op in ops if op.kind in ("put", "repoint", "identical") and op.ok
        ),
        "re-pointed": sum(1 for op in ops if op.kind == "repoint" and op.ok),
        "identical re-writes": sum(1 for op in ops if op.kind == "identical" and op.ok),
        "PutObjects streams": sum(1 for op in ops if op.kind == "puts" and op.ok),
        "commits": len(run.commits),
        "merges": len(run.merges),
    }
    return [
        f"{what} {done[what]} < {floor}" for what, floor in LOAD_FLOOR.items() if done[what] < floor
    ]


# The least load that makes the run proof. The chaos goes on (the kills stop, the load does
# not) until it is reached: a slow machine runs longer instead of failing.
LOAD_FLOOR = {
    "acknowledged PutObject": 200,
    "re-pointed": 50,
    "identical re-writes": 20,
    "PutObjects streams": 10,
    "commits": 10,
    "merges": 3,
}
LOAD_TIMEOUT = 180.0


def chaos(run: Run, stop: threading.Event, seconds_between: float) -> None:
    rng = random.Random(7)
    try:
        for _ in range(ROUNDS):
            order = list(KILLED)
            rng.shuffle(order)
            for name in order:
                time.sleep(rng.uniform(0.5, 1.0) * seconds_between)
                for dead in run.cluster.restart_dead():
                    run.unexpected_exits.setdefault(dead, 0)
                    run.unexpected_exits[dead] += 1
                op = run.history.invoke("chaos", "kill", name)
                run.cluster.kill_and_restart(name, down_seconds=rng.uniform(0.2, 1.0))
                run.history.complete(op, "ok")
                run.kills[name] += 1
        time.sleep(seconds_between)
        deadline = time.monotonic() + LOAD_TIMEOUT
        while load_short_of_the_floor(run) and time.monotonic() < deadline:
            time.sleep(0.2)
    except Exception as exc:  # reported by the test, never swallowed
        run.errors.append(f"chaos: {exc!r}")
    finally:
        stop.set()


# ------------------------------------------------------------------------------- the run


def unstick(run: Run, stubs: Stubs) -> None:
    """After chaos: on every branch a write and a commit must succeed within STUCK_TIMEOUT."""
    for branch in ("main", *BRANCHES):
        started = time.monotonic()
        deadline = started + STUCK_TIMEOUT
        try:
            _retry(
                lambda b=branch: stubs.bm.PutObject(
                    bm.PutObjectRequest(
                        repository=REPO,
                        branch=b,
                        entry=types_pb2.Entry(
                            path=f"probe/{b}",
                            physical_address=f"s3://chaos-lake/probe/{b}",
                            size_bytes=1,
                            checksum="probe",
                        ),
                    ),
                    timeout=CALL_TIMEOUT,
                ),
                deadline,
            )
            reply = _retry(
                lambda b=branch: stubs.cm.Commit(
                    cm.CommitRequest(repository=REPO, branch=b, message="after chaos"),
                    timeout=CALL_TIMEOUT,
                ),
                deadline,
            )
            run.commits.append(_synthetic_commit(run, branch, reply.commit.id, started))
            run.recovery[branch] = time.monotonic() - started
        except grpc.RpcError as exc:
            run.stuck.append(f"{branch}: {exc.code().name} {exc.details()}")


def _synthetic_commit(run: Run, branch: str, commit_id: str, started: float) -> Op:
    op = run.history.invoke("checker", "commit", branch, message="after chaos")
    op.t_invoke = started
    run.history.complete(op, "ok", id=commit_id)
    return op


def check(run: Run, stubs: Stubs) -> None:
    deadline = time.monotonic() + 60
    owned = defaultdict(list)
    for branch, path in run.timelines:
        owned[branch].append(path)
    violations = run.violations

    # Reads and listings made during the run.
    for op, branch, path, seen in run.reads:
        v = check_observation(
            run.timelines[(branch, path)],
            seen,
            op.t_invoke,
            op.t_complete,
            f"{op.actor} read {branch}:{path}",
            "stale-read",
        )
        if v:
            violations.append(v)
    for op, branch, listing in run.listings:
        for path in owned[branch]:
            v = check_observation(
                run.timelines[(branch, path)],
                listing.get(path),
                op.t_invoke,
                op.t_complete,
                f"listing of {branch}:{path}",
                "stale-listing",
            )
            if v:
                violations.append(v)

    # Final state: every acknowledged write is committed or still staged.
    for branch in BRANCHES:
        final = _retry(lambda b=branch: _list_all(stubs, b), deadline)
        run.final[branch] = final
        for path in owned[branch]:
            v = check_final(
                run.timelines[(branch, path)], final.get(path), f"final {branch}:{path}"
            )
            if v:
                violations.append(v)

    # Every acknowledged commit is in its branch's log, and holds a listing.
    logs = {b: _retry(lambda b=b: _log_ids(stubs, b), deadline) for b in ("main", *BRANCHES)}
    for op in run.commits:
        if op.result["id"] not in logs[op.branch]:
            violations.append(
                Violation(
                    "log",
                    f"commit {op.result['id']} on {op.branch} (acknowledged) is not in its log",
                )
            )
        content = _retry(lambda c=op.result["id"]: _list_all(stubs, c), deadline)
        for path in owned[op.branch]:
            v = check_observation(
                run.timelines[(op.branch, path)],
                content.get(path),
                op.t_invoke,
                op.t_complete,
                f"commit {op.result['id'][:12]} of {op.branch}:{path}",
                "commit-content",
            )
            if v:
                violations.append(v)

    # Every acknowledged merge is in main's log and brought its source commit exactly.
    for op in run.merges:
        merge_id, parents = op.result["id"], op.result["parents"]
        source = op.args["source"]
        if merge_id not in logs["main"]:
            violations.append(
                Violation("log", f"merge {merge_id} (acknowledged) is not in main's log")
            )
        if len(parents) != 2 or parents[1] not in logs[source]:
            violations.append(
                Violation(
                    "merge",
                    f"merge {merge_id}: parents {parents}, the second not a commit of {source}",
                )
            )
            continue
        merged = _retry(lambda c=merge_id: _list_all(stubs, c), deadline)
        source_content = _retry(lambda c=parents[1]: _list_all(stubs, c), deadline)
        for path in owned[source]:
            if merged.get(path) != source_content.get(path):
                violations.append(
                    Violation(
                        "merge",
                        f"merge {merge_id[:12]}: {source}:{path} is {merged.get(path)} "
                        f"but the source commit has {source_content.get(path)}",
                    )
                )


@pytest.fixture(scope="module")
def run(tmp_path_factory, request):
    home = tmp_path_factory.mktemp("chaos")
    (home / "lake").mkdir()
    cluster = Cluster(
        home,
        # A retired staging token is dropped this long after its branch moved on: readers
        # that still hold the old branch record must have finished by then. A call here may
        # take CALL_TIMEOUT on a loaded machine, so no shorter (3 s could drop a token a slow
        # listing still read, a stale listing the product's own rules allow).
        QUARRY_STAGING_DROP_GRACE_SECONDS=str(CALL_TIMEOUT),
        QUARRY_STAGING_DROP_INTERVAL_SECONDS="1",
        QUARRY_SHUTDOWN_GRACE_SECONDS="2",
        QUARRY_COMPACTION_STAGED_ENTRIES_THRESHOLD="300",
        QUARRY_COMPACTION_MIN_INTERVAL_SECONDS="5",
        QUARRY_COMPACTION_CHECK_INTERVAL_SECONDS="1",
    )
    history = History(home / "logs" / "history.jsonl")
    result = Run(history=history, cluster=cluster)
    started = time.monotonic()
    stubs = None
    try:
        cluster.start()
        stubs = Stubs(cluster)
        setup_deadline = time.monotonic() + 30
        _retry(
            lambda: stubs.bm.CreateRepository(
                bm.CreateRepositoryRequest(
                    name=REPO, storage_namespace=str(home / "lake" / REPO), default_branch="main"
                ),
                timeout=CALL_TIMEOUT,
            ),
            setup_deadline,
        )
        for branch in BRANCHES:
            if branch == BRANCHES[1]:
                # Sharded staging (issue 29) in the same run, at no extra cost: b1 starts on
                # an unsharded token and moves to 4 shards with its first seal (a sealed
                # 1-shard token beside a 4-shard one); b2 is sharded from the start.
                _retry(
                    lambda: stubs.bm.UpdateRepository(
                        bm.UpdateRepositoryRequest(name=REPO, staging_shards=STAGING_SHARDS),
                        timeout=CALL_TIMEOUT,
                    ),
                    setup_deadline,
                )
            _retry(
                lambda b=branch: stubs.bm.CreateBranch(
                    bm.CreateBranchRequest(repository=REPO, name=b, source_ref="main"),
                    timeout=CALL_TIMEOUT,
                ),
                setup_deadline,
            )
        for branch in BRANCHES:
            result.first_tokens[branch] = _staging_token(stubs, branch, setup_deadline)
        seconds_between = float(env_int("QUARRY_CHAOS_SECONDS_BETWEEN_KILLS", 2))
        stop = threading.Event()
        chaos_started = time.monotonic()
        expected = ROUNDS * len(KILLED) * seconds_between * 0.75
        compact_at = [chaos_started + expected / 3, chaos_started + 2 * expected / 3]
        threads = [
            threading.Thread(target=writer, args=(result, stubs, stop, b, n))
            for b in BRANCHES
            for n in range(WRITERS_PER_BRANCH)
        ]
        threads += [
            threading.Thread(target=bulk_writer, args=(result, stubs, stop, "b1")),
            threading.Thread(target=lister, args=(result, stubs, stop)),
            threading.Thread(target=committer, args=(result, stubs, stop, compact_at)),
            threading.Thread(target=merger, args=(result, stubs, stop)),
            threading.Thread(target=chaos, args=(result, stop, seconds_between)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        result.chaos_seconds = time.monotonic() - chaos_started
        for dead in cluster.restart_dead():
            result.unexpected_exits[dead] = result.unexpected_exits.get(dead, 0) + 1
        unstick(result, stubs)
        check(result, stubs)
        for branch in BRANCHES:
            result.last_tokens[branch] = _staging_token(
                stubs, branch, time.monotonic() + STUCK_TIMEOUT
            )
    finally:
        if stubs is not None:
            stubs.close()
        history.close()
        cluster.stop()
    (home / "logs" / "violations.txt").write_text("".join(f"{v}\n" for v in result.violations))
    report_lines(
        request.config,
        summary(result, time.monotonic() - started)
        + [f"  history and service logs: {home / 'logs'}"],
    )
    return result


def _staging_token(stubs, branch: str, deadline: float) -> str:
    return _retry(
        lambda: (
            stubs.bm.GetBranch(
                bm.GetBranchRequest(repository=REPO, name=branch), timeout=CALL_TIMEOUT
            ).branch.staging_token
        ),
        deadline,
    )


def summary(run: Run, total_seconds: float) -> list[str]:
    ops = run.history.ops
    writes = [op for op in ops if op.kind in ("put", "repoint", "identical")]
    bulk = [op for op in ops if op.kind == "puts"]
    acked_entries = sum(1 for op in writes if op.ok) + sum(
        len(op.args["paths"]) for op in bulk if op.ok
    )
    outcomes = Counter(op.outcome for op in ops if op.kind not in ("kill",))
    compactions = [op for op in ops if op.kind == "compact"]
    kinds = Counter(op.kind for op in writes if op.ok)
    lines = [
        f"fault injection: {total_seconds:.0f}s ({run.chaos_seconds:.0f}s of chaos); "
        f"acknowledged writes {acked_entries} (PutObject {sum(kinds.values())}: "
        f"{kinds['put']} new, {kinds['repoint']} re-pointed, {kinds['identical']} identical "
        f"re-writes; PutObjects {sum(1 for op in bulk if op.ok)} streams), "
        f"unknown-outcome writes {sum(1 for op in writes + bulk if not op.ok)}, "
        f"commits {len(run.commits)}, merges {len(run.merges)}, compactions "
        f"{sum(1 for op in compactions if op.ok)}/{len(compactions)}, reads "
        f"{len(run.reads)}, listings {len(run.listings)}",
        "  kills: "
        + ", ".join(f"{name}={run.kills[name]}" for name in KILLED)
        + f"; unexpected exits: {run.unexpected_exits or 'none'}",
        "  outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(outcomes.items())),
        "  recovery after chaos (write + commit): "
        + ", ".join(f"{b}={s:.1f}s" for b, s in run.recovery.items())
        + (f"; STUCK: {run.stuck}" if run.stuck else ""),
        f"  lost = {len(run.lost(item1=False))}; explained by issue 10 item 1 (re-pointed "
        f"address lost at commit) = {len(run.lost(item1=True))}",
    ]
    by_category = Counter((v.category, v.item1) for v in run.violations)
    for (category, item1), n in sorted(by_category.items()):
        lines.append(f"  violations {category}{' (item 1)' if item1 else ''}: {n}")
    for v in run.violations[:8]:
        lines.append(f"    e.g. {v}")
    if run.errors:
        lines.append(f"  errors: {run.errors}")
    return lines


# --------------------------------------------------------------------------------- tests


def _of(run: Run, *categories: str) -> list[str]:
    """Violations of these categories (re-pointed writes included: see
    test_repointed_writes_survive_commits for those alone)."""
    return [str(v) for v in run.violations if v.category in categories]


def test_chaos_really_happened(run):
    """The run is only proof if the faults and the load were real."""
    assert not run.errors, run.errors
    assert all(run.kills[name] >= ROUNDS for name in KILLED), run.kills
    assert not load_short_of_the_floor(run), load_short_of_the_floor(run)
    ops = run.history.ops
    assert any(op.kind == "compact" for op in ops)
    # Some calls did fail: the kills were felt, and outcomes were logged as such.
    assert any(not op.ok for op in ops if op.kind in ("put", "repoint", "identical", "puts"))
    assert all(op.outcome != "pending" for op in ops if op.actor != "chaos")


def test_no_service_died_on_its_own(run):
    assert not run.unexpected_exits, f"services exited without being killed: {run.unexpected_exits}"


def test_every_acknowledged_write_is_committed_or_staged(run):
    assert not _of(run, "lost"), _of(run, "lost")[:20]


def test_read_your_writes_and_listings_never_go_back(run):
    problems = _of(run, "stale-read", "stale-listing")
    assert not problems, problems[:20]


def test_every_commit_holds_a_listing(run):
    problems = _of(run, "commit-content")
    assert not problems, problems[:20]


def test_every_acknowledged_commit_and_merge_is_in_the_log(run):
    problems = _of(run, "log", "merge")
    assert not problems, problems[:20]


def test_no_branch_is_stuck(run):
    assert not run.stuck, run.stuck
    assert set(run.recovery) == {"main", *BRANCHES}


def test_repointed_writes_survive_commits(run):
    problems = [str(v) for v in run.violations if v.item1]
    assert not problems, problems[:20]


def test_staging_shards_were_exercised(run):
    """Both layouts were under the chaos (the guarantees above hold for both): b1 started on
    an unsharded token and moved to 4 shards with its seals; b2 was sharded from the start."""
    from quarry.kv.partitions import staging_token_shards

    b1, b2 = BRANCHES
    assert staging_token_shards(run.first_tokens[b1]) == 1
    assert staging_token_shards(run.first_tokens[b2]) == STAGING_SHARDS
    assert staging_token_shards(run.last_tokens[b1]) == STAGING_SHARDS
    assert staging_token_shards(run.last_tokens[b2]) == STAGING_SHARDS
    for branch in BRANCHES:
        assert any(op.ok and op.branch == branch for op in run.history.ops if op.kind == "put")
