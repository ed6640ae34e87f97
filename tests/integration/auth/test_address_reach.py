"""Where an entry may point (quarry.graveler.reach), over a real running suite with auth on.

The attack this guards against: a user allowed to stage addresses outside the namespace
(fs:ImportFromStorage: every SuperUser, any `fs:*` grant) staged `$QUARRY_HOME/signing.key`
(or imported `$QUARRY_HOME`) and read it back through the S3 gateway, then forged a service
token. Now, for every caller, admins included:
* nothing points into Quarry's home, nor into another repository's namespace;
* a local file outside the repository's namespace only below QUARRY_IMPORT_LOCAL_PREFIXES;
* a local address is judged by its real path (a link in the namespace pointing out);
and fs:ImportFromStorage is decided on the place the address points at
(`arn:quarry:fs:::storage/<address>`), so it can be scoped.
"""

from __future__ import annotations

import os

import grpc
import pytest

from quarry.auth.bootstrap import DEVELOPERS
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

REPO, OTHER = "reach", "neighbour"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("reach")
    allowed = root / "allowed"
    (allowed / "dims").mkdir(parents=True)
    (allowed / "dims" / "a.csv").write_bytes(b"a")
    (root / "forbidden").mkdir()
    (root / "forbidden" / "b.csv").write_bytes(b"b")
    backend = MemoryStore()
    home = root / "home"
    home.mkdir()
    # Home lies below an allowed directory too: it stays out of reach all the same.
    prefixes = f"{allowed},{root / 'home'}"
    with running_suite(home, backend=backend, import_local_prefixes=prefixes) as suite:
        iam = IamStore(backend, hash_cost=FAST_HASH)
        iam.create_user("dev")
        iam.add_group_member(DEVELOPERS, "dev")
        with (
            raw_channel(suite.targets["branch-manager"]) as bm_channel,
            raw_channel(suite.targets["committer"]) as cm_channel,
        ):
            bm = branch_manager_pb2_grpc.BranchManagerStub(bm_channel)
            cm = committer_pb2_grpc.CommitterStub(cm_channel)
            for name, namespace in ((REPO, root / "lake" / REPO), (OTHER, root / OTHER)):
                bm.CreateRepository(
                    branch_manager_pb2.CreateRepositoryRequest(
                        name=name, storage_namespace=str(namespace)
                    ),
                    metadata=bearer(user_token(TEST_ADMIN)),
                )
            yield root, home, iam, bm, cm


def put(bm, token: str, path: str, address: str):
    return put_as(bm, token, REPO, path, address)


def put_many(bm, token: str, addresses: list[str]):
    entries = [
        types_pb2.Entry(path=f"many/{i}", physical_address=a, size_bytes=1)
        for i, a in enumerate(addresses)
    ]
    request = branch_manager_pb2.PutObjectsRequest(repository=REPO, branch="main", entries=entries)
    return bm.PutObjects(iter([request]), metadata=bearer(token), timeout=20)


def staged(bm, path: str) -> bool:
    try:
        bm.StatObject(
            branch_manager_pb2.StatObjectRequest(repository=REPO, ref="main", path=path),
            metadata=bearer(user_token(TEST_ADMIN)),
        )
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.NOT_FOUND
        return False
    return True


def test_nothing_points_into_quarrys_home_not_even_for_an_admin(world):
    root, home, _, bm, _ = world
    admin = user_token(TEST_ADMIN)
    signing_key = home / "signing.key"
    signing_key.write_text("x" * 40)  # the suite takes its key from settings; the file is bait
    (home / "cache").mkdir(exist_ok=True)
    cached = home / "cache" / "range.parquet"
    cached.write_bytes(b"a cached range")
    for address in (str(signing_key), f"file://{signing_key}", str(home / "kv.db"), str(cached)):
        error = refused(put, bm, admin, "loot/key", address)
        assert (error.code.name, error.reason) == ("PERMISSION_DENIED", "ADDRESS_NOT_ALLOWED")
    error = refused(
        put_many, bm, admin, [str(root / "allowed" / "dims" / "a.csv"), str(signing_key)]
    )
    assert error.reason == "ADDRESS_NOT_ALLOWED"
    assert not staged(bm, "loot/key") and not staged(bm, "many/0")  # the stream: none of it


def test_a_local_file_outside_the_namespace_only_below_an_allowed_directory(world):
    root, _, _, bm, _ = world
    admin = user_token(TEST_ADMIN)
    allowed = root / "allowed" / "dims" / "a.csv"
    assert put(bm, admin, "dims/a.csv", str(allowed)).entry.physical_address == str(allowed)
    for address in (str(root / "forbidden" / "b.csv"), "/etc/passwd"):
        error = refused(put, bm, admin, "dims/b.csv", address)
        assert (error.code.name, error.reason) == ("PERMISSION_DENIED", "ADDRESS_NOT_ALLOWED")
        assert "QUARRY_IMPORT_LOCAL_PREFIXES" in error.message
    assert not staged(bm, "dims/b.csv")


def test_a_link_is_judged_by_where_it_leads(world):
    """A link inside the namespace (or inside an allowed directory) to a file outside both
    is outside: a Developer (no fs:ImportFromStorage) is refused it as an import, and even
    an admin may not stage it."""
    root, home, _, bm, _ = world
    namespace = root / "lake" / REPO
    (namespace / "links").mkdir(parents=True, exist_ok=True)
    os.symlink(home, namespace / "links" / "home")
    os.symlink(root / "forbidden" / "b.csv", namespace / "links" / "b.csv")
    os.symlink(root / "forbidden", root / "allowed" / "escape")
    dev, admin = user_token("dev"), user_token(TEST_ADMIN)
    through_dir = str(namespace / "links" / "home" / "signing.key")
    error = refused(put, bm, dev, "l/1", through_dir)
    assert (error.reason, error.metadata["action"]) == ("PERMISSION_DENIED", "fs:ImportFromStorage")
    assert refused(put, bm, admin, "l/1", through_dir).reason == "ADDRESS_NOT_ALLOWED"
    error = refused(put, bm, dev, "l/2", str(namespace / "links" / "b.csv"))
    assert error.metadata["action"] == "fs:ImportFromStorage"
    for address in (namespace / "links" / "b.csv", root / "allowed" / "escape" / "b.csv"):
        assert refused(put, bm, admin, "l/2", str(address)).reason == "ADDRESS_NOT_ALLOWED"
    # A plain file of the namespace still needs nothing more than fs:WriteObject.
    (namespace / "links" / "plain.csv").write_bytes(b"p")
    assert put(bm, dev, "l/3", str(namespace / "links" / "plain.csv")).entry.path == "l/3"


def test_a_link_into_the_namespace_is_refused_so_gc_never_misses_the_object(world):
    """GC keeps an object when an address NAMES it (quarry.blob.layout.referenced_keys): an
    address that reaches the namespace through a link (from an allowed directory, say)
    would leave the object it reads unnamed, and GC would delete it under a committed
    entry. Refused for everyone, naming the address to stage instead."""
    root, _, _, bm, _ = world
    namespace = root / "lake" / REPO
    (namespace / "data").mkdir(parents=True, exist_ok=True)
    (namespace / "data" / "object").write_bytes(b"o")
    os.symlink(namespace, root / "allowed" / "into-namespace")
    admin = user_token(TEST_ADMIN)
    through = str(root / "allowed" / "into-namespace" / "data" / "object")
    error = refused(put, bm, admin, "linked/1", through)
    assert (error.code.name, error.reason) == ("PERMISSION_DENIED", "ADDRESS_NOT_ALLOWED")
    assert str(namespace / "data" / "object") in error.message
    assert refused(put_many, bm, admin, [through]).reason == "ADDRESS_NOT_ALLOWED"
    assert not staged(bm, "linked/1") and not staged(bm, "many/0")
    # Nor through a link inside the namespace to another of its keys (tester hAH): a
    # directory link, or a file link.
    os.symlink(namespace / "data", namespace / "alias")
    os.symlink(namespace / "data" / "object", namespace / "data" / "link-to-object")
    for inner in (namespace / "alias" / "object", namespace / "data" / "link-to-object"):
        error = refused(put, bm, admin, "linked/2", str(inner))
        assert error.reason == "ADDRESS_NOT_ALLOWED" and str(namespace / "data" / "object") in (
            error.message
        )
    assert not staged(bm, "linked/2")
    # Named as it is, the same object stages.
    assert put(bm, admin, "linked/1", str(namespace / "data" / "object")).entry.path == "linked/1"


def test_an_entry_never_points_into_another_repositorys_namespace(world):
    root, _, _, bm, _ = world
    admin = user_token(TEST_ADMIN)
    for address in (
        str(root / OTHER / "data" / "x"),
        str(root / OTHER / "_quarry" / "repository.json"),
    ):
        error = refused(put, bm, admin, "n/x", address)
        assert (error.reason, error.metadata["repository"]) == ("ADDRESS_NOT_ALLOWED", OTHER)
    assert not staged(bm, "n/x")


def test_import_sources_follow_the_same_rules(world):
    root, home, _, _, cm = world
    admin = user_token(TEST_ADMIN)

    def start(uri: str):
        return cm.StartImport(
            committer_pb2.StartImportRequest(
                repository=REPO,
                branch="main",
                sources=[committer_pb2.ImportSource(uri=uri, destination_path="in/")],
                message="import",
            ),
            metadata=bearer(admin),
            timeout=20,
        )

    (home / "cache").mkdir(exist_ok=True)
    for source in (str(home), str(home / "cache"), str(root / "forbidden"), "/etc"):
        error = refused(start, source)
        assert (error.code.name, error.reason) == ("PERMISSION_DENIED", "ADDRESS_NOT_ALLOWED")
    # A directory holding home and the namespaces: refused (for the namespaces first).
    assert refused(start, str(root)).reason == "INVALID_IMPORT_SOURCE"
    assert getattr(start(str(root / "allowed" / "dims")), "import").id


def test_import_from_storage_is_scoped_by_the_place_the_address_points_at(world):
    """`arn:quarry:fs:::storage/<uri>` is a resource a policy may name (docs/import.md):
    a user allowed one bucket prefix stages addresses there and nowhere else."""
    _, _, iam, bm, _ = world
    iam.create_user("linker")
    iam.add_group_member(DEVELOPERS, "linker")
    iam.create_policy(
        "LinkFromLanding",
        document(
            {
                "Effect": "Allow",
                "Action": "fs:ImportFromStorage",
                "Resource": storage_arn("s3://landing/in/*"),
            }
        ),
    )
    iam.attach_user_policy("linker", "LinkFromLanding")
    linker = user_token("linker")
    assert put(bm, linker, "s/1", "s3://landing/in/1").entry.path == "s/1"
    error = refused(put, bm, linker, "s/2", "s3://landing/private/2")
    assert (error.reason, error.metadata["resource"]) == (
        "PERMISSION_DENIED",
        storage_arn("s3://landing/private/2"),
    )


def test_a_namespace_containing_quarrys_home_is_refused(world):
    root, _, _, bm, _ = world
    error = refused(
        bm.CreateRepository,
        branch_manager_pb2.CreateRepositoryRequest(name="greedy", storage_namespace=str(root)),
        metadata=bearer(user_token(TEST_ADMIN)),
    )
    assert (error.code.name, error.reason) == ("PERMISSION_DENIED", "ADDRESS_NOT_ALLOWED")


def test_import_from_storage_is_decided_on_the_place_not_the_text(world):
    """A Deny on a place held only for the spelling it named: `file:/x`, `FILE:///x`,
    `file://localhost/x`, percent-encoding and a link to the place all walked past it."""
    root, _, iam, bm, _ = world
    private = root / "allowed" / "private"
    private.mkdir(exist_ok=True)
    (private / "secret.txt").write_bytes(b"s")
    (root / "allowed" / "pub").mkdir(exist_ok=True)
    link = root / "allowed" / "pub" / "link.txt"
    if not link.exists():
        os.symlink(private / "secret.txt", link)
    iam.create_user("bob")
    iam.add_group_member(DEVELOPERS, "bob")
    iam.create_policy(
        "BobImports",
        document(
            {
                "Effect": "Allow",
                "Action": "fs:ImportFromStorage",
                "Resource": storage_arn(f"{root}/allowed/*"),
            },
            {
                "Effect": "Deny",
                "Action": "fs:ImportFromStorage",
                "Resource": storage_arn(f"{private}/*"),
            },
        ),
    )
    iam.attach_user_policy("bob", "BobImports")
    bob = user_token("bob")
    secret = private / "secret.txt"
    spellings = [
        str(secret),
        f"file:{secret}",
        f"FILE://{secret}",
        f"file://localhost{secret}",
        f"file://{str(secret).replace('private', '%70rivate')}",
        str(link),
    ]
    for address in spellings:
        error = refused(put, bm, bob, "p/secret", address)
        assert (error.reason, error.metadata["resource"]) == (
            "PERMISSION_DENIED",
            storage_arn(str(secret)),
        ), address
    assert put(bm, bob, "p/ok", str(root / "allowed" / "dims" / "a.csv")).entry.path == "p/ok"


def test_a_path_the_server_cannot_resolve_is_refused_not_internal(world):
    _, _, _, bm, _ = world
    error = refused(put, bm, user_token(TEST_ADMIN), "p/proc", "/proc/1/root/etc/hostname")
    assert error.code.name in ("PERMISSION_DENIED", "INVALID_ARGUMENT"), error
    assert error.code.name != "INTERNAL"
