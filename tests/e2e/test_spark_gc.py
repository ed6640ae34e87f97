"""`quarry gc` on a repository with expired history, against the services on loopback and a
real local Spark session: what the dry run reports, what the sweep deletes, and everything
it must never delete (data of retained commits and tags, staged entries, young objects,
internal files)."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import subprocess
import sys
import uuid
from contextlib import redirect_stderr, redirect_stdout

import pytest

import quarry.spark as qs
from quarry import errors
from quarry.blob import open_blob_store
from quarry.blob.ownership import MARKER_KEY
from quarry.cli.main import main as quarry_main
from quarry.committed import format as rformat
from quarry.retention import RetentionRules
from quarry.spark.common import EPHEMERAL_PREFIX, new_job_id
from quarry.spark.gc import DEFAULT_GRACE, collect_garbage
from support.foreign_files import FOREIGN_KEYS
from support.suite import suite_fixture

pytestmark = pytest.mark.timeout(600)

LATER = dt.timedelta(days=30)


suite = suite_fixture()


@pytest.fixture
def conn(suite):
    return qs.Connection(suite.targets["branch-manager"], suite.targets["committer"])


def numbers(spark, start: int, stop: int, partitions: int):
    return spark.range(start, stop, numPartitions=partitions).selectExpr("id", "id * 3 as v")


def key_of(suite, repo: str, address: str) -> str:
    return address[len(suite.namespace(repo)) + 1 :]


class History:
    """main: A (4 files) → B (overwrite, 2 files, tagged) → C (overwrite, 3 files); one of
    A's files staged again on main; a stale Spark branch staging a file of a dead job; an
    orphaned range, metarange and data file; an internal file."""

    def __init__(self, spark, suite, conn):
        self.suite, self.conn = suite, conn
        self.repo = f"gc-{uuid.uuid4().hex[:10]}"
        with suite.client() as c:
            c.create_repository(self.repo, suite.namespace(self.repo))
            uri = f"quarry://{self.repo}/main/t"
            self.a = qs.write(numbers(spark, 0, 400, 4), uri, connection=conn)
            self.a_files = self.addresses(c, self.a.id)
            self.b = qs.write(numbers(spark, 400, 600, 2), uri, mode="overwrite", connection=conn)
            c.create_tag(self.repo, "b", self.b.id)
            self.b_files = self.addresses(c, self.b.id)
            self.c = qs.write(numbers(spark, 600, 900, 3), uri, mode="overwrite", connection=conn)
            self.c_files = self.addresses(c, self.c.id)
            # An uncommitted entry on main pointing at one of A's files protects it.
            self.restaged = self.a_files[0]
            c.put_object(
                self.repo,
                "main",
                path="restaged/a0",
                physical_address=suite.namespace(self.repo) + "/" + self.restaged,
                size_bytes=1,
            )
            # The same protection whatever the notation of the address.
            self.restaged_as_uri = self.a_files[1]
            c.put_object(
                self.repo,
                "main",
                path="restaged/a1",
                size_bytes=1,
                physical_address="file://localhost"
                + suite.namespace(self.repo)
                + "/"
                + self.restaged_as_uri,
            )
            with open_blob_store(suite.namespace(self.repo)) as store:
                # Orphans in Quarry's own layouts (only those are ever collected).
                self.dead_file = f"data/spark/{new_job_id()}/part-00000-c000-t7.snappy.parquet"
                store.put(self.dead_file, b"half a job")
                self.orphan_data = f"data/{uuid.uuid4().hex}"  # an upload never staged
                store.put(self.orphan_data, b"never staged")
                self.orphan_range = rformat.range_key("ab" * 32)
                store.put(self.orphan_range, b"lost race")
                self.orphan_metarange = rformat.metarange_key("cd" * 32)
                store.put(self.orphan_metarange, b"dry run")
                self.internal = "_quarry/notes/keep.txt"
                store.put(self.internal, b"internal")
            # A compaction whose metarange the next commit replaces: a real orphan.
            c.create_branch(self.repo, "dev", "main@")
            c.put_objects(
                self.repo,
                "dev",
                [
                    {"path": f"dev/{i}", "physical_address": "s3://b/x", "size_bytes": i}
                    for i in range(3)
                ],
            )
            compacted = c.compact(self.repo, "dev").compacted_metarange_id
            c.put_object(
                self.repo, "dev", path="dev/late", physical_address="s3://b/y", size_bytes=1
            )
            c.commit(self.repo, "dev", "after the compaction")
            self.old_compaction = rformat.metarange_key(compacted)
            self.stale_branch = f"{EPHEMERAL_PREFIX}20200101T000000-0123456789ab"
            c.create_branch(self.repo, self.stale_branch, "main@")
            c.put_object(
                self.repo,
                self.stale_branch,
                path="t/dead",
                physical_address=suite.namespace(self.repo) + "/" + self.dead_file,
                size_bytes=10,
            )

    def addresses(self, client, ref: str) -> list[str]:
        return sorted(
            key_of(self.suite, self.repo, e.physical_address)
            for e in client.iter_objects(self.repo, ref, prefix="t/")
        )

    def keys(self) -> set[str]:
        with open_blob_store(self.suite.namespace(self.repo)) as store:
            return {o.key for o in store.list("")}


def run_gc(spark, history: History, sweep: bool, days: float = 7.0, **kwargs):
    now = dt.datetime.now(dt.UTC) + LATER
    return collect_garbage(
        spark,
        history.repo,
        rules=RetentionRules(days),
        sweep=sweep,
        now=now,
        grace=kwargs.pop("grace", dt.timedelta(0)),
        connection=history.conn,
        **kwargs,
    )


def test_dry_run_reports_and_sweep_deletes_exactly_the_unreferenced(spark, suite, conn):
    history = History(spark, suite, conn)
    before = history.keys()

    report = run_gc(spark, history, sweep=False)
    assert history.keys() == before | {report.report_key}  # nothing deleted, report written
    expected_data = set(history.a_files[2:]) | {history.dead_file, history.orphan_data}
    assert set(report.collectable["data"].sample) == expected_data
    assert history.orphan_range in report.collectable["range"].sample
    assert history.orphan_metarange in report.collectable["metarange"].sample
    assert history.old_compaction in report.collectable["metarange"].sample
    assert report.ephemeral_branches == [history.stale_branch]
    assert report.commits_expired > 0 and report.deleted == 0
    with open_blob_store(suite.namespace(history.repo)) as store:
        saved = json.loads(store.get(report.report_key))
    assert saved["collectable"]["data"]["count"] == len(expected_data)
    with suite.client() as c:
        assert history.stale_branch in [b.name for b in c.iter_branches(history.repo)]

    swept = run_gc(spark, history, sweep=True)
    assert swept.deleted == swept.collectable_count == report.collectable_count
    after = history.keys()
    gone = before - after
    assert expected_data <= gone
    assert {history.orphan_range, history.orphan_metarange, history.old_compaction} <= gone
    # Never deleted: data of the head and the tag, the staged file, internal files.
    assert (
        set(history.b_files)
        | set(history.c_files)
        | {history.restaged, history.restaged_as_uri, history.internal}
        <= after
    )
    with suite.client() as c:
        assert history.stale_branch not in [b.name for b in c.iter_branches(history.repo)]

    def ids(ref):
        return sorted(
            r.id
            for r in qs.read(spark, f"quarry://{history.repo}/{ref}/t", connection=conn).collect()
        )

    assert ids("main") == list(range(600, 900))
    assert ids("b") == list(range(400, 600))
    assert qs.entries(spark, f"quarry://{history.repo}/main@/t/", connection=conn).count() == 3
    # Nothing left to collect: a second run finds nothing.
    assert run_gc(spark, history, sweep=False).collectable_count == 0


def test_long_retention_and_grace_period_protect_everything_of_the_history(spark, suite, conn):
    history = History(spark, suite, conn)
    long_window = run_gc(spark, history, sweep=False, days=60)
    assert long_window.commits_expired == 0
    assert not set(history.a_files) & set(long_window.collectable["data"].sample)

    young = run_gc(spark, history, sweep=True, grace=dt.timedelta(hours=1))
    assert young.collectable_count == 0 and young.deleted == 0
    assert young.objects_in_grace >= len(history.a_files) + 4


def test_branch_override_keeps_its_history(spark, suite, conn):
    history = History(spark, suite, conn)
    report = run_gc(spark, history, sweep=False, days=7)
    overridden = collect_garbage(
        spark,
        history.repo,
        rules=RetentionRules(7, {"main": 60}),
        sweep=False,
        now=dt.datetime.now(dt.UTC) + LATER,
        grace=dt.timedelta(0),
        connection=conn,
    )
    assert set(history.a_files[2:]) <= set(report.collectable["data"].sample)
    assert not set(history.a_files) & set(overridden.collectable["data"].sample)


def test_gc_command_line_dry_run_and_sweep(spark, suite, conn, tmp_path, monkeypatch):
    """`quarry gc`'s commands as a user types them. The sweep (the run that deletes) is a
    real `python -m quarry.cli.main` process with its own Spark JVM; the other commands run
    the same main() in this process, where `gc run` gets the tests' Spark session (a JVM
    start per command cost about 20 s each)."""
    history = History(spark, suite, conn)
    rules = tmp_path / "rules.json"
    rules.write_text(
        json.dumps(
            {
                "default_retention_days": 7,
                "branches": [{"branch_id": "other", "retention_days": 90}],
            }
        )
    )
    now = (dt.datetime.now(dt.UTC) + LATER).isoformat()
    home = str(tmp_path / "home")
    connect = ["--branch-manager", conn.branch_manager, "--committer", conn.committer]

    def quarry_process(*args, timeout=300):
        return subprocess.run(
            [sys.executable, "-m", "quarry.cli.main", *args, *connect],
            capture_output=True,
            text=True,
            env={**os.environ, "QUARRY_HOME": home},
            timeout=timeout,
        )

    def quarry(*args):
        out, err = io.StringIO(), io.StringIO()
        with monkeypatch.context() as env:
            env.setenv("QUARRY_HOME", home)
            with redirect_stdout(out), redirect_stderr(err):
                try:
                    code = quarry_main([*args, *connect])
                except SystemExit as exc:  # argparse's usage errors
                    code = exc.code
        return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())

    run = ["gc", "run", history.repo, "--now", now, "--grace-hours", "0", "--master", "local[1]"]
    # The repository's stored rules (60 days) keep A; a rules file given to the run wins.
    stored = quarry(
        "gc",
        "set-rules",
        history.repo,
        "--retention-days",
        "60",
        "--branch-retention",
        "main=61",
    )
    assert stored.returncode == 0, stored.stderr
    shown = quarry("gc", "show-rules", history.repo, "--json")
    assert json.loads(shown.stdout) == {
        "default_retention_days": 60.0,
        "branches": [{"branch_id": "main", "retention_days": 61.0}],
    }
    kept = quarry(*run, "--json")
    assert kept.returncode == 0, kept.stderr[-2000:]
    assert json.loads(kept.stdout)["rules"]["default_retention_days"] == 60
    assert json.loads(kept.stdout)["commits_expired"] == 0

    dry = quarry(*run, "--rules", str(rules), "--json")
    assert dry.returncode == 0, dry.stderr[-2000:]
    report = json.loads(dry.stdout)
    assert report["sweep"] is False and report["deleted"] == 0
    assert report["rules"]["default_retention_days"] == 7
    assert set(history.a_files[2:]) <= set(report["collectable"]["data"]["sample"])

    assert quarry("gc", "delete-rules", history.repo).returncode == 0
    swept = quarry_process(*run, "--retention-days", "7", "--sweep")
    assert swept.returncode == 0, swept.stderr[-2000:]
    assert "Deleted" in swept.stdout and "sweep" in swept.stdout
    assert not set(history.a_files[2:]) & history.keys()

    every = quarry(
        "gc", "run", "--all", "--now", now, "--grace-hours", "0", "--master", "local[1]", "--json"
    )
    assert every.returncode == 0, every.stderr[-2000:]
    reports = {r["repository"]: r for r in json.loads(every.stdout)}
    assert history.repo in reports and reports[history.repo]["sweep"] is False
    neither = quarry("gc", "run")
    assert neither.returncode == 2 and "give a repository or --all" in neither.stderr

    bad = quarry("gc", "run", history.repo, "--retention-days", "-1")
    assert bad.returncode != 0 and "negative" in bad.stderr
    missing = quarry("gc", "show-rules", history.repo)
    assert missing.returncode == 1 and "GC_RULES_NOT_FOUND" in missing.stderr
    invalid = quarry("gc", "set-rules", history.repo, "--branch-retention", "bad/name=3")
    assert invalid.returncode == 1 and "INVALID_NAME" in invalid.stderr, invalid.stderr


def test_a_branch_made_on_an_expired_commit_during_the_sweep_stops_it(
    spark, suite, conn, monkeypatch
):
    """Content addressing lets history made during a GC run reuse files GC judged
    unreferenced: the sweep re-reads the heads first and deletes nothing if so."""
    import quarry.spark.gc as gc_module

    history = History(spark, suite, conn)
    before = history.keys()
    real_recheck = gc_module._recheck

    def revive_then_recheck(references, *args):
        references.client.create_branch(references.repository, "revived", history.a.id)
        return real_recheck(references, *args)

    monkeypatch.setattr(gc_module, "_recheck", revive_then_recheck)
    with pytest.raises(gc_module.GarbageCollectionUnsafe) as failure:
        run_gc(spark, history, sweep=True)
    assert failure.value.reason == "GC_REFERENCES_INCOMPLETE"
    assert history.keys() == before  # nothing deleted
    monkeypatch.undo()
    again = run_gc(spark, history, sweep=True)  # the next run keeps the revived commit's data
    assert again.deleted > 0
    assert set(history.a_files) <= history.keys()
    assert sorted(
        r.id
        for r in qs.read(spark, f"quarry://{history.repo}/revived/t", connection=conn).collect()
    ) == list(range(400))


@pytest.mark.parametrize("committed", [True, False])
def test_an_entry_brought_back_during_the_sweep_stops_it(
    spark, suite, conn, monkeypatch, committed
):
    """A revert or cherry-pick commits a new range whose entry points at an old data file
    (committed), and a copy stages one (not committed): if that file is one GC is about to
    delete, the sweep deletes nothing."""
    import quarry.spark.gc as gc_module

    history = History(spark, suite, conn)
    before = history.keys()
    doomed = history.a_files[2]  # referenced only by the expired commit A
    real_recheck = gc_module._recheck

    def bring_back_then_recheck(references, *args):
        with suite.client() as c:
            c.create_branch(history.repo, "brought-back", history.c.id)
            c.put_object(
                history.repo,
                "brought-back",
                path="t/back",
                physical_address=suite.namespace(history.repo) + "/" + doomed,
                size_bytes=1,
            )
            if committed:
                c.commit(history.repo, "brought-back", "an old entry again")
        return real_recheck(references, *args)

    monkeypatch.setattr(gc_module, "_recheck", bring_back_then_recheck)
    with pytest.raises(gc_module.GarbageCollectionUnsafe) as failure:
        run_gc(spark, history, sweep=True)
    assert failure.value.reason == "GC_REFERENCES_INCOMPLETE"
    assert doomed in str(failure.value)
    assert before <= history.keys()  # nothing deleted (the commit added its own files)
    monkeypatch.undo()
    again = run_gc(spark, history, sweep=True)  # the next run keeps the file brought back
    assert again.deleted > 0
    assert doomed in set(history.keys())


def test_a_repository_nested_in_or_sharing_the_namespace_cannot_be_created(spark, suite, conn):
    """Before namespaces were owned, GC had to leave nested repositories' files alone and
    refuse shared namespaces; now such repositories cannot be created at all (issue 10)."""
    outer = f"gc-{uuid.uuid4().hex[:10]}"
    with suite.client() as c:
        c.create_repository(outer, suite.namespace(outer))
        for name, namespace in (
            (outer + "-in", suite.namespace(outer) + "/nested/inner"),
            (outer + "-twin", suite.namespace(outer)),
        ):
            with pytest.raises(errors.FailedPrecondition) as failure:
                c.create_repository(name, namespace)
            assert failure.value.reason == "NAMESPACE_IN_USE"
            assert failure.value.metadata["other_repository"] == outer
        qs.write(numbers(spark, 0, 40, 2), f"quarry://{outer}/main/t", connection=conn)
        later = dt.datetime.now(dt.UTC) + LATER
        report = collect_garbage(
            spark,
            outer,
            rules=RetentionRules(7),
            now=later,
            grace=dt.timedelta(0),
            sweep=True,
            connection=conn,
        )
        assert report.objects_scanned > 0


def age(root, keys, seconds: float) -> None:
    """Make `keys` `seconds` old, and the repository's claim of its namespace older still
    (GC never collects a file written before the claim: see the inherited-files test)."""
    backdate_claim(root, seconds + 3600)
    when = dt.datetime.now(dt.UTC).timestamp() - seconds
    for key in keys:
        os.utime(os.path.join(root, *key.split("/")), (when, when))


def backdate_claim(root, seconds: float) -> None:
    marker = os.path.join(root, *MARKER_KEY.split("/"))
    with open(marker) as f:
        doc = json.load(f)
    doc["created"] = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)).isoformat()
    with open(marker, "w") as f:
        json.dump(doc, f)


def test_a_sweep_never_deletes_a_file_quarry_did_not_write(spark, suite, conn):
    """Foreign files at several depths, some named almost like Quarry's own, aged far past
    the grace period: a sweep that does collect the real orphans leaves every one."""
    history = History(spark, suite, conn)
    root = suite.namespace(history.repo)
    with open_blob_store(root) as store:
        for key in FOREIGN_KEYS:
            store.put(key, f"not Quarry's: {key}".encode())
    everything = history.keys()
    age(root, everything, 3 * 86400)  # every file, Quarry's and foreign, is 3 days old
    report = run_gc(spark, history, sweep=True, grace=DEFAULT_GRACE)
    after = history.keys()
    gone = everything - after
    for key in FOREIGN_KEYS:
        with open_blob_store(root) as store:
            assert store.get(key) == f"not Quarry's: {key}".encode(), key
    # Counted as foreign, except those under _quarry/ (Quarry's internal files, kept too).
    assert report.objects_foreign == len([k for k in FOREIGN_KEYS if not k.startswith("_quarry/")])
    # The real orphans went (so the sweep did run over these files).
    assert {
        history.dead_file,
        history.orphan_data,
        history.orphan_range,
        history.orphan_metarange,
        history.old_compaction,
    } <= gone
    assert set(history.a_files[2:]) <= gone
    assert report.deleted == len(gone) > 0
    assert MARKER_KEY in after and history.internal in after


def test_temporary_files_killed_writers_left_are_collected_once_a_day_old(spark, suite, conn):
    """A writer killed mid-file (a `quarry put --from`, an S3 multipart upload) leaves its
    temporary file `<dir>/.quarry-tmp-<32 hex>`, never listed: GC collects it once it is a
    day old (a file still being written never is), unless an entry names it; a lookalike
    name is foreign and stays."""
    import uuid

    history = History(spark, suite, conn)
    root = suite.namespace(history.repo)
    old, young, named = (f"data/.quarry-tmp-{uuid.uuid4().hex}" for _ in range(3))
    lookalike = "data/.quarry-tmp-not-quarrys"
    for key in (old, young, named, lookalike):
        path = os.path.join(root, *key.split("/"))
        with open(path, "wb") as fh:
            fh.write(b"half a file")
    age(root, [young], 3600)  # past the grace period, not the day
    age(root, [old, named, lookalike], 2 * 86400)  # (last: it backdates the claim most)
    with suite.client() as c:
        c.put_object(
            history.repo, "main", path="t/odd", physical_address=f"{root}/{named}", size_bytes=11
        )
    report = run_gc(spark, history, sweep=True)
    assert report.deleted > 0
    for key, kept in ((old, False), (young, True), (named, True), (lookalike, True)):
        assert os.path.exists(os.path.join(root, *key.split("/"))) is kept, key


def test_gc_deletes_nothing_unless_the_marker_names_this_repository(spark, suite, conn):
    history = History(spark, suite, conn)
    root = suite.namespace(history.repo)
    marker = os.path.join(root, *MARKER_KEY.split("/"))
    with open(marker, "rb") as fh:
        original = fh.read()
    before = history.keys()
    try:
        for tampered in (
            original.replace(history.repo.encode(), b"someone-else"),
            original.replace(b'"instance_id": "', b'"instance_id": "0'),
            b"garbage",
            None,
        ):
            if tampered is None:
                os.unlink(marker)
            else:
                with open(marker, "wb") as fh:
                    fh.write(tampered)
            for sweep in (False, True):
                with pytest.raises(errors.FailedPrecondition) as failure:
                    run_gc(spark, history, sweep=sweep)
                assert failure.value.reason == "NAMESPACE_NOT_OWNED", failure.value
            assert history.keys() == before - ({MARKER_KEY} if tampered is None else set())
    finally:
        with open(marker, "wb") as fh:
            fh.write(original)
    assert run_gc(spark, history, sweep=False).collectable_count > 0


def stage_unchecked(suite, repo: str, branch: str, path: str, address: str) -> None:
    """An entry as it may have been staged before addresses were checked: written into the
    branch's staging partition straight through the KV backend (a client is refused it)."""
    from quarry.graveler.layout import encode_staged, staged_key, staging_partition
    from quarry.graveler.model import Entry

    with suite.client() as c:
        token = c.get_branch(repo, branch).staging_token
    suite.backend.set(
        staging_partition(token), staged_key(path), encode_staged(Entry(path, address, 1))
    )


def test_gc_keeps_a_file_a_retained_entry_reaches_through_dot_segments(spark, suite, conn):
    """The attack: the head commit references `data/<uuid>` through `data/sub/../<uuid>`
    (and a staged entry through `%2e%2e`); GC compared address text with keys and deleted
    the file. Such addresses are refused when staged now (test_servicer_checks), but older
    entries may hold them: GC keeps every key any reader may resolve an address to."""
    history = History(spark, suite, conn)
    ns = suite.namespace(history.repo)
    committed_file, staged_file = f"data/{uuid.uuid4().hex}", f"data/{uuid.uuid4().hex}"
    with open_blob_store(ns) as store:
        store.put(committed_file, b"the head commit's")
        store.put(staged_file, b"a staged entry's")
    with suite.client() as c:
        refused = [f"{ns}/data/sub/../{committed_file[5:]}", f"{ns}//{committed_file}"]
        for address in refused:
            with pytest.raises(errors.InvalidArgument) as failure:
                c.put_object(history.repo, "main", path="dotted", physical_address=address)
            assert failure.value.reason == "INVALID_PHYSICAL_ADDRESS"
        c.put_object(history.repo, "main", path="plain", physical_address=f"{ns}/plain")
        stage_unchecked(
            suite, history.repo, "main", "legacy/dotted", f"{ns}/data/sub/../{committed_file[5:]}"
        )
        head = c.commit(history.repo, "main", "entries recorded before the check").commit
        assert c.stat_object(history.repo, head.id, "legacy/dotted").physical_address.endswith(
            "/data/sub/../" + committed_file[5:]
        )
        # A write through the API first: it marks the new staging token dirty (readers
        # skip a clean branch's staging).
        c.put_object(history.repo, "main", path="plain-2", physical_address=f"{ns}/plain-2")
        stage_unchecked(
            suite,
            history.repo,
            "main",
            "legacy/encoded",
            f"file://{ns}/data/x/%2e%2e/{staged_file[5:]}",
        )
    report = run_gc(spark, history, sweep=True)
    assert report.deleted > 0  # the sweep ran (A's unreferenced files went)
    assert {committed_file, staged_file} <= history.keys()


def test_a_future_now_never_makes_a_running_writes_branch_stale(spark, suite, conn):
    """`now` moves retention only: a Spark write's branch made a moment ago stays (with its
    staged entries) however far ahead `now` is; a negative grace or TTL is refused before
    anything is read (it would put the cutoff after the real time)."""
    history = History(spark, suite, conn)
    running = qs.common.ephemeral_branch(new_job_id())
    with suite.client() as c:
        c.create_branch(history.repo, running, "main@")
    report = collect_garbage(
        spark,
        history.repo,
        rules=RetentionRules(7),
        sweep=True,
        now=dt.datetime.now(dt.UTC) + dt.timedelta(days=365),
        grace=dt.timedelta(0),
        connection=conn,
    )
    assert running not in report.ephemeral_branches
    assert history.stale_branch in report.ephemeral_branches
    with suite.client() as c:
        assert running in [b.name for b in c.iter_branches(history.repo)]
    for bad in ({"grace": dt.timedelta(hours=-5)}, {"ephemeral_ttl": dt.timedelta(hours=-1)}):
        with pytest.raises(errors.InvalidArgument):
            collect_garbage(spark, history.repo, connection=conn, **bad)


@pytest.mark.parametrize("flag", ["--grace-hours", "--ephemeral-ttl-hours"])
def test_negative_hours_are_a_usage_error(flag, capsys):
    with pytest.raises(SystemExit) as exited:
        quarry_main(["gc", "run", "any", flag, "-5"])
    assert exited.value.code == 2
    assert "hours must be a number, not negative" in capsys.readouterr().err
