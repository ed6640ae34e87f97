"""Namespace normalization and overlap (quarry.blob.namespace), and the ownership marker's
round trip (quarry.blob.ownership): the pure parts, without a server."""

from __future__ import annotations

import pytest

from quarry.blob import (
    InvalidStorageNamespace,
    LocalBlobStore,
    namespaces_overlap,
    normalize_storage_namespace,
)
from quarry.blob.namespace import canonical_storage_namespace
from quarry.blob.ownership import (
    MARKER_KEY,
    InvalidMarker,
    build_marker,
    claim_namespace,
    parse_marker,
    read_marker,
    write_marker,
)


@pytest.mark.parametrize(
    "given, normalized",
    [
        ("/data/lake", "/data/lake"),
        ("/data//lake///", "/data/lake"),
        ("  /data/lake  ", "/data/lake"),
        ("file:///data//lake/", "file:///data/lake"),
        ("file://localhost/data/lake", "file:///data/lake"),
        ("file:/data/lake", "file:///data/lake"),
        ("file:///data/with%20space", "file:///data/with space"),
        ("s3://my-bucket/lake//demo/", "s3://my-bucket/lake/demo"),
        ("s3://my.bucket.1/p", "s3://my.bucket.1/p"),
    ],
)
def test_normalized(given, normalized):
    assert normalize_storage_namespace(given) == normalized


@pytest.mark.parametrize(
    "namespace",
    [
        "",
        " ",
        "/",
        "///",
        "file:///",
        "file://",
        "s3://bucket",
        "s3://bucket//",
        "/a/../b",
        "/a/./b",
        "/..",
        "relative",
        "~/lake",
        "/a\x00b",
        "/a\tb",
        "/a\x7fb",
        "file:///a/%00b",
        "file:///a/%2e%2e/b",
        "file://host/a",
        "file:///a?x=1",
        "s3://",
        "s3:///x",
        "s3://UPPER/x",
        "s3://ab/x",
        "s3://" + "b" * 64 + "/x",
        "s3://-bucket/x",
        "s3://bucket-/x",
        "s3://a..b/x",
        "s3://192.168.1.1/x",
        "s3://bucket/x?y",
        "s3://bucket/x#y",
        "s3://bucket/../x",
        "http://host/x",
        "gs://bucket/x",
        "C:\\lake",
    ],
)
def test_invalid(namespace):
    with pytest.raises(InvalidStorageNamespace) as caught:
        normalize_storage_namespace(namespace)
    assert caught.value.reason == "INVALID_NAMESPACE"


@pytest.mark.parametrize(
    "a, b, overlap",
    [
        ("/lake/a", "/lake/a", True),
        ("/lake/a", "file:///lake//a/", True),
        ("/lake/a", "/lake/a/b", True),
        ("/lake/a/b", "/lake", True),
        ("/lake/a", "/lake/ab", False),
        ("/lake/a", "/lake/b", False),
        ("s3://bucket/a", "s3://bucket/a/b", True),
        ("s3://bucket/a", "s3://bucket/ab", False),
        ("s3://bucket/a", "s3://other/a", False),
        ("/bucket/a", "s3://bucket/a", False),
    ],
)
def test_overlap(a, b, overlap):
    assert namespaces_overlap(a, b) is overlap
    assert namespaces_overlap(b, a) is overlap


def test_local_namespaces_overlap_by_their_real_paths(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    assert namespaces_overlap(f"{tmp_path}/link/sub", f"{tmp_path}/a")
    assert namespaces_overlap(f"{tmp_path}/a", f"file://{tmp_path}/link")
    assert not namespaces_overlap(f"{tmp_path}/link-2/sub", f"{tmp_path}/a")
    assert canonical_storage_namespace(f"{tmp_path}/link/sub/") == f"{tmp_path}/a/sub"
    assert canonical_storage_namespace("s3://bucket/x//y/") == "s3://bucket/x/y"
    (tmp_path / "root").symlink_to("/")
    with pytest.raises(InvalidStorageNamespace):
        canonical_storage_namespace(f"{tmp_path}/root")


def test_marker_round_trip_and_rejects():
    marker = build_marker("lake", "i" * 32, "inst")
    assert parse_marker(marker.to_bytes()) == marker
    assert marker.owns("lake", "i" * 32) and not marker.owns("lake", "j" * 32)
    for bad in (
        b"",
        b"garbage",
        b"[]",
        b'{"repository": "x"}',
        b'{"repository": "", "instance_id": "i", "installation_id": "j", "format_version": 1}',
    ):
        with pytest.raises(InvalidMarker):
            parse_marker(bad)


def test_claim_writes_only_into_an_empty_namespace(tmp_path):
    with LocalBlobStore(tmp_path / "ns", durable=False) as store:
        assert claim_namespace(store, b"one").claimed
        assert not write_marker(store, build_marker("x", "y", "z"))  # never overwrites
        assert read_marker(store) == b"one"
    busy = tmp_path / "busy"
    (busy / ".hidden").mkdir(parents=True)
    (busy / ".hidden" / "x").write_text("x")
    with LocalBlobStore(busy, durable=False) as store:
        claim = claim_namespace(store, b"one")
        assert not claim.claimed and claim.keys == (".hidden/x",)
        assert read_marker(store) is None and not (busy / MARKER_KEY).exists()


def test_a_link_to_a_directory_makes_a_namespace_non_empty(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "ns").mkdir()
    (tmp_path / "ns" / "link").symlink_to(tmp_path / "elsewhere")
    with LocalBlobStore(tmp_path / "ns", durable=False) as store:
        claim = claim_namespace(store, b"one")
    assert not claim.claimed and claim.keys == ("link",)
