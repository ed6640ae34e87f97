"""The range-writer service on a real gRPC server (port 0), driven by RemoteRangeWriter."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quarry import errors
from quarry.blob import CountingBlobStore, LocalBlobStore, open_blob_store
from quarry.committed import (
    EMPTY_METARANGE_ID,
    CommittedManager,
    DuplicatePath,
    MetaRangeNotFound,
    UnsortedInput,
)
from quarry.committed.columns import encode_batch, entry_batches
from quarry.committed.remote import RemoteRangeWriter
from quarry.convert import entry_to_proto
from quarry.graveler.model import Change, ChangeType, Conflict, DiffSummary, Entry, MergeStrategy
from quarry.runtime.errors import error_info, from_rpc_error
from quarry.runtime.server import create_server
from quarry.v1 import range_writer_pb2, range_writer_pb2_grpc, types_pb2
from support.auth import service_channel
from support.servers import settings_for_tests


@contextlib.contextmanager
def range_writer(manager: CommittedManager, **overrides) -> Iterator[str]:
    from quarry.services.range_writer.service import build

    settings = settings_for_tests(**overrides)
    server, port = create_server(
        settings, build(settings, manager=manager), port=0, host="127.0.0.1"
    )
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=1.0)


@pytest.fixture
def served(tmp_path):
    stores: dict[str, CountingBlobStore] = {}

    def opener(ns: str) -> CountingBlobStore:
        store = open_blob_store(ns)  # validates the namespace like the real service
        stores[ns] = CountingBlobStore(LocalBlobStore(store.root, durable=False))
        return stores[ns]

    manager = CommittedManager(opener, str(tmp_path / "cache"), target_range_entries=32)
    with range_writer(manager) as target, RemoteRangeWriter(target) as remote:
        yield remote, target, str(tmp_path / "ns"), stores


def entry(path: str, version: int = 0) -> Entry:
    return Entry(
        path,
        f"addr/{path}/{version}",
        version,
        f"c{version}",
        1_700_000_000_000_000 + version,
        "text/plain",
        {"v": str(version)},
    )


def test_write_apply_and_read_back(served, tmp_path):
    remote, _target, namespace, _stores = served
    base_entries = [entry(f"p/{i:05d}") for i in range(3000)]
    written = remote.write_metarange(namespace, iter(base_entries))
    assert written.summary.added == 3000 and written.ranges_written > 10
    local = CommittedManager(lambda ns: LocalBlobStore(ns), None, target_range_entries=32)
    assert (
        local.write_metarange(str(tmp_path / "local"), base_entries).metarange_id
        == written.metarange_id
    )  # same content, same id, whoever writes it
    changes = [(f"p/{i:05d}", entry(f"p/{i:05d}", 1)) for i in range(0, 3000, 2)] + [
        (f"p/{i:05d}", None) for i in range(1, 3000, 2)
    ]
    changes.sort()
    applied = remote.apply_changes(namespace, written.metarange_id, changes)  # 2 batches
    assert (applied.summary.added, applied.summary.removed, applied.summary.changed) == (
        0,
        1500,
        1500,
    )
    listed = list(local.iterate(namespace, applied.metarange_id))
    assert listed == [entry(f"p/{i:05d}", 1) for i in range(0, 3000, 2)]
    ranges = remote.get_metarange(namespace, applied.metarange_id)
    assert ranges == local.get_metarange(namespace, applied.metarange_id)
    assert sum(r.count for r in ranges) == 1500
    # Change objects and an empty base work over the wire too.
    fresh = remote.apply_changes(namespace, "", [Change(ChangeType.ADDED, "a", entry("a"))])
    assert local.get_entry(namespace, fresh.metarange_id, "a") == entry("a")
    empty = remote.write_metarange(namespace, [])
    assert empty.metarange_id == EMPTY_METARANGE_ID
    assert remote.get_metarange(namespace, EMPTY_METARANGE_ID) == []
    local.close()


def test_get_metarange_is_paged_by_size(tmp_path):
    """GetMetaRange pages end by encoded size; RemoteRangeWriter follows the tokens."""
    from quarry.paging import PAGE_TOKEN_RESERVE_BYTES

    manager = CommittedManager(
        lambda ns: LocalBlobStore(ns), str(tmp_path / "cache"), target_range_entries=8
    )
    namespace = str(tmp_path / "ns")
    # ~600-byte paths: each RangeInfo is over 1 KB, 3 fit in the 4 KB left for items.
    written = manager.write_metarange(
        namespace, [entry(f"{i:05d}" + "p" * 600) for i in range(400)]
    )
    expected = manager.get_metarange(namespace, written.metarange_id)
    assert len(expected) > 20
    with (
        range_writer(manager, max_response_bytes=PAGE_TOKEN_RESERVE_BYTES + 4096) as target,
        RemoteRangeWriter(target) as remote,
    ):
        assert remote.get_metarange(namespace, written.metarange_id) == expected
        channel = service_channel(target)
        stub = range_writer_pb2_grpc.RangeWriterStub(channel)
        request = range_writer_pb2.GetMetaRangeRequest(
            storage_namespace=namespace, metarange_id=written.metarange_id
        )
        pages = []
        while True:
            response = stub.GetMetaRange(request, timeout=10)
            pages.append(response)
            if not response.next_page_token:
                break
            request.page_token = response.next_page_token
        assert 1 < len(pages) < len(expected)
        assert all(p.ranges and p.ByteSize() <= PAGE_TOKEN_RESERVE_BYTES + 4096 for p in pages)
        assert [r.id for p in pages for r in p.ranges] == [r.id for r in expected]
        # page_size still limits by count; a token from another metarange is refused.
        first = stub.GetMetaRange(
            range_writer_pb2.GetMetaRangeRequest(
                storage_namespace=namespace, metarange_id=written.metarange_id, page_size=1
            )
        )
        assert len(first.ranges) == 1
        with pytest.raises(grpc.RpcError) as refused:
            stub.GetMetaRange(
                range_writer_pb2.GetMetaRangeRequest(
                    storage_namespace=namespace,
                    metarange_id=EMPTY_METARANGE_ID,
                    page_token=first.next_page_token,
                )
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(refused.value)[0].reason == "INVALID_PAGE_TOKEN"
        channel.close()
    manager.close()


def test_one_change_costs_over_the_wire(served):
    remote, _target, namespace, stores = served
    base = remote.write_metarange(namespace, [entry(f"k/{i:05d}") for i in range(5000)])
    store = stores[namespace]
    store.reset()
    result = remote.apply_changes(namespace, base.metarange_id, [("k/02500", entry("k/02500", 7))])
    assert result.summary.changed == 1
    assert result.ranges_written <= 2 and store.counts["put"] <= 3
    assert store.reads <= 2  # the touched range(s); the metarange is cached in the server


def test_errors_map_back_to_domain_exceptions(served):
    remote, target, namespace, _stores = served
    with pytest.raises(UnsortedInput) as caught:
        remote.apply_changes(namespace, "", [("b", None), ("a", None)])
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(DuplicatePath):
        remote.write_metarange(namespace, [entry("a"), entry("a")])
    with pytest.raises(MetaRangeNotFound):
        remote.apply_changes(namespace, "f" * 64, [])
    with pytest.raises(MetaRangeNotFound):
        remote.get_metarange(namespace, "f" * 64)
    with pytest.raises(errors.InvalidArgument):
        remote.apply_changes("relative/namespace", "", [])

    class Boom(Exception):
        pass

    def failing():
        yield ("a", None)
        raise Boom("caller's iterator failed")

    with pytest.raises(Boom):
        remote.apply_changes(namespace, "", failing())


def _raw_status(call):
    with pytest.raises(grpc.RpcError) as caught:
        call()
    info, _ = error_info(caught.value)
    return caught.value.code(), info.reason if info else None, from_rpc_error(caught.value)


def test_stream_protocol_is_validated(served):
    _remote, target, namespace, _stores = served
    with service_channel(target) as channel:
        stub = range_writer_pb2_grpc.RangeWriterStub(channel)
        header = range_writer_pb2.ApplyChangesRequest(
            header=range_writer_pb2.ApplyChangesHeader(storage_namespace=namespace)
        )
        batch = range_writer_pb2.ApplyChangesRequest(
            changes=range_writer_pb2.ChangeBatch(
                changes=[types_pb2.Change(type=types_pb2.CHANGE_TYPE_REMOVED, path="x")]
            )
        )
        for requests in ([], [batch], [batch, header], [header, header]):
            code, reason, _ = _raw_status(
                lambda requests=requests: stub.ApplyChanges(iter(requests), timeout=10)
            )
            assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_STREAM")
        no_namespace = range_writer_pb2.ApplyChangesRequest(
            header=range_writer_pb2.ApplyChangesHeader()
        )
        code, _, _ = _raw_status(lambda: stub.ApplyChanges(iter([no_namespace]), timeout=10))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        put_without_entry = range_writer_pb2.ApplyChangesRequest(
            changes=range_writer_pb2.ChangeBatch(
                changes=[types_pb2.Change(type=types_pb2.CHANGE_TYPE_ADDED, path="x")]
            )
        )
        code, _, _ = _raw_status(
            lambda: stub.ApplyChanges(iter([header, put_without_entry]), timeout=10)
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        unsorted = range_writer_pb2.ApplyChangesRequest(
            changes=range_writer_pb2.ChangeBatch(
                changes=[
                    types_pb2.Change(type=types_pb2.CHANGE_TYPE_REMOVED, path=p) for p in ("b", "a")
                ]
            )
        )
        code, reason, _ = _raw_status(
            lambda: stub.ApplyChanges(iter([header, unsorted]), timeout=10)
        )
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "UNSORTED_INPUT")
        wm_first = range_writer_pb2.WriteMetaRangeRequest(entries=range_writer_pb2.EntryBatch())
        code, reason, _ = _raw_status(lambda: stub.WriteMetaRange(iter([wm_first]), timeout=10))
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_STREAM")
        code, _, _ = _raw_status(
            lambda: stub.MergeMetaRanges(range_writer_pb2.MergeMetaRangesRequest(), timeout=10)
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT  # no storage_namespace
        for bad in (
            range_writer_pb2.MergeMetaRangesRequest(storage_namespace=namespace, strategy=9),
            range_writer_pb2.MergeMetaRangesRequest(storage_namespace=namespace, max_conflicts=-1),
        ):
            code, _, _ = _raw_status(lambda bad=bad: stub.MergeMetaRanges(bad, timeout=10))
            assert code == grpc.StatusCode.INVALID_ARGUMENT


def test_health_and_server_info(served):
    _remote, target, _namespace, _stores = served
    with service_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(
            health_pb2.HealthCheckRequest(service="quarry.v1.RangeWriter"), timeout=5
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        from quarry.v1 import server_info_pb2, server_info_pb2_grpc

        info = server_info_pb2_grpc.ServerInfoStub(channel).GetServerInfo(
            server_info_pb2.GetServerInfoRequest(), timeout=5
        )
        assert info.service == "range-writer"


def test_default_build_uses_settings(tmp_path):
    from quarry.services.range_writer.service import build

    settings = settings_for_tests(home=str(tmp_path / "home"))
    spec = build(settings)
    assert spec.name == "range-writer"
    server, port = create_server(settings, spec, port=0, host="127.0.0.1")
    try:
        with RemoteRangeWriter(f"127.0.0.1:{port}") as remote:
            namespace = str(tmp_path / "ns")
            result = remote.write_metarange(namespace, [entry("x")])
            assert remote.get_metarange(namespace, result.metarange_id)[0].count == 1
    finally:
        server.stop(grace=1.0)


def test_batches_respect_the_byte_budget(served):
    _remote, target, namespace, _stores = served
    big = [Entry(f"b/{i:03d}", "a", 1, "c", 0, "", {"blob": "x" * 3000}) for i in range(40)]
    with RemoteRangeWriter(target, batch_items=1000, batch_bytes=10_000) as small_batches:
        written = small_batches.write_metarange(namespace, big)  # ~13 messages
        assert written.summary.added == 40
        applied = small_batches.apply_changes(
            namespace, written.metarange_id, [(e.path, None) for e in big[::2]]
        )
    assert applied.summary.removed == 20
    local = CommittedManager(lambda ns: LocalBlobStore(ns), None)
    assert list(local.iterate(namespace, applied.metarange_id)) == big[1::2]
    local.close()


# ---- MergeMetaRanges ---------------------------------------------------------------------------


def _merge_inputs(remote, namespace):
    """base, source, destination metaranges (as dicts and ids) with clean changes on both
    sides and three conflicts: changed differently, delete vs change, add vs add."""
    base = {f"m/{i:04d}": entry(f"m/{i:04d}") for i in range(500)}
    source, dest = dict(base), dict(base)
    source["m/0001"], dest["m/0001"] = entry("m/0001", 1), entry("m/0001", 2)
    del source["m/0002"]
    dest["m/0002"] = entry("m/0002", 2)
    source["n/new"], dest["n/new"] = entry("n/new", 1), entry("n/new", 2)
    source["m/0100"] = entry("m/0100", 1)
    source["m/0200x"] = entry("m/0200x", 1)
    del source["m/0300"]
    dest["m/0400"] = entry("m/0400", 2)
    ids = [
        remote.write_metarange(namespace, [m[p] for p in sorted(m)]).metarange_id
        for m in (base, source, dest)
    ]
    return (base, source, dest), ids


def test_merge_metaranges_over_the_wire(served, tmp_path):
    remote, _target, namespace, stores = served
    (base, source, dest), (b, s, d) = _merge_inputs(remote, namespace)
    local = CommittedManager(lambda ns: LocalBlobStore(ns), None, target_range_entries=32)

    conflicted = remote.merge_metaranges(namespace, b, s, d)
    assert conflicted.metarange_id == "" and conflicted.more_conflicts == 0
    assert conflicted.conflicts == (
        Conflict("m/0001", base["m/0001"], source["m/0001"], dest["m/0001"]),
        Conflict("m/0002", base["m/0002"], None, dest["m/0002"]),  # absent = unset
        Conflict("n/new", None, source["n/new"], dest["n/new"]),
    )
    assert conflicted.summary == DiffSummary(added=1, removed=1, changed=1)
    assert local.merge_metaranges(namespace, b, s, d) == conflicted  # same contract

    bounded = remote.merge_metaranges(namespace, b, s, d, max_conflicts=2)
    assert len(bounded.conflicts) == 2 and bounded.more_conflicts == 1
    counted = remote.merge_metaranges(namespace, b, s, d, max_conflicts=0)
    assert counted.conflicts == () and counted.more_conflicts == 3

    store = stores[namespace]
    store.reset()
    dry = remote.merge_metaranges(
        namespace, b, s, d, strategy=MergeStrategy.SOURCE_WINS, dry_run=True
    )
    assert dry.metarange_id == "" and store.counts["put"] == 0
    assert dry.summary == DiffSummary(added=1, removed=2, changed=3)

    won = remote.merge_metaranges(namespace, b, s, d, strategy=MergeStrategy.SOURCE_WINS)
    assert won.summary == dry.summary and won.conflicts == ()
    expected = dict(dest)
    for path in ("m/0001", "n/new", "m/0100", "m/0200x"):
        expected[path] = source[path]
    for path in ("m/0002", "m/0300"):
        del expected[path]
    assert {e.path: e for e in local.iterate(namespace, won.metarange_id)} == expected
    assert won.ranges_written >= 1 and won.ranges_reused >= 5

    kept = remote.merge_metaranges(namespace, b, s, d, strategy=MergeStrategy.DEST_WINS)
    assert kept.summary == DiffSummary(added=1, removed=1, changed=1)
    assert local.get_entry(namespace, kept.metarange_id, "m/0001") == dest["m/0001"]

    fast_forward = remote.merge_metaranges(namespace, b, s, b)
    assert fast_forward.metarange_id == s and fast_forward.ranges_written == 0
    assert remote.merge_metaranges(namespace, b, b, d).metarange_id == d
    local.close()


def test_merge_metaranges_errors_over_the_wire(served):
    remote, _target, namespace, _stores = served
    mr = remote.write_metarange(namespace, [entry("a")]).metarange_id
    with pytest.raises(MetaRangeNotFound):
        remote.merge_metaranges(namespace, mr, "f" * 64, mr)
    with pytest.raises(errors.InvalidArgument):
        remote.merge_metaranges(namespace, mr, "not-an-id", mr)
    with pytest.raises(errors.InvalidArgument):
        remote.merge_metaranges(namespace, mr, mr, mr, max_conflicts=-1)
    with pytest.raises(errors.InvalidArgument):
        remote.merge_metaranges("relative/namespace", "", "", "")


def test_claim_namespace_writes_only_the_marker_and_reports_what_it_found(served, tmp_path):
    """ClaimNamespace (the range-writer is the writer of namespaces): if absent into an
    empty namespace, if equal over a given marker, and never anything else."""
    from quarry.blob.ownership import MARKER_KEY, SCAN_LIMIT

    remote, target, namespace, stores = served
    first = remote.claim_namespace(namespace, b'{"m": 1}')
    assert first.claimed and first.keys == () and first.existing_marker is None
    again = remote.claim_namespace(namespace, b'{"m": 2}')
    assert not again.claimed and again.existing_marker == b'{"m": 1}'
    assert stores[namespace].get(MARKER_KEY) == b'{"m": 1}'
    # Replace only the exact marker named.
    assert not remote.claim_namespace(namespace, b'{"m": 3}', replace=b'{"m": 2}').claimed
    assert remote.claim_namespace(namespace, b'{"m": 3}', replace=b'{"m": 1}').claimed
    assert stores[namespace].get(MARKER_KEY) == b'{"m": 3}'

    # A namespace with other files: nothing written, a bounded listing of them returned.
    crowded = tmp_path / "crowded"
    for i in range(SCAN_LIMIT + 5):
        (crowded / f"d{i % 7}").mkdir(parents=True, exist_ok=True)
        (crowded / f"d{i % 7}" / f"f{i}").write_text("x")
    found = remote.claim_namespace(str(crowded), b'{"m": 1}')
    assert not found.claimed and found.existing_marker is None
    assert len(found.keys) == SCAN_LIMIT and found.keys_truncated
    assert not (crowded / "_quarry").exists()

    with service_channel(target) as channel:
        stub = range_writer_pb2_grpc.RangeWriterStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ClaimNamespace(range_writer_pb2.ClaimNamespaceRequest(storage_namespace=namespace))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        for bad in ("/a/../b", "/", "s3://bucket"):
            with pytest.raises(grpc.RpcError) as caught:
                stub.ClaimNamespace(
                    range_writer_pb2.ClaimNamespaceRequest(storage_namespace=bad, marker=b"x")
                )
            assert error_info(caught.value)[0].reason == "INVALID_NAMESPACE"


def test_a_large_apply_fans_out_in_spans_to_a_peer_with_the_same_result(tmp_path):
    # Two range-writers on one namespace: A, configured with B as its peer, splits the
    # apply into key spans, applies one and has B apply the other over gRPC, then writes
    # the one metarange: the same metarange as one apply, B having written ranges too.
    def manager() -> CommittedManager:
        return CommittedManager(
            lambda ns: LocalBlobStore(ns, durable=False), None, target_range_entries=32
        )

    namespace = str(tmp_path / "ns")
    local, a_manager, b_manager = manager(), manager(), manager()
    entries = [entry(f"p/{i:05d}") for i in range(5000)]
    base = local.write_metarange(namespace, entries).metarange_id
    changes = [(e.path, entry(e.path, 1)) for e in entries[::10]] + [("z/after", entry("z/after"))]
    # The reference apply runs in another namespace (ids do not depend on it).
    other = str(tmp_path / "other")
    expected = manager().apply_changes(
        other, manager().write_metarange(other, entries).metarange_id, changes
    )
    with (
        range_writer(b_manager) as peer,
        range_writer(
            a_manager, range_writer_peers=peer, range_writer_fan_out_min_changes=100
        ) as coordinator,
        RemoteRangeWriter(coordinator) as remote,
    ):
        result = remote.apply_changes(namespace, base, changes)
        assert result.metarange_id == expected.metarange_id
        assert result.summary == expected.summary == DiffSummary(added=1, changed=500)
        assert a_manager.stats.ranges_written > 0 and b_manager.stats.ranges_written > 0
        assert b_manager.stats.metaranges_written == 0  # only the coordinator names them
        # Below the threshold the coordinator applies alone.
        written_by_b = b_manager.stats.ranges_written
        few = [(e.path, entry(e.path, 2)) for e in entries[:50]]
        assert remote.apply_changes(namespace, base, few).metarange_id == (
            manager().apply_changes(other, base, few).metarange_id
        )
        assert b_manager.stats.ranges_written == written_by_b
        # A span with its bounds reversed is refused.
        stub = range_writer_pb2_grpc.RangeWriterStub(service_channel(peer))
        header = range_writer_pb2.ApplyChangesHeader(
            storage_namespace=namespace,
            base_metarange_id=base,
            span=range_writer_pb2.ApplySpan(first_range=5, stop_range=2),
        )
        with pytest.raises(grpc.RpcError) as raised:
            stub.ApplyChanges(iter([range_writer_pb2.ApplyChangesRequest(header=header)]))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_span_a_peer_cannot_apply_is_applied_by_the_coordinator(tmp_path):
    # The configured peer is down (nothing listens there): the apply still succeeds, the
    # coordinator applying every span itself, with the same result as one apply.
    from support.processes import free_port

    manager = CommittedManager(
        lambda ns: LocalBlobStore(ns, durable=False), None, target_range_entries=32
    )
    namespace = str(tmp_path / "ns")
    entries = [entry(f"p/{i:05d}") for i in range(3000)]
    base = manager.write_metarange(namespace, entries).metarange_id
    changes = [(e.path, entry(e.path, 1)) for e in entries[::7]]
    other = str(tmp_path / "other")
    reference = CommittedManager(
        lambda ns: LocalBlobStore(ns, durable=False), None, target_range_entries=32
    )
    expected = reference.apply_changes(
        other, reference.write_metarange(other, entries).metarange_id, changes
    )
    with (
        range_writer(
            manager,
            range_writer_peers=f"127.0.0.1:{free_port()}",
            range_writer_fan_out_min_changes=100,
        ) as coordinator,
        RemoteRangeWriter(coordinator, timeout=30) as remote,
    ):
        result = remote.apply_changes(namespace, base, changes)
    assert result.metarange_id == expected.metarange_id
    assert result.summary == expected.summary


def test_a_peer_that_does_not_answer_holds_a_span_only_until_the_span_timeout(tmp_path):
    # The peer takes the span and never returns it (a stuck or partitioned pod): past
    # range_writer_span_timeout_seconds the coordinator applies that span itself.
    released = threading.Event()

    class StuckManager(CommittedManager):
        def apply_span(self, *args, **kwargs):
            released.wait(120)
            raise RuntimeError("released")

    def manager(cls: type[CommittedManager] = CommittedManager) -> CommittedManager:
        return cls(lambda ns: LocalBlobStore(ns, durable=False), None, target_range_entries=32)

    namespace = str(tmp_path / "ns")
    coordinator_manager = manager()
    entries = [entry(f"p/{i:05d}") for i in range(3000)]
    base = coordinator_manager.write_metarange(namespace, entries).metarange_id
    changes = [(e.path, entry(e.path, 1)) for e in entries[::7]]
    other = str(tmp_path / "other")
    reference = manager()
    expected = reference.apply_changes(
        other, reference.write_metarange(other, entries).metarange_id, changes
    )
    stuck = manager(StuckManager)
    try:
        with (
            range_writer(stuck) as peer,
            range_writer(
                coordinator_manager,
                range_writer_peers=peer,
                range_writer_fan_out_min_changes=100,
                range_writer_span_timeout_seconds=2.0,
            ) as coordinator,
            RemoteRangeWriter(coordinator, timeout=60) as remote,
        ):
            started = time.monotonic()
            result = remote.apply_changes(namespace, base, changes)
            assert time.monotonic() - started < 30
            released.set()
    finally:
        released.set()
    assert result.metarange_id == expected.metarange_id
    assert result.summary == expected.summary
    assert stuck.stats.ranges_written == 0  # the peer wrote nothing: the coordinator did it all


# ---- WriteMetaRange in columns (quarry.committed.columns) ------------------------------------


def entry_by_entry(manager: CommittedManager, namespace: str, entries: list[Entry]) -> str:
    """The metarange id written the way WriteMetaRange wrote before columns: one Entry at a
    time through RangeBuilder.add_entry (the reference the columns must match)."""
    writer = manager._writer
    sink = writer.sink(namespace, cache_written=False)
    builder = writer.builder(sink)
    with sink:
        for one in entries:
            builder.add_entry(one)
        ranges = builder.finish()
    return writer.write_metarange_file(namespace, ranges, max_keys=builder.max_keys)


def range_files(namespace: str, ranges) -> list[bytes]:
    from quarry.committed.format import range_key

    return [(Path(namespace) / range_key(r.id)).read_bytes() for r in ranges]


def test_columns_and_entry_messages_write_what_entry_by_entry_writing_wrote(tmp_path):
    """The same entries (plain ones, as an import lists them, and ones with metadata and
    content types, unicode paths, 0 sizes and mtimes) written in columns, in entry messages
    (what older clients send) and one Entry at a time: the same ranges, ids and file bytes,
    chunked by boundary paths and by the byte cap alike."""
    entries = []
    for i in range(2500):
        path = f"t/caf\u00e9 {i // 100:03d}/part-{i:05d}"
        if i % 7:
            entries.append(Entry(path, f"/lake/{path}", i % 3, "", 1_700_000_000_000_000 + i))
        else:
            entries.append(
                Entry(path, f"s3://b/{i}", i, f"etag{i}", 0, "text/csv", {"k": "v" * (i % 500)})
            )
    manager = CommittedManager(
        lambda ns: LocalBlobStore(ns), None, target_range_entries=64, max_range_bytes=8000
    )
    reference = str(tmp_path / "reference")
    expected = entry_by_entry(manager, reference, entries)
    expected_ranges = manager.get_metarange(reference, expected)
    assert len(expected_ranges) > 40  # boundaries and the byte cap both end ranges
    assert any(r.size_bytes >= 8000 for r in expected_ranges)
    with range_writer(manager) as target, RemoteRangeWriter(target) as remote:
        in_columns = str(tmp_path / "columns")
        written = remote.write_metarange(in_columns, entries)  # columns: what clients send
        assert written.metarange_id == expected and written.summary.added == len(entries)
        assert remote.get_metarange(in_columns, expected) == expected_ranges
        assert range_files(in_columns, expected_ranges) == range_files(reference, expected_ranges)
        in_messages = str(tmp_path / "messages")
        with service_channel(target) as channel:
            stub = range_writer_pb2_grpc.RangeWriterStub(channel)
            requests = [
                range_writer_pb2.WriteMetaRangeRequest(
                    header=range_writer_pb2.WriteMetaRangeHeader(storage_namespace=in_messages)
                )
            ] + [
                range_writer_pb2.WriteMetaRangeRequest(
                    entries=range_writer_pb2.EntryBatch(
                        entries=[entry_to_proto(e) for e in entries[start : start + 1000]]
                    )
                )
                for start in range(0, len(entries), 1000)
            ]
            response = stub.WriteMetaRange(iter(requests), timeout=60)
        assert response.metarange_id == expected
        assert range_files(in_messages, expected_ranges) == range_files(reference, expected_ranges)
    assert list(manager.iterate(in_columns, expected)) == entries
    manager.close()


def _columns_message(batch) -> range_writer_pb2.WriteMetaRangeRequest:
    return range_writer_pb2.WriteMetaRangeRequest(entry_columns=encode_batch(batch))


def test_bad_entry_columns_are_refused_before_anything_is_named(served):
    """Columns that do not decode, of another schema, with nulls, unsorted (within a batch or
    across two) or with an mtime no Timestamp holds: INVALID_ARGUMENT, never INTERNAL."""
    _remote, target, namespace, _stores = served
    good = list(entry_batches([Entry("a", "x", 1), Entry("b", "y", 2)]))[0]
    later = list(entry_batches([Entry("c", "z", 3)]))[0]
    earlier = list(entry_batches([Entry("a0", "z", 3)]))[0]
    header = range_writer_pb2.WriteMetaRangeRequest(
        header=range_writer_pb2.WriteMetaRangeHeader(storage_namespace=namespace)
    )
    other_schema = pa.record_batch([pa.array(["a"])], names=["path"])
    with_null = good.set_column(1, "physical_address", pa.array(["x", None], pa.string()))
    unsorted = good.set_column(0, "path", pa.array(["b", "a"], pa.string()))
    duplicate = good.set_column(0, "path", pa.array(["a", "a"], pa.string()))
    far_future = good.set_column(
        4, "mtime", pa.array([2**62, 0], pa.int64()).cast(good.schema.field("mtime").type)
    )
    unsorted_metadata = list(entry_batches([Entry("m", "x", 1, "", 0, "", {"a": "1", "b": "2"})]))[
        0
    ]
    unsorted_metadata = unsorted_metadata.set_column(
        6,
        "metadata",
        pa.array([[("b", "2"), ("a", "1")]], unsorted_metadata.schema.field("metadata").type),
    )
    cases = [
        ([range_writer_pb2.WriteMetaRangeRequest(entry_columns=b"not arrow")], "INVALID_ARGUMENT"),
        ([_columns_message(other_schema)], "INVALID_ARGUMENT"),
        ([_columns_message(with_null)], "INVALID_ARGUMENT"),
        ([_columns_message(unsorted)], "UNSORTED_INPUT"),
        ([_columns_message(duplicate)], "DUPLICATE_PATH"),
        ([_columns_message(good), _columns_message(earlier)], "UNSORTED_INPUT"),
        ([_columns_message(far_future)], "INVALID_ENTRY"),
        ([_columns_message(unsorted_metadata)], "INVALID_ARGUMENT"),
    ]
    with service_channel(target) as channel:
        stub = range_writer_pb2_grpc.RangeWriterStub(channel)
        for parts, reason in cases:
            code, got, _ = _raw_status(
                lambda parts=parts: stub.WriteMetaRange(iter([header, *parts]), timeout=10)
            )
            assert (code, got) == (grpc.StatusCode.INVALID_ARGUMENT, reason), reason
        # The same batches in order are fine: the refusals were the input's.
        response = stub.WriteMetaRange(
            iter([header, _columns_message(good), _columns_message(later)]), timeout=10
        )
    local = CommittedManager(lambda ns: LocalBlobStore(ns), None)
    assert [e.path for e in local.iterate(namespace, response.metarange_id)] == ["a", "b", "c"]
    local.close()
