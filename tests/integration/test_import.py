"""Zero-copy import (docs/import.md) against the whole suite on loopback: real sources (a
directory, S3 on moto's server), the async RPCs, the all-or-nothing commit, staged changes
kept, cancel, races with commits, refusals, and the KV cost of an import."""

from __future__ import annotations

import io
import os
import sys
import threading
import time
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from quarry import errors
from quarry.blob import LocalBlobStore, read_object
from quarry.cli.main import main as quarry_main
from quarry.graveler import imports as imports_module
from quarry.kv.memory import MemoryStore
from quarry.v1 import committer_pb2 as cm
from quarry.v1 import types_pb2
from support.counting import CountingStore
from support.suite import suite_fixture
from support.wait import wait_until

COMPLETED = cm.IMPORT_STATE_COMPLETED
CANCELLED = cm.IMPORT_STATE_CANCELLED
FAILED = cm.IMPORT_STATE_FAILED

# Keys that sort differently from a directory walk ("a-b" < "a/"), nested, with spaces,
# unicode and characters a URL would escape; one 0-byte file; an empty directory.
TRICKY = {
    "a/x.txt": b"ax",
    "a-b": b"dash",
    "a b/c d.txt": b"spaces",
    "a/b/c/deep.bin": b"deep" * 10,
    "a0": b"zero-sorted",
    "caf\u00e9/na\u00efve \u65e5\u672c.txt": b"unicode",
    "pct%20#hash?.txt": b"pct",
    "empty.bin": b"",
    "z/last": b"z",
}


def _tree(root, files=TRICKY):
    for key, data in files.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (root / "empty-dir" / "nested-empty").mkdir(parents=True)
    return root


@pytest.fixture(scope="module")
def backend():
    return CountingStore(MemoryStore())


suite = suite_fixture(
    backend="backend",
    fixture_options={"s3_endpoint_url": "moto_endpoint"},
    import_heartbeat_seconds=0.2,
)


@pytest.fixture
def client(suite):
    with suite.client() as client:
        yield client


_repos = iter(range(10**6))


@pytest.fixture
def repo(suite, client):
    name = f"imp{next(_repos)}"
    client.create_repository(name, suite.namespace(name))
    return name


def wait_done(client, repo, import_id, timeout=60.0):
    def done():
        status = client.get_import_status(repo, import_id)
        return status if status.state != cm.IMPORT_STATE_RUNNING else None

    return wait_until(done, timeout=timeout, what=f"import {import_id} to end")


def listing(client, repo, ref, prefix=""):
    return {o.path: o for o in client.iter_objects(repo, ref, prefix=prefix)}


def test_local_directory_imports_in_one_commit_without_copying(client, repo, tmp_path):
    source = _tree(tmp_path / "src")
    started = client.start_import(repo, "main", [(str(source), "data")], message="first")
    assert started.state == cm.IMPORT_STATE_RUNNING and started.id
    status = wait_done(client, repo, started.id)
    assert status.state == COMPLETED, status.error
    assert status.objects_listed == len(TRICKY) and status.bytes_listed == sum(
        len(v) for v in TRICKY.values()
    )
    commit = status.commit
    assert commit.message == "first"
    assert commit.metadata["import_id"] == started.id
    assert commit.metadata["import_objects"] == str(len(TRICKY))
    assert commit.metadata["import_sources"] == str(source)
    objects = listing(client, repo, "main")
    assert list(objects) == sorted(f"data/{k}" for k in TRICKY)
    for key, data in TRICKY.items():
        entry = objects[f"data/{key}"]
        # The entry points at the source file itself: nothing was copied.
        assert entry.physical_address == os.path.join(str(source), key)
        assert entry.size_bytes == len(data)
        assert read_object(entry.physical_address) == data
    log = list(client.iter_log(repo, "main"))
    assert log[0].id == commit.id and len(log) == 2  # one commit on the initial one
    # Nothing staged: the import never passed through staging.
    assert list(client.iter_uncommitted(repo, "main")) == []


def test_import_replaces_the_destination_and_keeps_the_rest_and_staged_changes(
    client, repo, tmp_path
):
    def put(path):
        client.put_object(repo, "main", path=path, physical_address=f"s3://elsewhere/{path}")

    for path in ("data/old.txt", "data/x.txt", "other/kept.txt", "datax"):
        put(path)
    client.commit(repo, "main", "before")
    put("data/staged.txt")  # staged under the destination
    put("other/staged.txt")
    client.delete_objects(repo, "main", ["other/kept.txt"])  # a staged deletion
    source = _tree(tmp_path / "src", {"x.txt": b"new x", "y.txt": b"y"})
    status = wait_done(client, repo, client.start_import(repo, "main", [(str(source), "data/")]).id)
    assert status.state == COMPLETED, status.error
    committed = listing(client, repo, status.commit.id)
    assert sorted(committed) == ["data/x.txt", "data/y.txt", "datax", "other/kept.txt"]
    assert committed["data/x.txt"].physical_address == str(source / "x.txt")
    # The staged changes are still staged, on top of the import.
    uncommitted = {c.path: c.type for c in client.iter_uncommitted(repo, "main")}
    assert uncommitted == {
        "data/staged.txt": types_pb2.CHANGE_TYPE_ADDED,
        "other/staged.txt": types_pb2.CHANGE_TYPE_ADDED,
        "other/kept.txt": types_pb2.CHANGE_TYPE_REMOVED,
    }
    seen = listing(client, repo, "main")
    assert sorted(seen) == [
        "data/staged.txt",
        "data/x.txt",
        "data/y.txt",
        "datax",
        "other/staged.txt",
    ]
    after = client.commit(repo, "main", "staged on top")
    assert after.summary.added == 2 and after.summary.removed == 1


def test_compacted_staged_changes_stay_staged_over_the_import(client, repo, tmp_path):
    """Staged changes folded into a compacted metarange are rebased onto the import's
    commit: still uncommitted, still shadowing the import, none lost."""
    for path in ("data/old", "keep/a", "keep/b"):
        client.put_object(repo, "main", path=path, physical_address=f"s3://x/{path}")
    client.commit(repo, "main", "before")
    client.put_object(repo, "main", path="data/x", physical_address="s3://staged/x")
    client.put_object(repo, "main", path="keep/c", physical_address="s3://staged/c")
    client.delete_objects(repo, "main", ["keep/a"])
    assert client.compact(repo, "main").compacted_metarange_id
    client.put_object(
        repo, "main", path="keep/d", physical_address="s3://staged/d"
    )  # not compacted
    source = _tree(tmp_path / "src", {"x": b"imported x", "y": b"y"})
    status = wait_done(client, repo, client.start_import(repo, "main", [(str(source), "data")]).id)
    assert status.state == COMPLETED, status.error
    assert sorted(listing(client, repo, status.commit.id)) == [
        "data/x",
        "data/y",
        "keep/a",
        "keep/b",
    ]
    uncommitted = {c.path: c.type for c in client.iter_uncommitted(repo, "main")}
    assert uncommitted == {
        "data/x": types_pb2.CHANGE_TYPE_CHANGED,  # the staged entry shadows the imported one
        "keep/a": types_pb2.CHANGE_TYPE_REMOVED,
        "keep/c": types_pb2.CHANGE_TYPE_ADDED,
        "keep/d": types_pb2.CHANGE_TYPE_ADDED,
    }
    seen = listing(client, repo, "main")
    assert seen["data/x"].physical_address == "s3://staged/x"
    assert sorted(seen) == ["data/x", "data/y", "keep/b", "keep/c", "keep/d"]


def suite_args(suite):
    targets = suite.targets
    return ["--branch-manager", targets["branch-manager"], "--committer", targets["committer"]]


def test_several_sources_into_several_paths_and_s3(
    suite, client, repo, tmp_path, moto_endpoint, s3_bucket, monkeypatch
):
    s3 = boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    keys = {
        "lake/t/part 1.parquet": b"p1",
        "lake/t/sub/d\u00e9j\u00e0 vu.csv": b"csv",
        "lake/t/zero": b"",
        "lake/t/folder/": b"",  # a "folder marker": no object of the lake, skipped
        "lake/t/x%2F..%2Fy": b"",  # a `..` once decoded: no reader serves it, skipped
        "lake/other/not-imported": b"no",
    }
    for key, data in keys.items():
        s3.put_object(Bucket=s3_bucket, Key=key, Body=data)
    local = _tree(tmp_path / "src", {"one": b"1"})
    status = wait_done(
        client,
        repo,
        client.start_import(
            repo,
            "main",
            [(f"s3://{s3_bucket}/lake/t", "tables/t"), (f"file://{local}", "files")],
        ).id,
    )
    assert status.state == COMPLETED, status.error
    assert status.objects_skipped == 2
    objects = listing(client, repo, "main")
    assert sorted(objects) == [
        "files/one",
        "tables/t/part 1.parquet",
        "tables/t/sub/d\u00e9j\u00e0 vu.csv",
        "tables/t/zero",
    ]
    entry = objects["tables/t/part 1.parquet"]
    assert entry.physical_address == f"s3://{s3_bucket}/lake/t/part 1.parquet"
    head = s3.head_object(Bucket=s3_bucket, Key="lake/t/part 1.parquet")
    assert entry.checksum == head["ETag"].strip('"') and entry.size_bytes == 2
    settings = type("S", (), {"s3_endpoint_url": moto_endpoint, "s3_region": "us-east-1"})
    assert read_object(entry.physical_address, settings) == b"p1"
    # `quarry cat` reads an imported object from its source (S3 here; local: tests/e2e).
    monkeypatch.setenv("QUARRY_S3_ENDPOINT_URL", moto_endpoint)
    out = io.BytesIO()
    wrapper = io.TextIOWrapper(out, encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", wrapper)
    code = quarry_main(
        ["cat", repo, "main", "tables/t/sub/d\u00e9j\u00e0 vu.csv", *suite_args(suite)]
    )
    wrapper.flush()
    printed = out.getvalue()
    monkeypatch.undo()
    assert code == 0 and printed == b"csv"
    assert status.commit.metadata["import_destinations"] == "files/,tables/t/"


def test_kv_writes_per_import_are_constant(client, repo, tmp_path, backend):
    source = tmp_path / "many"
    for d in range(20):
        (source / f"d{d:02d}").mkdir(parents=True)
        for i in range(250):
            (source / f"d{d:02d}" / f"f{i:04d}").write_bytes(b"x")
    backend.reset()
    status = wait_done(client, repo, client.start_import(repo, "main", [(str(source), "")]).id)
    writes = backend.total(op="set") + backend.total(op="set_if") + backend.total(op="batch_set")
    assert status.state == COMPLETED and status.objects_listed == 5000
    # The status record (a few times), the commit, the branch swap: never one per object.
    assert writes <= 50, backend.snapshot()


class _Gate:
    """Holds the import's listing after `after` objects until released (in-process suite:
    the committer runs in this test's process). The walk runs in the import's thread, where
    the gate is: listing processes (quarry.blob.chunks) would read directories ahead of it."""

    def __init__(self, monkeypatch, after):
        self.reached = threading.Event()
        self.release = threading.Event()
        monkeypatch.setattr(
            imports_module.Imports,
            "listing_processes",
            property(lambda self: 0, lambda self, value: None),
            raising=False,
        )
        real = imports_module.Listing
        gate = self

        class Gated(real):
            def __iter__(self):
                for index, item in enumerate(real.__iter__(self)):
                    if index == after:
                        gate.reached.set()
                        assert gate.release.wait(30)
                    yield item

        monkeypatch.setattr(imports_module, "Listing", Gated)


def _many(root, n):
    root.mkdir()
    for i in range(n):
        (root / f"f{i:05d}").write_bytes(b"")
    return root


def test_cancel_mid_way_leaves_the_branch_exactly_as_it_was(
    client, repo, tmp_path, monkeypatch, caplog
):
    client.put_object(repo, "main", path="data/old", physical_address="s3://x/old")
    client.commit(repo, "main", "before")
    client.put_object(repo, "main", path="data/staged", physical_address="s3://x/staged")
    branch_before = client.get_branch(repo, "main")
    gate = _Gate(monkeypatch, after=3000)
    started = client.start_import(repo, "main", [(str(_many(tmp_path / "src", 5000)), "data")])
    assert gate.reached.wait(30)
    asked = client.cancel_import(repo, started.id)
    assert asked.cancel_requested or asked.state == CANCELLED
    gate.release.set()
    status = wait_done(client, repo, started.id)
    assert status.state == CANCELLED and "unchanged" in status.error
    # A cancel is a normal outcome: no ERROR with a traceback from gRPC's request consumer.
    assert "Exception iterating requests" not in caplog.text
    branch_after = client.get_branch(repo, "main")
    assert branch_after.commit_id == branch_before.commit_id
    assert sorted(listing(client, repo, "main")) == ["data/old", "data/staged"]
    # Cancelling again is a no-op; the import can be run again.
    assert client.cancel_import(repo, started.id).state == CANCELLED
    monkeypatch.undo()
    again = wait_done(
        client, repo, client.start_import(repo, "main", [(str(tmp_path / "src"), "data")]).id
    )
    assert again.state == COMPLETED and again.objects_listed == 5000


def test_an_import_racing_commits_lands_on_the_new_head_and_loses_nothing(
    client, repo, tmp_path, monkeypatch
):
    """The import's commit is built on HEAD, then a commit and another import land before
    its swap: the swap's CAS fails and it is rebuilt on the new HEAD with the same ranges."""
    from quarry.committed.remote import RemoteRangeWriter

    reached, release = threading.Event(), threading.Event()
    real = RemoteRangeWriter.replace_prefixes
    calls = []

    def gated(self, *args, **kwargs):
        calls.append(args)
        result = real(self, *args, **kwargs)
        if len(calls) == 1:  # the first import's first attempt, built on the old HEAD
            reached.set()
            assert release.wait(30)
        return result

    monkeypatch.setattr(RemoteRangeWriter, "replace_prefixes", gated)
    started = client.start_import(repo, "main", [(str(_many(tmp_path / "src", 50)), "data")])
    assert reached.wait(30)
    # Meanwhile: a commit under the destination and one outside, and a second import.
    client.put_object(repo, "main", path="data/committed-meanwhile", physical_address="s3://x/1")
    client.put_object(repo, "main", path="keep/committed-meanwhile", physical_address="s3://x/2")
    middle = client.commit(repo, "main", "meanwhile").commit
    other = _tree(tmp_path / "other", {"o": b"o"})
    second = wait_done(client, repo, client.start_import(repo, "main", [(str(other), "more")]).id)
    assert second.state == COMPLETED
    release.set()
    status = wait_done(client, repo, started.id)
    assert status.state == COMPLETED, status.error
    objects = listing(client, repo, "main")
    # The import owns data/ (the commit's data/ entry is replaced); nothing else is lost.
    assert "keep/committed-meanwhile" in objects and "more/o" in objects
    assert "data/committed-meanwhile" not in objects
    assert len([p for p in objects if p.startswith("data/")]) == 50
    log = [c.id for c in client.iter_log(repo, "main")]
    assert log[:3] == [status.commit.id, second.commit.id, middle.id]
    # Rebuilt on the new HEAD from the same import metarange (not listed again).
    mine = [args for args in calls if args[2] == ["data/"]]
    assert len(mine) == 2 and mine[0][3] == mine[1][3] and mine[0][1] != mine[1][1]


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("relative/dir", "INVALID_IMPORT_SOURCE"),
        ("s3://Bad_Bucket/x", "INVALID_IMPORT_SOURCE"),
        ("/a/../etc", "INVALID_IMPORT_SOURCE"),
        ("ftp://host/x", "INVALID_IMPORT_SOURCE"),
    ],
)
def test_bad_sources_are_refused(client, repo, uri, reason):
    with pytest.raises(errors.InvalidArgument) as caught:
        client.start_import(repo, "main", [(uri, "data")])
    assert caught.value.reason == reason


def test_sources_inside_a_namespace_are_refused(client, suite, repo):
    other = f"{repo}-other"
    client.create_repository(other, suite.namespace(other))
    own = suite.namespace(repo)
    for uri in (
        suite.namespace(other),  # another repository's namespace
        suite.namespace(other) + "/sub",
        own + "/_quarry",  # the target's own files
        own + "/_quarry/ranges",
        own.rsplit("/", 1)[0],  # contains both namespaces
    ):
        with pytest.raises(errors.InvalidArgument) as caught:
            client.start_import(repo, "main", [(uri, "data")])
        assert caught.value.reason == "INVALID_IMPORT_SOURCE", uri


def test_overlapping_destinations_and_unknown_ids_are_refused(client, repo, tmp_path):
    source = _tree(tmp_path / "src", {"f": b"f"})
    with pytest.raises(errors.InvalidArgument, match="overlap"):
        client.start_import(repo, "main", [(str(source), "data"), (str(source), "data/sub")])
    with pytest.raises(errors.NotFound) as caught:
        client.get_import_status(repo, "0" * 32)
    assert caught.value.reason == "IMPORT_NOT_FOUND"
    with pytest.raises(errors.NotFound):
        client.start_import(repo, "nope", [(str(source), "data")])


def test_a_source_that_is_not_a_directory_is_refused_at_the_call(client, repo, tmp_path):
    before = client.get_branch(repo, "main").commit_id
    (tmp_path / "plain").write_bytes(b"a file")
    for missing in (tmp_path / "missing", tmp_path / "plain"):
        with pytest.raises(errors.QuarryError) as refused:
            client.start_import(repo, "main", [(str(missing), "d")])
        assert refused.value.reason == "INVALID_IMPORT_SOURCE"
        assert "not a directory" in refused.value.message
    assert client.get_branch(repo, "main").commit_id == before


def test_a_failing_source_fails_the_import_and_changes_nothing(client, repo, tmp_path, monkeypatch):
    """A source that fails once the import runs (it was a directory at the call)."""
    from quarry.blob import sources

    real_root, calls = sources.Listing.local_root, []

    def vanished(self):  # a directory for the call's check, gone when the import reads it
        calls.append(self.source.uri)
        if len(calls) > 1:
            raise sources.InvalidStorageNamespace(f"import source {self.source.uri!r} vanished")
        return real_root(self)

    monkeypatch.setattr(sources.Listing, "local_root", vanished)
    before = client.get_branch(repo, "main").commit_id
    source = _tree(tmp_path / "src", {"f": b"f"})
    status = wait_done(client, repo, client.start_import(repo, "main", [(str(source), "d")]).id)
    assert status.state == FAILED and "vanished" in status.error
    assert client.get_branch(repo, "main").commit_id == before


def test_a_stale_running_import_reads_as_failed(suite, client, repo, backend):
    """A record left RUNNING by a process that died (written here as it would be) reads as
    FAILED once its heartbeat is older than import_stale_seconds (tests/e2e kills a real
    process)."""
    from quarry.graveler import layout
    from quarry.graveler.imports import ImportRecord

    info = client.get_repository(repo)
    del info
    record = ImportRecord(
        id="d" * 32,
        repository=repo,
        branch="main",
        sources=[{"uri": "/x", "destination_path": "x/"}],
        started=time.time() - 3600,
        updated=time.time() - 3600,
    )
    from quarry.graveler.refs import RefManager

    partition = RefManager(backend).get_repository(repo).partition
    backend.set(partition, layout.import_key(record.id), record.encode())
    status = client.get_import_status(repo, record.id)
    assert status.state == FAILED and "stopped" in status.error


def test_an_import_is_one_trace_and_counts_objects_and_bytes(client, repo, tmp_path):
    from prometheus_client import REGISTRY

    from quarry import telemetry

    exporter = telemetry.use_in_memory_exporter()
    exporter.clear()

    def counted(name):
        return REGISTRY.get_sample_value(name) or 0.0

    objects, data = counted("quarry_import_objects_total"), counted("quarry_import_bytes_total")
    source = _tree(tmp_path / "src", {"a": b"12345", "b/c": b"678"})
    tracer = telemetry.tracer("test")
    with tracer.start_as_current_span("caller") as caller:
        started = client.start_import(repo, "main", [(str(source), "d")])
    status = wait_done(client, repo, started.id)
    assert status.state == COMPLETED
    trace_id = caller.get_span_context().trace_id

    def import_spans():
        spans = [s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id]
        return spans if any(s.name == "graveler.import" for s in spans) else None

    names = {s.name for s in wait_until(import_spans, what="the import's spans")}
    assert {
        "/quarry.v1.Committer/StartImport",
        "graveler.import",
        "graveler.import.write_ranges",
        "graveler.swap_branch",
        "/quarry.v1.RangeWriter/WriteMetaRange",
        "/quarry.v1.RangeWriter/ReplacePrefixes",
    } <= names
    assert counted("quarry_import_objects_total") == objects + 2
    assert counted("quarry_import_bytes_total") == data + 8


def test_a_source_changing_during_the_listing(client, repo, tmp_path, monkeypatch):
    """docs/import.md: a directory is read one directory at a time, in key order. Paused
    inside a/: a file added to a directory not yet read (z/) is imported, one added before
    the listing's position (0-early) or into a directory already read (a/) is not; a file
    removed from a directory not yet read is not imported, one removed after it was listed
    is (its entry points at nothing: reading it is OBJECT_NOT_FOUND)."""
    source = _tree(
        tmp_path / "src",
        {**{f"a/{i:02d}": b"a" for i in range(10)}, "z/old": b"old", "z/kept": b"kept"},
    )
    gate = _Gate(monkeypatch, after=5)
    started = client.start_import(repo, "main", [(str(source), "d")])
    assert gate.reached.wait(30)
    (source / "0-early").write_bytes(b"early")
    (source / "a" / "99-late").write_bytes(b"late")
    (source / "z" / "new").write_bytes(b"new")
    (source / "z" / "old").unlink()
    (source / "a" / "01").unlink()  # listed already
    gate.release.set()
    status = wait_done(client, repo, started.id)
    assert status.state == COMPLETED, status.error
    objects = listing(client, repo, "main")
    assert sorted(objects) == [f"d/a/{i:02d}" for i in range(10)] + ["d/z/kept", "d/z/new"]
    with pytest.raises(errors.NotFound):
        read_object(objects["d/a/01"].physical_address)


def test_an_import_writes_the_ranges_entry_by_entry_writing_writes(client, repo, suite, tmp_path):
    """The import's entries travel in columns (quarry.committed.columns); the same listing
    written the way it was before, one Entry at a time, gives the same metarange id, the
    same ranges and the same range file bytes (identities and chunking unchanged)."""
    from quarry.blob.sources import Listing, parse_source
    from quarry.committed import CommittedManager
    from quarry.committed.format import range_key
    from quarry.graveler.model import Entry

    source = _tree(tmp_path / "src")
    for i in range(2600):  # a few ranges of the default chunking
        folder = source / f"date=2026-{i // 500:02d}"
        folder.mkdir(exist_ok=True)
        (folder / f"part-{i:05d}.parquet").write_bytes(b"x" * (i % 5))
    status = wait_done(client, repo, client.start_import(repo, "main", [(str(source), "d")]).id)
    assert status.state == COMPLETED, status.error
    imported = client.get_commit(repo, status.commit.id).metarange_id

    listed = [
        Entry("d/" + obj.key, obj.address, obj.size, obj.checksum, obj.mtime_us)
        for obj in Listing(parse_source(str(source)))
    ]
    assert len(listed) == status.objects_listed == 2600 + len(TRICKY)
    manager = CommittedManager(lambda ns: LocalBlobStore(ns), None)
    writer = manager._writer
    reference = str(tmp_path / "reference")
    sink = writer.sink(reference, cache_written=False)
    builder = writer.builder(sink)
    with sink:
        for entry in listed:
            builder.add_entry(entry)
        ranges = builder.finish()
    assert len(ranges) >= 3
    assert writer.write_metarange_file(reference, ranges, max_keys=builder.max_keys) == imported
    namespace = Path(suite.namespace(repo))
    assert manager.get_metarange(str(namespace), imported) == ranges
    for info in ranges:
        key = range_key(info.id)
        assert (namespace / key).read_bytes() == (Path(reference) / key).read_bytes()
    assert list(manager.iterate(str(namespace), imported)) == listed
    manager.close()


def test_the_listing_skips_what_no_address_reads_back(tmp_path):
    """The walk checks each name once (not each key's whole path): a file whose name, or a
    directory name above it, has a control character is skipped and counted, as is a link;
    a listed file has its size and mtime (its one stat)."""
    from quarry.blob.sources import Listing, parse_source

    root = tmp_path / "src"
    (root / "ok").mkdir(parents=True)
    (root / "ok" / "a").write_bytes(b"1")
    (root / "bad\x01name").write_bytes(b"x")
    (root / "dir\x7f" / "sub").mkdir(parents=True)
    (root / "dir\x7f" / "f").write_bytes(b"y")
    (root / "dir\x7f" / "sub" / "g").write_bytes(b"z")
    os.symlink(root / "ok" / "a", root / "link")
    # Percent-encoded dots read as `..` / `.` segments to every reader: skipped too; a
    # plain percent sign is a name like any other.
    (root / "%2e%2e").write_bytes(b"d")
    (root / "%2E").mkdir()
    (root / "%2E" / "h").write_bytes(b"h")
    (root / "ok" / "100%").write_bytes(b"p")
    listing = Listing(parse_source(str(root)))
    listed = list(listing)
    assert [obj.key for obj in listed] == ["ok/100%", "ok/a"]
    assert listing.skipped == 6  # bad\x01name, dir\x7f/f, dir\x7f/sub/g, link, %2e%2e, %2E/h
    stat = os.stat(root / "ok" / "a")
    assert listed[1].address == str(root / "ok" / "a")
    assert (listed[1].size, listed[1].mtime_us) == (1, stat.st_mtime_ns // 1000)


def test_a_committer_stopping_mid_import_ends_it_cancelled_at_once(tmp_path, monkeypatch):
    """A stop gives a running import the grace to finish; one still running then stops at
    its next check and writes CANCELLED, naming the shutdown, before the committer closes
    its channels (it was killed mid-way and read RUNNING until its heartbeat went stale);
    the branch is unchanged."""
    from quarry.graveler import layout
    from quarry.graveler.imports import ImportRecord
    from quarry.graveler.refs import RefManager
    from quarry.kv.memory import MemoryStore
    from support.suite import running_suite

    jobs = []
    made = imports_module._Job.__init__

    def recorded(self, *args):
        made(self, *args)
        jobs.append(self)

    monkeypatch.setattr(imports_module._Job, "__init__", recorded)
    store = MemoryStore()
    with running_suite(tmp_path / "home", backend=store, import_heartbeat_seconds=0.2) as suite:
        with suite.client() as client:
            client.create_repository("stopping", suite.namespace("stopping"))
            head = client.get_branch("stopping", "main").commit_id
            gate = _Gate(monkeypatch, after=100)
            started = client.start_import(
                "stopping", "main", [(str(_many(tmp_path / "src", 500)), "data")]
            )
            assert gate.reached.wait(30)
            imports = suite.servers["committer"]
            stopping = threading.Thread(target=imports.stop, kwargs={"grace": 0.2})
            stopping.start()
            # Past the grace, the stop asks the import to end; then its listing goes on.
            wait_until(jobs[0].cancel.is_set, timeout=30, what="the stop to cancel the import")
            gate.release.set()
            stopping.join(30)
            assert not stopping.is_alive()
            assert client.get_branch("stopping", "main").commit_id == head
        partition = RefManager(store).get_repository("stopping").partition
        record = ImportRecord.decode(store.get(partition, layout.import_key(started.id)).value)
        assert record.state == "CANCELLED" and "shutdown" in record.error, record.error


def test_an_import_into_a_repository_deleted_meanwhile_is_no_success(
    client, suite, tmp_path, monkeypatch, caplog
):
    """tester hAO: the repository deleted and made again under its name while the import
    listed: the import committed into the dead instance and said COMPLETED with a commit
    the repository of that name does not have. Now it fails naming the deletion (its
    status went with the dead instance: the new repository knows no such import), and the
    new repository is untouched."""
    name = f"imp{next(_repos)}"
    client.create_repository(name, suite.namespace(name))
    gate = _Gate(monkeypatch, after=10)
    started = client.start_import(name, "main", [(str(_many(tmp_path / "src", 50)), "data")])
    assert gate.reached.wait(30)
    client.delete_repository(name)
    client.create_repository(name, suite.namespace(name))
    head = client.get_branch(name, "main").commit_id
    gate.release.set()

    def ended():
        try:
            return client.get_import_status(name, started.id).state != cm.IMPORT_STATE_RUNNING
        except errors.NotFound:
            return True

    wait_until(ended, timeout=60, what="the import to end")
    assert f"import {started.id} failed" in caplog.text
    assert "deleted during the import" in caplog.text
    assert client.get_branch(name, "main").commit_id == head
    assert not listing(client, name, "main")
