"""The s3-gateway's ranged GetObject and UploadPartCopy read only the requested bytes from
the blob store: a seek in a local namespace, a ranged GET of an S3 namespace (moto_server).
The gateway's operations run in process over a real suite (gRPC over loopback) so the
stores they open can be counted (CountingBlobStore: bytes read) and, for S3, what S3 sent
(the Content-Length of each GetObject answer). The boto3 / AWS CLI twins of these ranges:
tests/e2e/test_s3_gateway.py::test_ranged_gets_suffix_open_ended_and_unsatisfiable."""

from __future__ import annotations

import hashlib
import os
import uuid

import pytest

import quarry.blob
from quarry.blob import (
    ChecksumMismatch,
    CountingBlobStore,
    ObjectChanged,
    object_address,
    open_blob_store,
)
from quarry.blob.s3 import S3BlobStore
from quarry.s3gateway import operations as ops
from quarry.s3gateway.errors import S3Error
from quarry.s3gateway.paths import resolve
from quarry.s3gateway.request import Request
from quarry.testing.blob import S3BytesFetched
from quarry.v1 import types_pb2
from support.suite import suite_fixture

suite = suite_fixture(fixture_options={"s3_endpoint_url": "moto_endpoint"})
SIZE = 16 * 1024 * 1024 + 3


@pytest.fixture(scope="module")
def data() -> bytes:
    return os.urandom(SIZE)


@pytest.fixture
def client(suite):
    with suite.client() as client:
        yield client


@pytest.fixture(params=["local", "s3"])
def lake(request, suite, client, data, monkeypatch):
    """(repository, what S3 sent so far or None): a repository whose namespace is a local
    directory or an S3 prefix, holding `data` at main/big.bin; every store the gateway
    opens from here on is counted (the list `request.node.opened`)."""
    name = f"r{uuid.uuid4().hex[:8]}"
    fetched = None
    if request.param == "local":
        namespace = suite.namespace(name)
    else:
        bucket = request.getfixturevalue("s3_bucket")
        namespace = f"s3://{bucket}/{name}"
        fetched = S3BytesFetched()
        fetched(S3BlobStore(bucket, endpoint_url=suite.settings.s3_endpoint_url))
    client.create_repository(name, namespace)
    with open_blob_store(namespace, suite.settings) as store:
        store.put("data/big", data)
    entry = types_pb2.Entry(
        path="big.bin",
        physical_address=object_address(namespace, "data/big"),
        size_bytes=len(data),
        checksum=hashlib.md5(data).hexdigest(),
    )
    client.put_object(name, "main", entry)
    opened: list[CountingBlobStore] = []
    real = quarry.blob.open_blob_store

    def counting(where: str, settings=None):
        store = CountingBlobStore(real(where, settings))
        opened.append(store)
        return store

    monkeypatch.setattr(quarry.blob, "open_blob_store", counting)
    request.node.opened = opened
    yield name, fetched
    if fetched is not None:
        fetched.close()


def _context(client, suite) -> ops.Context:
    return ops.Context(
        client=client,
        user_id="admin",
        settings=suite.settings,
        region="us-east-1",
        sealed_check=lambda chunks: None,
    )


def _request(method: str, bucket: str, key: str, headers: dict[str, str], query=()) -> Request:
    path = f"/{bucket}/{key}"
    return Request(
        method=method,
        raw_path=path,
        query=list(query),
        headers={k: [v] for k, v in headers.items()},
        target=resolve(path, "127.0.0.1", ""),
        request_id="TEST",
        read=lambda n: b"",
    )


def _get(ctx, repo: str, range_header: str) -> bytes:
    response = ops.get_object(ctx, _request("GET", repo, "main/big.bin", {"range": range_header}))
    try:
        return b"".join(response.body)
    finally:
        assert response.close is not None
        response.close()


def test_a_ranged_get_reads_only_the_range_from_the_store(request, lake, client, suite, data):
    repo, fetched = lake
    opened = request.node.opened
    ctx = _context(client, suite)
    cases = {
        "bytes=-100": data[-100:],  # the last bytes of a 16 MiB object
        f"bytes={SIZE - 5000}-": data[-5000:],
        f"bytes={SIZE - 10}-{SIZE + 100}": data[-10:],
        "bytes=8388608-8392703": data[8388608:8392704],
        "bytes=0-0": data[:1],
    }
    for header, expected in cases.items():
        opened.clear()
        before = fetched.total if fetched is not None else 0
        assert _get(ctx, repo, header) == expected, header
        assert sum(store.bytes_read for store in opened) == len(expected), header
        if fetched is not None:  # S3 sent the range, not the object
            assert fetched.total - before == len(expected), header
    with pytest.raises(S3Error) as unsatisfiable:
        _get(ctx, repo, f"bytes={SIZE}-")
    assert unsatisfiable.value.code == "InvalidRange" and unsatisfiable.value.status == 416


def test_upload_part_copy_reads_only_the_copied_range(request, lake, client, suite, data):
    repo, fetched = lake
    opened = request.node.opened
    ctx = _context(client, suite)
    created = ops.create_multipart_upload(
        ctx, _request("POST", repo, "main/copy.bin", {}, [("uploads", "")])
    )
    assert isinstance(created.body, bytes)
    upload_id = created.body.decode().split("<UploadId>")[1].split("</UploadId>")[0]
    opened.clear()
    before = fetched.total if fetched is not None else 0
    first, last = SIZE - 1000, SIZE - 1
    copied = ops.upload_part_copy(
        ctx,
        _request(
            "PUT",
            repo,
            "main/copy.bin",
            {
                "x-amz-copy-source": f"{repo}/main/big.bin",
                "x-amz-copy-source-range": f"bytes={first}-{last}",
            },
            [("partNumber", "1"), ("uploadId", upload_id)],
        ),
    )
    assert isinstance(copied.body, bytes)
    assert hashlib.md5(data[first:]).hexdigest() in copied.body.decode()
    # The source object (the one store opened by its address): its last 1000 bytes alone.
    assert sum(store.bytes_read for store in opened) == 1000
    if fetched is not None:
        # All S3 sent: the upload's record, the source's range and the part's own bytes
        # (moved from their temporary key): kilobytes, not the 16 MiB source.
        assert fetched.total - before < 10_000
    ops.abort_multipart_upload(
        ctx, _request("DELETE", repo, "main/copy.bin", {}, [("uploadId", upload_id)])
    )


def test_a_get_sends_the_entrys_object_or_fails(lake, client, suite, data, monkeypatch):
    """An entry of unknown size (0, no checksum) is sent whole, without a length (it was an
    empty body). An entry whose object has another size fails: a local file before any
    byte (500 InternalError), an S3 object as it is read — before the whole body went out."""
    repo, fetched = lake
    monkeypatch.undo()  # the stores as the gateway opens them (a counted one has no fileno)
    address = client.stat_object(repo, "main", "big.bin").physical_address
    for path, size in (("unknown.bin", 0), ("shorter.bin", SIZE - 1), ("longer.bin", SIZE + 1)):
        client.put_object(
            repo, "main", types_pb2.Entry(path=path, physical_address=address, size_bytes=size)
        )
    ctx = _context(client, suite)

    def get(path: str):
        return ops.get_object(ctx, _request("GET", repo, f"main/{path}", {}))

    whole = get("unknown.bin")
    assert b"".join(whole.body) == data
    # A local file's own size stands for it (s3cmd and rclone need one); HEAD says the same.
    length = dict(whole.headers).get("content-length")
    assert length == (str(len(data)) if fetched is None else None)
    whole.close()
    head = ops.head_object(ctx, _request("HEAD", repo, "main/unknown.bin", {}))
    assert dict(head.headers).get("content-length") == length
    # The listing says the same size (rclone compared a listed 0 with the bytes it got).
    listed = ops.list_objects(
        ctx, _request("GET", repo, "", {}, [("list-type", "2"), ("prefix", "main/unknown")])
    )
    assert f"<Size>{length or 0}</Size>".encode() in listed.body
    for path in ("shorter.bin", "longer.bin"):
        if fetched is None:  # local: the file's size is known before reading
            with pytest.raises(S3Error) as refused:
                get(path)
            assert (refused.value.code, refused.value.status) == ("InternalError", 500)
            continue
        response = get(path)
        sent = []
        with pytest.raises(ObjectChanged):
            for chunk in response.body:
                sent.append(chunk)
        response.close()
        assert sum(map(len, sent)) < SIZE - 1


def test_a_range_reaching_the_objects_end_is_checked_as_the_whole_object(
    lake, client, suite, data, monkeypatch
):
    """`aws s3 cp` fetches a large object's last part as a range, s3cmd and rclone resume a
    cut download with `Range: bytes=N-`: an object changed in place (same size, the entry's
    SHA-256 another) once came out whole and wrong. A range ending at the object's end is
    read from the start, hashed, its last chunk held: it fails, a middle range is served."""
    repo, fetched = lake
    monkeypatch.undo()
    namespace = client.get_repository(repo).storage_namespace
    altered = bytes(reversed(data))

    def stage_changed(path: str, stored: bytes, recorded: bytes) -> None:
        """`stored` in the namespace, staged as an entry recording `recorded`'s SHA-256."""
        with open_blob_store(namespace, suite.settings) as store:
            store.put(f"data/{path}", stored)
        client.put_object(
            repo,
            "main",
            types_pb2.Entry(
                path=path,
                physical_address=object_address(namespace, f"data/{path}"),
                size_bytes=len(recorded),
                checksum=hashlib.sha256(recorded).hexdigest(),
            ),
        )

    stage_changed("altered.bin", altered, data)
    ctx = _context(client, suite)
    for header in (f"bytes={SIZE - 100}-", f"bytes=0-{SIZE - 1}", "bytes=-5000"):
        response = ops.get_object(ctx, _request("GET", repo, "main/altered.bin", {"range": header}))
        sent = []
        with pytest.raises(ChecksumMismatch):
            for chunk in response.body:
                sent.append(chunk)
        response.close()
        assert sum(map(len, sent)) < int(dict(response.headers)["content-length"]), header
    middle = ops.get_object(ctx, _request("GET", repo, "main/altered.bin", {"range": "bytes=0-99"}))
    assert b"".join(middle.body) == altered[:100]
    middle.close()
    # A small object fails before the answer starts: a clear error, not a cut body.
    stage_changed("small.bin", b"other bytes", b"the bytes!!")
    with pytest.raises(S3Error) as refused:
        ops.get_object(ctx, _request("GET", repo, "main/small.bin", {}))
    assert refused.value.status == 500
    assert "retrying will not help" in refused.value.message  # not "try again"
    assert namespace not in refused.value.message  # the server's storage stays its own
