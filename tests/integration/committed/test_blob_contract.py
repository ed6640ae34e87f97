"""The BlobStore contract (quarry.testing.blob) against every store: the local directory,
S3 (a real S3 API: the session moto_server) and the counting wrapper (around a local
store)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from quarry.blob import CountingBlobStore, LocalBlobStore
from quarry.blob.s3 import S3BlobStore
from quarry.testing.blob import (
    BlobContract,
    S3BytesFetched,
    StoreKind,
    local_leftovers,
    s3_leftovers,
    thread_bytes_read,
)


@pytest.fixture(params=["local", "s3", "counting"])
def kind(tmp_path, request) -> Iterator[StoreKind]:
    if request.param == "local":
        yield StoreKind(
            "local",
            lambda ns: LocalBlobStore(tmp_path / ns),
            stream_piece=1 << 20,
            leftovers=local_leftovers(tmp_path),
            fetched=thread_bytes_read,
        )
    elif request.param == "counting":
        yield StoreKind(
            "counting",
            lambda ns: CountingBlobStore(LocalBlobStore(tmp_path / ns)),
            stream_piece=1 << 20,
            leftovers=local_leftovers(tmp_path),
            fetched=thread_bytes_read,  # what the local store under it read
        )
    else:
        bucket = request.getfixturevalue("s3_bucket")
        endpoint = request.getfixturevalue("moto_endpoint")
        root = f"contract-{uuid.uuid4().hex[:8]}"
        # moto_server lacks If-None-Match: concurrent if_absent puts are checked on real S3.
        fetched = S3BytesFetched()
        yield StoreKind(
            "s3",
            lambda ns: S3BlobStore(bucket, f"{root}/{ns}", endpoint_url=endpoint),
            atomic_if_absent=False,
            leftovers=s3_leftovers,
            fetched=fetched,
        )
        fetched.close()


class TestBlobContract(BlobContract):
    """`kind` is this module's fixture: local, s3 and counting."""
