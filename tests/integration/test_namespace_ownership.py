"""Storage namespaces are owned (docs/architecture.md §2, issue 10 items 2 and 3), through a real
branch-manager and range-writer over gRPC: namespaces are validated and normalized, a
repository never claims a namespace that is not empty or overlaps another repository's,
the ownership marker is written before the repository is visible, and the environment's
refusals are FAILED_PRECONDITION / STORAGE_UNREACHABLE naming the cause, never INTERNAL."""

from __future__ import annotations

import concurrent.futures
import json
import os
import uuid
from pathlib import Path

import grpc
import pytest

from quarry import errors
from quarry.blob import LocalBlobStore, namespaces_overlap, open_blob_store
from quarry.blob.ownership import (
    MARKER_KEY,
    NamespaceInUse,
    build_marker,
    parse_marker,
    write_marker,
)
from quarry.client import RetryPolicy
from support.processes import free_port
from support.suite import running_suite, suite_fixture

suite = suite_fixture()


@pytest.fixture
def client(suite):
    with suite.client(retry=RetryPolicy(budget=5.0), timeout=60) as c:
        yield c


def refused(code: grpc.StatusCode, reason: str, call, *args) -> errors.QuarryError:
    with pytest.raises(errors.QuarryError) as caught:
        call(*args)
    assert (caught.value.code, caught.value.reason) == (code, reason), caught.value
    return caught.value


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def name() -> str:
    return f"own-{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize(
    "namespace",
    [
        "/",
        "//",
        "/./",
        "file:///",
        "/a/../b",
        "/a/./b",
        "/a/b/..",
        "relative/dir",
        "./x",
        "/a\x00b",
        "/a\nb",
        "file://host/x",
        "file:///a/%00b",
        "s3://bucket",
        "s3://bucket/",
        "s3://Bad_Bucket/x",
        "s3://b/x",
        "s3://bucket/a/../b",
        "s3://bucket/x?versionId=1",
        "gs://bucket/x",
        "s3:///x",
    ],
)
def test_invalid_namespaces_are_invalid_argument_and_nothing_is_written(client, namespace):
    exc = refused(
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_NAMESPACE",
        client.create_repository,
        name(),
        namespace,
    )
    assert "namespace" in str(exc)
    assert not os.path.exists("/" + MARKER_KEY)


def test_namespaces_are_normalized(client, tmp_path):
    repo = client.create_repository(name(), f"file://{tmp_path}//one/")
    assert repo.storage_namespace == f"file://{tmp_path}/one"
    repo = client.create_repository(name(), f"{tmp_path}//two///")
    assert repo.storage_namespace == f"{tmp_path}/two"
    assert (tmp_path / "two" / MARKER_KEY).is_file()  # a missing directory is created


def test_marker_names_the_repository_instance_and_installation(client, tmp_path):
    first = client.create_repository(name(), str(tmp_path / "a"))
    second = client.create_repository(name(), str(tmp_path / "b"))
    markers = [json.loads((tmp_path / d / MARKER_KEY).read_text()) for d in ("a", "b")]
    assert markers[0]["repository"] == first.name
    assert markers[0]["instance_id"] == first.instance_id and len(first.instance_id) == 32
    assert markers[1]["instance_id"] == second.instance_id != first.instance_id
    assert markers[0]["installation_id"] == markers[1]["installation_id"]
    assert markers[0]["format_version"] >= 1 and markers[0]["created"]
    assert parse_marker((tmp_path / "a" / MARKER_KEY).read_bytes()).owns(
        first.name, first.instance_id
    )


def test_a_namespace_equal_to_inside_or_containing_another_is_in_use(client, tmp_path):
    owner = client.create_repository(name(), str(tmp_path / "lake" / "owner"))
    before = tree(tmp_path)
    for namespace in (
        f"{tmp_path}/lake/owner",
        f"{tmp_path}/lake/owner/",
        f"file://{tmp_path}/lake//owner",
        f"{tmp_path}/lake/owner/inside",
        f"{tmp_path}/lake",
        str(tmp_path),
    ):
        exc = refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            "NAMESPACE_IN_USE",
            client.create_repository,
            name(),
            namespace,
        )
        assert exc.metadata["other_repository"] == owner.name
        assert owner.name in str(exc) and isinstance(exc, NamespaceInUse)
    assert tree(tmp_path) == before  # not even a marker was written
    # A sibling whose name merely starts the same is another namespace.
    client.create_repository(name(), f"{tmp_path}/lake/owner-two")


def test_a_non_empty_namespace_is_refused_and_left_untouched(client, tmp_path):
    lake = tmp_path / "data" / "x"
    (lake / "home" / "user").mkdir(parents=True)
    (lake / "app.conf").write_text("port=1")
    (lake / "home" / "user" / "thesis.tex").write_text("\\chapter{One}")
    before = tree(tmp_path)
    repository = name()
    exc = refused(
        grpc.StatusCode.FAILED_PRECONDITION,
        "NAMESPACE_NOT_EMPTY",
        client.create_repository,
        repository,
        str(lake),
    )
    # Not named to the caller: a create must not list another directory's files.
    assert "example_key" not in exc.metadata
    assert "app.conf" not in exc.message and "thesis" not in exc.message
    assert tree(tmp_path) == before
    assert not (lake / "_quarry").exists()
    refused(grpc.StatusCode.NOT_FOUND, "REPOSITORY_NOT_FOUND", client.get_repository, repository)


def test_a_deleted_repositorys_namespace_may_be_reused_unless_foreign_files_arrived(
    client, tmp_path
):
    namespace = str(tmp_path / "reuse")
    old = client.create_repository(name(), namespace)
    client.put_object(old.name, "main", path="a", physical_address="s3://b/a", size_bytes=1)
    client.commit(old.name, "main", "one")
    # Live: in use, under any name.
    refused(
        grpc.StatusCode.FAILED_PRECONDITION,
        "NAMESPACE_IN_USE",
        client.create_repository,
        name(),
        namespace,
    )
    client.delete_repository(old.name)
    new = client.create_repository(old.name, namespace)  # Quarry's own files are fine
    marker = parse_marker((tmp_path / "reuse" / MARKER_KEY).read_bytes())
    assert marker.owns(new.name, new.instance_id) and new.instance_id != old.instance_id

    client.delete_repository(new.name)
    (tmp_path / "reuse" / "notes.txt").write_text("mine")
    exc = refused(
        grpc.StatusCode.FAILED_PRECONDITION,
        "NAMESPACE_NOT_EMPTY",
        client.create_repository,
        name(),
        namespace,
    )
    assert exc.metadata["example_key"] == "notes.txt"
    assert parse_marker((tmp_path / "reuse" / MARKER_KEY).read_bytes()) == marker


def test_a_marker_of_another_installation_or_an_unfinished_creation_is_not_reused(client, tmp_path):
    foreign = tmp_path / "foreign"
    with LocalBlobStore(foreign) as store:
        write_marker(store, build_marker("theirs", uuid.uuid4().hex, "other-installation"))
    exc = refused(
        grpc.StatusCode.FAILED_PRECONDITION,
        "NAMESPACE_NOT_EMPTY",
        client.create_repository,
        name(),
        str(foreign),
    )
    assert "another Quarry installation" in str(exc)

    # Same installation, but no record says that instance is gone (it may be being
    # created right now): in use.
    ours = json.loads(
        (
            Path(
                client.get_repository(
                    client.create_repository(name(), str(tmp_path / "probe")).name
                ).storage_namespace
            )
            / MARKER_KEY
        ).read_text()
    )["installation_id"]
    pending = tmp_path / "pending"
    with LocalBlobStore(pending) as store:
        write_marker(store, build_marker("ghost", uuid.uuid4().hex, ours))
    exc = refused(
        grpc.StatusCode.FAILED_PRECONDITION,
        "NAMESPACE_IN_USE",
        client.create_repository,
        name(),
        str(pending),
    )
    assert exc.metadata["other_repository"] == "ghost"


def test_concurrent_creations_in_one_namespace_exactly_one_wins(suite, tmp_path):
    def create(repository: str, namespace: str):
        with suite.client(timeout=60) as c:
            try:
                return c.create_repository(repository, namespace)
            except errors.QuarryError as exc:
                return exc

    for round_ in range(3):
        namespace = str(tmp_path / f"race-{round_}")
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            outcomes = list(pool.map(create, [name() for _ in range(6)], [namespace] * 6))
        won = [o for o in outcomes if not isinstance(o, Exception)]
        lost = [o for o in outcomes if isinstance(o, Exception)]
        assert len(won) == 1, outcomes
        assert {(e.code, e.reason) for e in lost} == {
            (grpc.StatusCode.FAILED_PRECONDITION, "NAMESPACE_IN_USE")
        }, lost
        assert parse_marker((Path(namespace) / MARKER_KEY).read_bytes()).owns(
            won[0].name, won[0].instance_id
        )

    # Reuse of a deleted repository's namespace, raced: exactly one wins too.
    with suite.client(timeout=60) as c:
        c.delete_repository(won[0].name)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(create, [name() for _ in range(6)], [namespace] * 6))
    won = [o for o in outcomes if not isinstance(o, Exception)]
    assert len(won) == 1, outcomes
    assert parse_marker((Path(namespace) / MARKER_KEY).read_bytes()).owns(
        won[0].name, won[0].instance_id
    )


def test_concurrent_creations_of_nested_namespaces_never_both_succeed(suite, tmp_path):
    def create(repository: str, namespace: str):
        with suite.client(timeout=60) as c:
            try:
                return c.create_repository(repository, namespace)
            except errors.QuarryError as exc:
                return exc

    for round_ in range(4):
        base = tmp_path / f"nest-{round_}"
        free = f"{tmp_path}/free-{round_}"  # overlaps none of the others
        namespaces = [
            str(base),
            f"{base}/a",
            f"{base}/a/b",
            str(base),
            f"{base}/a",
            f"{base}/c/d",
            free,
        ]
        with concurrent.futures.ThreadPoolExecutor(len(namespaces)) as pool:
            outcomes = list(pool.map(create, [name() for _ in namespaces], namespaces))
        won = [o for o in outcomes if not isinstance(o, Exception)]
        lost = [o for o in outcomes if isinstance(o, Exception)]
        assert {(e.code, e.reason) for e in lost} <= {
            (grpc.StatusCode.FAILED_PRECONDITION, "NAMESPACE_IN_USE"),
            (grpc.StatusCode.FAILED_PRECONDITION, "NAMESPACE_NOT_EMPTY"),
        }, lost
        # Refusals are for overlaps only (two racing overlaps may both be refused: safe,
        # and a retry settles it).
        assert free in [r.storage_namespace for r in won], outcomes
        for i, one in enumerate(won):
            for other in won[i + 1 :]:
                assert not namespaces_overlap(one.storage_namespace, other.storage_namespace), (
                    one,
                    other,
                )


# ---- the environment's refusals: STORAGE_UNREACHABLE, never INTERNAL -----------------------


def test_unusable_local_directories_are_storage_unreachable(client, tmp_path):
    exc = refused(
        grpc.StatusCode.FAILED_PRECONDITION,
        "STORAGE_UNREACHABLE",
        client.create_repository,
        name(),
        "/proc/quarry-x",
    )
    assert exc.metadata["cause"] == "the directory cannot be created"
    assert "/proc/quarry-x" in str(exc)
    # sysfs refuses new directories even to root (EPERM): permission denied.
    exc = refused(
        grpc.StatusCode.FAILED_PRECONDITION,
        "STORAGE_UNREACHABLE",
        client.create_repository,
        name(),
        "/sys/quarry-x",
    )
    assert exc.metadata["cause"] == "permission denied"
    (tmp_path / "a-file").write_text("not a directory")
    exc = refused(
        grpc.StatusCode.FAILED_PRECONDITION,
        "STORAGE_UNREACHABLE",
        client.create_repository,
        name(),
        f"{tmp_path}/a-file/ns",
    )
    assert exc.metadata["cause"] == "a file is where a directory is expected"
    exc = refused(
        grpc.StatusCode.FAILED_PRECONDITION,
        "NAMESPACE_NOT_EMPTY",
        client.create_repository,
        name(),
        str(tmp_path),
    )  # holds a-file


def s3_suite(tmp_path, endpoint: str, region: str = "us-east-1"):
    # A region of its own per test: the S3 client (and its credentials) is cached per
    # (endpoint, region), so each environment gets a fresh one.
    return running_suite(tmp_path, s3_endpoint_url=endpoint, s3_region=region)


def test_s3_no_such_bucket_is_storage_unreachable(tmp_path, moto_endpoint, s3_bucket):
    with s3_suite(tmp_path, moto_endpoint) as suite, suite.client(timeout=60) as client:
        exc = refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            "STORAGE_UNREACHABLE",
            client.create_repository,
            name(),
            "s3://no-such-bucket-q/x",
        )
        assert exc.metadata["cause"] == "no such bucket"
        assert "no-such-bucket-q" in str(exc)
        # The same suite works on a bucket that exists, with the same ownership rules.
        namespace = f"s3://{s3_bucket}/lake/ok"
        first = client.create_repository(name(), namespace + "/")
        assert first.storage_namespace == namespace
        refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            "NAMESPACE_IN_USE",
            client.create_repository,
            name(),
            f"s3://{s3_bucket}/lake",
        )
        client.delete_repository(first.name)
        second = client.create_repository(name(), namespace)  # S3's If-Match replace
        with open_blob_store(namespace, suite.settings) as store:
            assert parse_marker(store.get(MARKER_KEY)).owns(second.name, second.instance_id)
            store.put("lake-notes.txt", b"mine")
        client.delete_repository(second.name)
        exc = refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            "NAMESPACE_NOT_EMPTY",
            client.create_repository,
            name(),
            namespace,
        )
        assert exc.metadata["example_key"] == "lake-notes.txt"


def test_s3_without_credentials_is_storage_unreachable(
    tmp_path, moto_endpoint, s3_bucket, monkeypatch
):
    for var in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with (
        s3_suite(tmp_path, moto_endpoint, "eu-west-3") as suite,
        suite.client(timeout=60) as client,
    ):
        exc = refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            "STORAGE_UNREACHABLE",
            client.create_repository,
            name(),
            f"s3://{s3_bucket}/no-creds",
        )
        assert exc.metadata["cause"] == "no credentials"


def test_s3_bad_credentials_are_storage_unreachable(
    tmp_path, monkeypatch, moto_endpoint_checking_credentials
):
    with (
        s3_suite(tmp_path, moto_endpoint_checking_credentials, "ap-south-2") as suite,
        suite.client(timeout=60) as client,
    ):
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        exc = refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            "STORAGE_UNREACHABLE",
            client.create_repository,
            name(),
            "s3://some-bucket/x",
        )
        assert exc.metadata["cause"].startswith(("invalid credentials", "access denied"))


def test_s3_endpoint_unreachable_is_storage_unreachable(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with (
        s3_suite(tmp_path, f"http://127.0.0.1:{free_port()}", "sa-east-1") as suite,
        suite.client(timeout=120) as client,
    ):
        exc = refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            "STORAGE_UNREACHABLE",
            client.create_repository,
            name(),
            "s3://bucket/x",
        )
        assert exc.metadata["cause"] == "endpoint unreachable"
