"""quarry.client against the whole suite (real servers on loopback, in-process)."""

from __future__ import annotations

import pytest

from quarry import errors
from quarry.client import Client, RetryPolicy
from quarry.graveler import errors as gerrors
from quarry.v1 import types_pb2
from support.suite import suite_fixture

ADDED = types_pb2.CHANGE_TYPE_ADDED
REMOVED = types_pb2.CHANGE_TYPE_REMOVED
CHANGED = types_pb2.CHANGE_TYPE_CHANGED
N_PARTS = 5000


suite = suite_fixture()


@pytest.fixture
def client(suite):
    with suite.client(retry=RetryPolicy(budget=5.0), timeout=30) as c:
        yield c


def part(i: int, checksum: str = "") -> dict:
    return {
        "path": f"data/part-{i:05d}.parquet",
        "physical_address": f"s3://bucket/raw/part-{i:05d}",
        "size_bytes": 1000 + i,
        "checksum": checksum or f"sum-{i}",
        "content_type": "application/parquet",
    }


def test_full_workflow(suite, client):
    ns = suite.namespace("flow")
    repo = client.create_repository("flow", ns)
    assert (repo.name, repo.default_branch, repo.storage_namespace) == ("flow", "main", ns)
    assert client.get_repository("flow").storage_namespace == ns
    assert "flow" in [r.name for r in client.iter_repositories()]

    dev = client.create_branch("flow", "dev")  # from the default branch
    main = client.get_branch("flow", "main")
    assert dev.commit_id == main.commit_id
    assert [b.name for b in client.iter_branches("flow", page_size=1)] == ["dev", "main"]

    # ---- stage: one object, then 5,000 in batches of 1,000 from a generator ----
    readme = client.put_object(
        "flow",
        "dev",
        path="README.md",
        physical_address="s3://bucket/readme",
        size_bytes=42,
        checksum="r1",
        metadata={"owner": "data-eng"},
    )
    assert readme.path == "README.md"
    seen: list[int] = []
    count = client.put_objects(
        "flow", "dev", (part(i) for i in range(N_PARTS)), batch_size=1000, progress=seen.append
    )
    assert count == N_PARTS
    assert seen == [1000, 2000, 3000, 4000, 5000]
    client.put_objects(
        "flow",
        "dev",
        [
            {"path": "logs/2024/01.log", "size_bytes": 7},
            {"path": "logs/2024/02.log", "size_bytes": 8},
        ],
    )

    # ---- list: delimiter and paging ----
    top = client.list_objects("flow", "dev", delimiter="/")
    assert [e.path for e in top.entries] == ["README.md"]
    assert list(top.common_prefixes) == ["data/", "logs/"]
    assert top.next_page_token == ""
    first = client.list_objects("flow", "dev", prefix="data/", page_size=700)
    assert len(first.entries) == 700 and first.next_page_token
    second = client.list_objects(
        "flow", "dev", prefix="data/", page_size=700, page_token=first.next_page_token
    )
    assert second.entries[0].path == "data/part-00700.parquet"
    paths = [e.path for e in client.iter_objects("flow", "dev", prefix="data/", page_size=700)]
    assert paths == [part(i)["path"] for i in range(N_PARTS)]
    mixed = list(client.iter_objects("flow", "dev", delimiter="/", page_size=1))
    assert [m if isinstance(m, str) else m.path for m in mixed] == ["README.md", "data/", "logs/"]
    stat = client.stat_object("flow", "dev", "README.md")
    assert (stat.size_bytes, stat.checksum, dict(stat.metadata)) == (
        42,
        "r1",
        {"owner": "data-eng"},
    )

    uncommitted = list(client.iter_uncommitted("flow", "dev", page_size=999))
    assert len(uncommitted) == N_PARTS + 3
    assert {c.type for c in uncommitted} == {ADDED}

    # ---- commit, log ----
    outcome = client.commit("flow", "dev", "load parts", committer="etl", metadata={"job": "42"})
    c1 = outcome.commit
    assert outcome.summary.added == N_PARTS + 3
    assert (c1.message, c1.committer, dict(c1.metadata)) == ("load parts", "etl", {"job": "42"})
    assert list(c1.parents) == [main.commit_id]
    assert client.get_branch("flow", "dev").commit_id == c1.id
    assert client.get_commit("flow", "dev").id == c1.id
    assert client.get_commit("flow", c1.id[:10]).id == c1.id
    assert list(client.iter_uncommitted("flow", "dev")) == []

    client.put_object("flow", "dev", part(1, checksum="rewritten"))
    client.delete_object("flow", "dev", "logs/2024/01.log")
    assert client.delete_objects("flow", "dev", ["logs/2024/02.log", "no/such/path"]) == 1
    c2 = client.commit("flow", "dev", "fix part 1, drop logs").commit
    history = [c.id for c in client.iter_log("flow", "dev")]
    assert history[:2] == [c2.id, c1.id] and history[-1] == main.commit_id
    assert [c.id for c in client.iter_log("flow", "dev", limit=1)] == [c2.id]
    page = client.log("flow", "dev", page_size=1)
    assert [c.id for c in page.commits] == [c2.id] and page.next_page_token

    # ---- diff between refs ----
    changes = {c.path: c.type for c in client.iter_diff("flow", c1.id, c2.id)}
    assert changes == {
        "data/part-00001.parquet": CHANGED,
        "logs/2024/01.log": REMOVED,
        "logs/2024/02.log": REMOVED,
    }
    assert [c.path for c in client.iter_diff("flow", c1.id, "dev", prefix="data/")] == [
        "data/part-00001.parquet"
    ]
    from_main = list(client.iter_diff("flow", "main", "dev", page_size=1000))
    assert len(from_main) == N_PARTS + 1 and {c.type for c in from_main} == {ADDED}

    # ---- tags ----
    tag = client.create_tag("flow", "v1", c1.id)
    assert tag.commit_id == c1.id and client.get_tag("flow", "v1").commit_id == c1.id
    assert [t.name for t in client.iter_tags("flow")] == ["v1"]
    assert client.stat_object("flow", "v1", "logs/2024/01.log").size_bytes == 7
    assert client.stat_object("flow", "dev~1", "logs/2024/01.log").size_bytes == 7

    # ---- reset (refused while dirty, then forced) ----
    client.put_object("flow", "dev", path="scratch/tmp", size_bytes=1)
    with pytest.raises(gerrors.DirtyBranch) as caught:
        client.reset_branch("flow", "dev", "v1")
    assert caught.value.code.name == "FAILED_PRECONDITION"
    reset = client.reset_branch("flow", "dev", "v1", force=True)
    assert reset.commit_id == c1.id
    with pytest.raises(errors.NotFound):
        client.stat_object("flow", "dev", "scratch/tmp")
    assert client.stat_object("flow", "dev", "logs/2024/01.log").size_bytes == 7

    # ---- discard: one path, a prefix, everything ----
    client.put_objects(
        "flow",
        "dev",
        [
            {"path": "tmp/a", "size_bytes": 1},
            {"path": "tmp/b", "size_bytes": 1},
            {"path": "keep/c", "size_bytes": 1},
            part(2, checksum="changed"),
        ],
    )
    client.discard_changes("flow", "dev", path="tmp/a")
    assert sorted(c.path for c in client.iter_uncommitted("flow", "dev")) == [
        "data/part-00002.parquet",
        "keep/c",
        "tmp/b",
    ]
    client.discard_changes("flow", "dev", prefix="tmp/")
    assert sorted(c.path for c in client.iter_uncommitted("flow", "dev")) == [
        "data/part-00002.parquet",
        "keep/c",
    ]
    client.discard_changes("flow", "dev")
    assert list(client.iter_uncommitted("flow", "dev")) == []
    assert client.stat_object("flow", "dev", "data/part-00002.parquet").checksum == "sum-2"

    # ---- clean up ----
    client.delete_tag("flow", "v1")
    client.delete_branch("flow", "dev")
    assert [b.name for b in client.iter_branches("flow")] == ["main"]


def test_errors_map_to_domain_exceptions(suite, client):
    ns = suite.namespace("errs")
    client.create_repository("errs", ns)

    def raises(cls, reason, call, *args, **kwargs):
        with pytest.raises(cls) as caught:
            call(*args, **kwargs)
        assert caught.value.reason == reason, caught.value
        assert str(caught.value)  # a human message
        return caught.value

    exc = raises(
        gerrors.RepositoryNotFound, "REPOSITORY_NOT_FOUND", client.get_repository, "no-such-repo"
    )
    assert isinstance(exc, errors.NotFound)
    raises(gerrors.RepositoryExists, "REPOSITORY_EXISTS", client.create_repository, "errs", ns)
    raises(gerrors.InvalidName, "INVALID_NAME", client.create_repository, "Bad_Name", ns)
    raises(
        errors.InvalidArgument,
        "INVALID_NAMESPACE",
        client.create_repository,
        "relative-ns",
        "not/absolute",
    )
    raises(gerrors.BranchNotFound, "BRANCH_NOT_FOUND", client.get_branch, "errs", "nope")
    raises(gerrors.BranchExists, "BRANCH_EXISTS", client.create_branch, "errs", "main")
    raises(errors.NotFound, "OBJECT_NOT_FOUND", client.stat_object, "errs", "main", "missing")
    raises(gerrors.TagNotFound, "TAG_NOT_FOUND", client.get_tag, "errs", "v9")
    raises(errors.NotFound, "REF_NOT_FOUND", client.get_commit, "errs", "no-such-ref")
    raises(gerrors.NoChanges, "NO_CHANGES", client.commit, "errs", "main", "empty")
    raises(gerrors.InvalidPath, "INVALID_PATH", client.put_object, "errs", "main", path="")

    client.put_object("errs", "main", path="a", size_bytes=1, checksum="x")
    raises(
        gerrors.ObjectExists,
        "OBJECT_EXISTS",
        client.put_object,
        "errs",
        "main",
        path="a",
        size_bytes=2,
        checksum="y",
        if_absent=True,
    )
    raises(gerrors.DirtyBranch, "DIRTY_BRANCH", client.reset_branch, "errs", "main", "main@")
    raises(errors.FailedPrecondition, "PROTECTED_BRANCH", client.delete_branch, "errs", "main")
    raises(
        errors.InvalidArgument,
        "INVALID_PAGE_TOKEN",
        client.list_objects,
        "errs",
        "main",
        page_token="garbage!",
    )
    # A whole stream rejected by the server is not retried and keeps its reason.
    raises(
        gerrors.InvalidPath,
        "INVALID_PATH",
        client.put_objects,
        "errs",
        "main",
        [{"path": "ok"}, {"path": "bad\x00path"}],
    )


def test_client_reaches_the_suite_from_settings(suite):
    with Client.from_settings(suite.settings) as client:
        assert client.server_info().service == "branch-manager"
        assert client.server_info("committer").service == "committer"
