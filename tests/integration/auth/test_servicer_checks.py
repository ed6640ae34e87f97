"""The checks servicers make with the caller's identity, over the real running suite:

* Who did it: the committer of a commit, merge, revert or cherry-pick is the calling user
  (filled in when the request names none); naming someone else needs
  auth:CommitAsOtherUser (Admins), else PERMISSION_DENIED and nothing is committed.
* fs:ImportFromStorage: staging an address outside the repository's storage namespace
  (PutObject, PutObjects) needs it; inside the namespace fs:WriteObject is enough.
"""

from __future__ import annotations

import pytest

from quarry.auth.bootstrap import DEVELOPERS, SUPER_USERS
from quarry.auth.policy import document, storage_arn
from quarry.auth.store import IamStore
from quarry.kv.memory import MemoryStore
from quarry.v1 import (
    branch_manager_pb2,
    branch_manager_pb2_grpc,
    committer_pb2,
    committer_pb2_grpc,
    types_pb2,
)
from support.auth import FAST_HASH, TEST_ADMIN, bearer, put_as, raw_channel, refused, user_token
from support.suite import running_suite

REPO = "checked"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    backend = MemoryStore()
    with running_suite(tmp_path_factory.mktemp("checks"), backend=backend) as suite:
        iam = IamStore(backend, hash_cost=FAST_HASH)
        iam.create_user("dev")
        iam.add_group_member(DEVELOPERS, "dev")
        iam.create_user("super")
        iam.add_group_member(SUPER_USERS, "super")
        with (
            raw_channel(suite.targets["branch-manager"]) as bm_channel,
            raw_channel(suite.targets["committer"]) as cm_channel,
        ):
            bm = branch_manager_pb2_grpc.BranchManagerStub(bm_channel)
            cm = committer_pb2_grpc.CommitterStub(cm_channel)
            bm.CreateRepository(
                branch_manager_pb2.CreateRepositoryRequest(
                    name=REPO, storage_namespace=suite.namespace(REPO)
                ),
                metadata=bearer(user_token(TEST_ADMIN)),
            )
            yield suite, bm, cm


def put(bm, token: str, path: str, address: str):
    return put_as(bm, token, REPO, path, address)


def head(bm) -> str:
    return bm.GetBranch(
        branch_manager_pb2.GetBranchRequest(repository=REPO, name="main"),
        metadata=bearer(user_token(TEST_ADMIN)),
    ).branch.commit_id


def test_the_committer_is_the_caller_and_naming_someone_else_is_refused(world):
    suite, bm, cm = world
    dev = user_token("dev")
    put(bm, dev, "c/1", f"{suite.namespace(REPO)}/c/1")
    before = head(bm)
    error = refused(
        cm.Commit,
        committer_pb2.CommitRequest(repository=REPO, branch="main", message="m", committer="ceo"),
        metadata=bearer(dev),
    )
    assert (error.code.name, error.metadata["action"]) == (
        "PERMISSION_DENIED",
        "auth:CommitAsOtherUser",
    )
    assert error.metadata["resource"] == "arn:quarry:auth:::user/ceo"
    assert head(bm) == before  # nothing committed
    # The same call naming no one (or the caller) is recorded as the caller.
    commit = cm.Commit(
        committer_pb2.CommitRequest(repository=REPO, branch="main", message="m"),
        metadata=bearer(dev),
    ).commit
    assert commit.committer == "dev"
    put(bm, dev, "c/2", f"{suite.namespace(REPO)}/c/2")
    commit = cm.Commit(
        committer_pb2.CommitRequest(repository=REPO, branch="main", message="m", committer="dev"),
        metadata=bearer(dev),
    ).commit
    assert commit.committer == "dev"
    # Revert and cherry-pick follow the same rule.
    for call, request in (
        (cm.Revert, committer_pb2.RevertRequest),
        (cm.CherryPick, committer_pb2.CherryPickRequest),
    ):
        error = refused(
            call,
            request(repository=REPO, branch="main", ref=commit.id, committer="ceo"),
            metadata=bearer(dev),
        )
        assert error.metadata["action"] == "auth:CommitAsOtherUser"
    # Merge too.
    error = refused(
        cm.Merge,
        committer_pb2.MergeRequest(
            repository=REPO, source_ref="main", destination_branch="main", committer="ceo"
        ),
        metadata=bearer(dev),
    )
    assert error.metadata["action"] == "auth:CommitAsOtherUser"
    # An admin may record another name (an ETL job's, as before auth).
    put(bm, dev, "c/3", f"{suite.namespace(REPO)}/c/3")
    commit = cm.Commit(
        committer_pb2.CommitRequest(repository=REPO, branch="main", message="m", committer="etl"),
        metadata=bearer(user_token(TEST_ADMIN)),
    ).commit
    assert commit.committer == "etl"


def test_staging_outside_the_namespace_needs_import_from_storage(world):
    suite, bm, _ = world
    dev, superuser = user_token("dev"), user_token("super")
    inside = f"{suite.namespace(REPO)}/i/1"
    assert put(bm, dev, "i/1", inside).entry.physical_address == inside
    for outside in ("s3://elsewhere/i/2", f"{suite.namespace(REPO)}-sibling/i/2"):
        error = refused(put, bm, dev, "i/2", outside)
        assert (error.code.name, error.metadata["action"]) == (
            "PERMISSION_DENIED",
            "fs:ImportFromStorage",
        )
        assert error.metadata["resource"] == storage_arn(outside)  # where it points
    stat = refused(
        bm.StatObject,
        branch_manager_pb2.StatObjectRequest(repository=REPO, ref="main", path="i/2"),
        metadata=bearer(dev),
    )
    assert stat.code.name == "NOT_FOUND"  # nothing was staged
    # A stream with one outside address is refused for that message.
    messages = [
        branch_manager_pb2.PutObjectsRequest(
            repository=REPO,
            branch="main",
            entries=[types_pb2.Entry(path="i/3", physical_address="s3://elsewhere/i/3")],
        )
    ]
    error = refused(bm.PutObjects, iter(messages), metadata=bearer(dev))
    assert error.metadata["action"] == "fs:ImportFromStorage"
    # SuperUsers (fs:*) may import.
    assert put(bm, superuser, "i/2", "s3://elsewhere/i/2").entry.path == "i/2"


def test_an_allow_on_everything_with_one_denied_import_still_decides_each_address(world):
    """A user allowed every action everywhere skips working out where each address points
    (allowed whatever it is) — never while a Deny names fs:ImportFromStorage: then an address
    in the denied place is refused, in a PutObject and in a PutObjects stream, while an
    address inside the namespace and other places outside it are staged."""
    suite, bm, _ = world
    iam = IamStore(suite.backend, hash_cost=FAST_HASH)
    iam.create_user("importer")
    iam.add_group_member(SUPER_USERS, "importer")  # fs:* on "*"
    iam.create_policy(
        "NoImportOfLocked",
        document(
            {
                "Effect": "Deny",
                "Action": "fs:ImportFromStorage",
                "Resource": storage_arn("s3://elsewhere/locked/*"),
            }
        ),
    )
    iam.attach_user_policy("importer", "NoImportOfLocked")
    importer = user_token("importer")
    error = refused(put, bm, importer, "locked/a", "s3://elsewhere/locked/a")
    assert (error.code.name, error.metadata["resource"]) == (
        "PERMISSION_DENIED",
        storage_arn("s3://elsewhere/locked/a"),
    )
    messages = [
        branch_manager_pb2.PutObjectsRequest(
            repository=REPO,
            branch="main",
            entries=[
                types_pb2.Entry(path="free/b", physical_address="s3://elsewhere/free/b"),
                types_pb2.Entry(path="locked/b", physical_address="s3://elsewhere/locked/b"),
            ],
        )
    ]
    error = refused(bm.PutObjects, iter(messages), metadata=bearer(importer))
    assert error.metadata["resource"] == storage_arn("s3://elsewhere/locked/b")
    for path in ("locked/a", "free/b", "locked/b"):  # nothing of the refused stream staged
        stat = refused(
            bm.StatObject,
            branch_manager_pb2.StatObjectRequest(repository=REPO, ref="main", path=path),
            metadata=bearer(importer),
        )
        assert stat.code.name == "NOT_FOUND"
    inside = f"{suite.namespace(REPO)}/locked/c"
    assert put(bm, importer, "locked/c", inside).entry.physical_address == inside
    assert put(bm, importer, "free/d", "s3://elsewhere/free/d").entry.path == "free/d"


def test_a_dotted_address_never_passes_for_one_inside_the_namespace(world):
    """The attack: a Developer (no fs:ImportFromStorage) is refused `<other-ns>/secret.txt`,
    so stages `<own-ns>/../other/secret.txt`, which a prefix check took for an address
    inside the namespace, and commits it. Every spelling of the climb is refused before
    any check of where it points: INVALID_ARGUMENT, INVALID_PHYSICAL_ADDRESS, nothing
    staged, nothing committed."""
    suite, bm, _ = world
    dev = user_token("dev")
    ns = suite.namespace(REPO)
    other = suite.namespace("other-repo")
    with open(f"{other}/secret.txt", "wb") as fh:
        fh.write(b"secret")
    plain = refused(put, bm, dev, "s/plain", f"{other}/secret.txt")
    assert (plain.code.name, plain.metadata["action"]) == (
        "PERMISSION_DENIED",
        "fs:ImportFromStorage",
    )
    before = head(bm)
    for address in (
        f"{ns}/../other-repo/secret.txt",
        f"file://{ns}/../other-repo/secret.txt",
        f"file://{ns}/%2e%2e/other-repo/secret.txt",
        f"{ns}/data/./x",
        f"{ns}//data/x",
    ):
        error = refused(put, bm, dev, "s/dotted", address)
        assert (error.code.name, error.reason) == ("INVALID_ARGUMENT", "INVALID_PHYSICAL_ADDRESS")
        assert error.metadata["physical_address"] == address
        messages = [
            branch_manager_pb2.PutObjectsRequest(
                repository=REPO,
                branch="main",
                entries=[types_pb2.Entry(path="s/dotted", physical_address=address)],
            )
        ]
        error = refused(bm.PutObjects, iter(messages), metadata=bearer(dev))
        assert error.reason == "INVALID_PHYSICAL_ADDRESS"
    # Even an admin (who may import anything from anywhere) is refused, one object or a
    # stream: the address is not an object's own.
    admin = user_token(TEST_ADMIN)
    error = refused(put, bm, admin, "s/dotted", f"{ns}/../other-repo/secret.txt")
    assert error.reason == "INVALID_PHYSICAL_ADDRESS"
    messages = [
        branch_manager_pb2.PutObjectsRequest(
            repository=REPO,
            branch="main",
            entries=[
                types_pb2.Entry(path="s/dotted", physical_address=f"{ns}/../other-repo/secret.txt")
            ],
        )
    ]
    error = refused(bm.PutObjects, iter(messages), metadata=bearer(admin))
    assert error.reason == "INVALID_PHYSICAL_ADDRESS"
    stat = refused(
        bm.StatObject,
        branch_manager_pb2.StatObjectRequest(repository=REPO, ref="main", path="s/dotted"),
        metadata=bearer(dev),
    )
    assert stat.code.name == "NOT_FOUND"  # nothing was staged, so nothing to commit
    assert head(bm) == before
    # The object's own address in another notation is inside: fs:WriteObject is enough.
    assert put(bm, dev, "s/uri", f"file://{ns}/s/uri").entry.path == "s/uri"
