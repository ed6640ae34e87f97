"""Physical addresses, decided in one place (quarry.blob.layout): refused when a segment is
`..`, `.` or empty (also percent-encoded), located the way a reader opens them, and, for
garbage collection, every key of a namespace an address may name."""

from __future__ import annotations

import pytest

from quarry.blob import (
    InvalidPhysicalAddress,
    ObjectNotFound,
    address_location,
    check_physical_address,
    read_object,
)
from quarry.blob.layout import Location, inside_namespace, referenced_keys


@pytest.mark.parametrize(
    "address",
    [
        "",  # an entry that records no address
        "/lake/ns/data/x",
        "/lake/ns/.hidden/x",
        "/lake/ns/x..y",
        "file:///lake/ns/x",
        "file://localhost/lake/ns/x",
        "file:/lake/ns/x",
        "file:///lake/with%20space",
        "s3://bucket/ns/x",
        "s3://bucket/50%off",
        "s3://a",
        "x",
        "relative/path",
        "x:1",
    ],
)
def test_plain_addresses_pass_unchanged(address):
    assert check_physical_address(address) == address


@pytest.mark.parametrize(
    "address, segment",
    [
        ("/lake/repa/../repb/secret.txt", ".."),
        ("/lake/repa/./x", "."),
        ("/lake/repa//x", "an empty segment"),
        ("/lake/repa/x/", "an empty segment"),
        ("//lake/x", "an empty segment"),
        ("file:///lake/repa/../repb/x", ".."),
        ("file:////lake/x", "an empty segment"),
        ("file:///lake/repa/%2e%2e/repb/x", ".."),
        ("file:///lake/repa/%2E%2E/repb/x", ".."),
        ("/lake/repa/%252e%252e/repb/x", ".."),  # encoded twice
        ("/lake/repa/..%2frepb/x", ".."),
        ("s3://bucket/repa/../repb/x", ".."),
        ("s3://bucket/repa//x", "an empty segment"),
        ("s3://bucket/repa/a%2F%2Fb", "an empty segment"),
        ("s3:///x", "an empty segment"),
        ("data/sub/../x", ".."),
        ("./x", "."),
        ("file://", "an empty segment"),
        ("/lake/a\x00b", "NUL"),
    ],
)
def test_dot_and_empty_segments_are_refused(address, segment):
    with pytest.raises(InvalidPhysicalAddress) as caught:
        check_physical_address(address, "t/x")
    assert caught.value.reason == "INVALID_PHYSICAL_ADDRESS"
    assert caught.value.code.name == "INVALID_ARGUMENT"
    assert caught.value.metadata["segment"] == segment
    assert caught.value.metadata["path"] == "t/x"
    with pytest.raises(InvalidPhysicalAddress):
        address_location(address)


@pytest.mark.parametrize(
    "address, location",
    [
        ("/lake/ns/x", Location("local", "/lake/ns/x")),
        ("file:///lake/ns/x", Location("local", "/lake/ns/x")),
        ("file://localhost/lake/ns/x", Location("local", "/lake/ns/x")),
        ("file:/lake/ns/x", Location("local", "/lake/ns/x")),
        ("file:///lake/with%20space", Location("local", "/lake/with space")),
        ("/lake/with%20space", Location("local", "/lake/with%20space")),  # a plain path
        ("s3://bucket/ns/x", Location("s3", "bucket/ns/x")),
        ("s3a://bucket/ns/x", Location("s3", "bucket/ns/x")),
        ("s3://bucket", None),
        ("file://host/lake/x", None),
        ("x", None),
        ("http://host/x", None),
    ],
)
def test_the_location_a_reader_opens(address, location):
    assert address_location(address) == location


@pytest.mark.parametrize(
    "address, inside",
    [
        ("/lake/ns/x", True),
        ("/lake/ns", True),
        ("file:///lake/ns/deep/x", True),
        ("file://localhost/lake/ns/x", True),
        ("/lake/ns-sibling/x", False),
        ("/lake/other/x", False),
        ("s3://bucket/lake/ns/x", False),
        ("x", False),
    ],
)
def test_inside_a_local_namespace(address, inside):
    assert inside_namespace(address, "/lake/ns") is inside
    assert inside_namespace(address, "file:///lake/ns/") is inside


def test_the_namespace_check_refuses_what_could_climb_out():
    """The lexical prefix check of old said `<ns>/../other/x` is inside `<ns>`."""
    for address in ("/lake/ns/../other/x", "file:///lake/ns/%2e%2e/other/x"):
        with pytest.raises(InvalidPhysicalAddress):
            inside_namespace(address, "/lake/ns")


def test_inside_an_s3_namespace():
    assert inside_namespace("s3://bucket/lake/x", "s3://bucket/lake")
    assert inside_namespace("s3a://bucket/lake/x", "s3://bucket/lake")
    assert not inside_namespace("s3://bucket/lakehouse/x", "s3://bucket/lake")
    assert not inside_namespace("s3://other/lake/x", "s3://bucket/lake")
    with pytest.raises(InvalidPhysicalAddress):
        inside_namespace("s3://bucket/lake/../secret", "s3://bucket/lake")


UUID = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    "address",
    [
        f"/lake/ns/data/{UUID}",
        f"/lake/ns/data/sub/../{UUID}",
        f"/lake/ns//data/./{UUID}",
        f"file://localhost/lake/ns//./data/{UUID}",
        f"file:/lake/ns/data/{UUID}",
        f"file:///lake/ns/data/sub/%2e%2e/{UUID}",
        f"//lake/ns/data/{UUID}",
        f"/lake/other/../ns/data/{UUID}",
    ],
)
def test_gc_keeps_the_key_every_local_reading_reaches(address):
    assert f"data/{UUID}" in referenced_keys("/lake/ns", address)
    assert f"data/{UUID}" in referenced_keys("file:///lake/ns", address)


@pytest.mark.parametrize(
    "address",
    [
        f"s3://bucket/ns/data/{UUID}",
        f"s3a://bucket/ns/data/sub/../{UUID}",
        f"s3n://bucket/ns/data//{UUID}",
    ],
)
def test_gc_keeps_the_key_every_s3_reading_reaches(address):
    keys = referenced_keys("s3://bucket/ns", address)
    assert f"data/{UUID}" in keys
    # S3 itself keeps a key's text as it is: the literal key is kept too.
    literal = address.split("/ns/", 1)[1]
    assert literal in keys


@pytest.mark.parametrize(
    "address",
    [
        f"/lake/ns/../other/data/{UUID}",
        f"/lake/ns-sibling/data/{UUID}",
        f"s3://bucket/ns/data/{UUID}",
        "x",
        "",
    ],
)
def test_addresses_outside_the_namespace_name_none_of_its_keys(address):
    assert f"data/{UUID}" not in referenced_keys("/lake/ns", address)


def test_a_read_refuses_what_a_stage_refuses(tmp_path):
    (tmp_path / "repb").mkdir()
    (tmp_path / "repb" / "secret.txt").write_bytes(b"secret")
    (tmp_path / "repa").mkdir()
    with pytest.raises(InvalidPhysicalAddress):
        read_object(f"{tmp_path}/repa/../repb/secret.txt")
    with pytest.raises(InvalidPhysicalAddress):
        read_object(f"file://{tmp_path}/repa/%2e%2e/repb/secret.txt")
    assert read_object(f"{tmp_path}/repb/secret.txt") == b"secret"
    with pytest.raises(ObjectNotFound):
        read_object(f"{tmp_path}/repa/missing")
