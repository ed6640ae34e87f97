"""Responses stay readable by default gRPC clients whatever the page_size (issue 10 item 5).

2,500 entries with ~8 KB of metadata each (20 MB) on real servers: ListObjects,
DiffUncommitted and Diff at page_size=10000 (more than there are: only the size cuts a
page), and Log over commits with 60 KB messages, read through a channel with gRPC's default
limits (4 MiB received). Every page is under Settings.max_response_bytes, and following
next_page_token returns every item exactly once, in order. The real grpcurl binary lists
page_size=1000 with its default limits.

The size is what cuts the pages: 20 MB is at least five of them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from quarry.config import Settings
from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import branch_manager_pb2_grpc, committer_pb2_grpc, types_pb2
from quarry.v1 import committer_pb2 as cm
from support.auth import admin_token_source, service_channel
from support.suite import running_suite

N = 2_500
GRPC_DEFAULT_RECEIVE_LIMIT = 4 * 1024 * 1024
LIMIT = Settings.max_response_bytes
GRPCURL = Path(sys.executable).parent / "grpcurl"
REPO = "big"


def path(i: int) -> str:
    return f"data/part-{i:05d}.parquet"


def entries(version: str):
    for i in range(N):
        yield types_pb2.Entry(
            path=path(i),
            physical_address=f"s3://lake/{version}/{i}",
            size_bytes=1000 + i,
            checksum=f"{version}-{i}",
            metadata={"blob": version[0] * 8000},
        )


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """main: N committed entries (commit `loaded`), then every one of them re-staged with
    other metadata (N uncommitted changes)."""
    home = tmp_path_factory.mktemp("limits")
    with running_suite(home) as suite:
        with suite.client(timeout=120) as client:
            client.create_repository(REPO, suite.namespace(REPO))
            initial = client.get_branch(REPO, "main").commit_id
            assert client.put_objects(REPO, "main", entries("first"), batch_size=500) == N
            loaded = client.commit(REPO, "main", "load").commit.id
            assert client.put_objects(REPO, "main", entries("second"), batch_size=500) == N
        # gRPC's defaults: what grpcurl and most clients use.
        channel = grpc.insecure_channel(suite.targets["branch-manager"])
        committer_channel = grpc.insecure_channel(suite.targets["committer"])
        try:
            yield (
                suite,
                branch_manager_pb2_grpc.BranchManagerStub(channel),
                committer_pb2_grpc.CommitterStub(committer_channel),
                initial,
                loaded,
            )
        finally:
            channel.close()
            committer_channel.close()


def follow(rpc, request, items_of):
    """Every page: (pages, items in order)."""
    pages, items = [], []
    while True:
        response = rpc(request, timeout=60)
        pages.append(response)
        items.extend(items_of(response))
        if not response.next_page_token:
            return pages, items
        request.page_token = response.next_page_token
        assert len(pages) <= N


def assert_pages_bounded(pages):
    # 20 MB cannot fit in fewer than 5 pages of 4 MB.
    assert N * 8000 >= 5 * LIMIT
    assert len(pages) >= 5
    for page in pages:
        assert 0 < page.ByteSize() <= LIMIT < GRPC_DEFAULT_RECEIVE_LIMIT


def test_list_objects_at_page_size_10000(loaded):
    _, stub, _, _, _ = loaded
    pages, items = follow(
        stub.ListObjects,
        bm.ListObjectsRequest(repository=REPO, ref="main", page_size=10_000),
        lambda r: r.entries,
    )
    assert_pages_bounded(pages)
    assert [e.path for e in items] == [path(i) for i in range(N)]
    assert {e.checksum for e in items} == {f"second-{i}" for i in range(N)}


def test_diff_uncommitted_at_page_size_10000(loaded):
    _, stub, _, _, _ = loaded
    pages, items = follow(
        stub.DiffUncommitted,
        bm.DiffUncommittedRequest(repository=REPO, branch="main", page_size=10_000),
        lambda r: r.changes,
    )
    assert_pages_bounded(pages)
    assert [c.path for c in items] == [path(i) for i in range(N)]
    assert {c.type for c in items} == {types_pb2.CHANGE_TYPE_CHANGED}


def test_diff_between_refs_at_page_size_10000(loaded):
    _, _, committer, initial, commit = loaded
    pages, items = follow(
        committer.Diff,
        cm.DiffRequest(repository=REPO, left_ref=initial, right_ref=commit, page_size=10_000),
        lambda r: r.changes,
    )
    assert_pages_bounded(pages)
    assert [c.path for c in items] == [path(i) for i in range(N)]
    assert {c.type for c in items} == {types_pb2.CHANGE_TYPE_ADDED}
    assert {c.entry.checksum for c in items} == {f"first-{i}" for i in range(N)}


def test_log_with_large_commit_messages(loaded):
    suite, _, committer, _, _ = loaded
    with suite.client(timeout=60) as client:
        client.create_branch(REPO, "history", "main")
        made = [
            client.commit(REPO, "history", f"{i:03d} " + "m" * 60_000, allow_empty=True).commit.id
            for i in range(80)
        ]
    pages, items = follow(
        committer.Log,
        cm.LogRequest(repository=REPO, ref="history", page_size=10_000),
        lambda r: r.commits,
    )
    assert len(pages) >= 2  # 80 × 60 KB = 4.8 MB
    for page in pages:
        assert 0 < page.ByteSize() <= LIMIT
    ids = [c.id for c in items]
    assert ids[:80] == made[::-1]
    assert len(ids) == len(set(ids)) == 82  # + the load and the initial commit


def test_grpcurl_lists_page_size_1000_with_its_default_limits(loaded):
    suite, _, _, _, _ = loaded
    if not GRPCURL.exists():
        pytest.fail(f"grpcurl not found at {GRPCURL}: run `make install`")
    seen: list[str] = []
    token = ""
    for _ in range(3):
        request = {"repository": REPO, "ref": "main", "page_size": 1000}
        if token:
            request["page_token"] = token
        result = subprocess.run(
            [
                str(GRPCURL),
                "-plaintext",
                "-format-error",
                "-H",
                f"authorization: Bearer {admin_token_source()()}",
                "-d",
                json.dumps(request),
                suite.targets["branch-manager"],
                "quarry.v1.BranchManager/ListObjects",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        page = json.loads(result.stdout)
        assert 0 < len(page["entries"]) < 1000  # 1,000 entries would be 8 MB
        seen.extend(e["path"] for e in page["entries"])
        token = page["next_page_token"]  # grpcurl prints the proto's field names
    assert seen == [path(i) for i in range(len(seen))]


def test_kv_scan_messages_are_cut_by_size():
    """ScanItems streams batch_size items per message, fewer when their size would pass
    max_response_bytes; the remote store still sees every item once, in order."""
    from quarry.kv.remote import RemoteStore
    from quarry.v1 import kv_pb2, kv_pb2_grpc
    from support.servers import kv_gateway

    partition = b"staging/scan-by-size"
    items = [(partition, f"k{i:03d}".encode(), bytes([i % 251]) * 1000) for i in range(60)]
    with kv_gateway(max_response_bytes=10_000) as (_server, target):
        store = RemoteStore(target)
        try:
            store.batch_set(items)
            assert [(i.key, i.value) for i in store.scan(partition)] == [
                (k, v) for _, k, v in items
            ]
        finally:
            store.close()
        channel = service_channel(target)
        try:
            messages = list(
                kv_pb2_grpc.KVGatewayStub(channel).ScanItems(
                    kv_pb2.ScanItemsRequest(partition_key=partition, batch_size=1000), timeout=10
                )
            )
        finally:
            channel.close()
    assert len(messages) >= 6  # 60 KB in messages of at most 10 KB
    assert all(m.items and m.ByteSize() <= 10_000 for m in messages)
    assert [i.key for m in messages for i in m.items] == [k for _, k, _ in items]
