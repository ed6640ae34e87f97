"""The versioning core without gRPC: flows, refs, dirty flag, paging, bad input."""

import contextlib

import pytest

from quarry import errors
from quarry.graveler import errors as gerrors
from quarry.graveler.model import ChangeType, Entry
from quarry.graveler.refs import is_dirty
from quarry.v1 import types_pb2
from support.caches import paused_ttl_caches


def entry(path, checksum="c1", address=None, size=10, **metadata):
    return Entry(
        path, address or f"data/{path}-{checksum}", size, checksum, 0, "text/plain", metadata
    )


def paths(entries):
    return [e.path for e in entries]


# ---- repositories -----------------------------------------------------------------------


def test_create_repository_has_initial_commit_and_default_branch(graveler, tmp_path):
    repo = graveler.create_repository("lake-one", str(tmp_path / "ns"), "trunk")
    assert repo.default_branch == "trunk"
    branch = graveler.get_branch("lake-one", "trunk")
    assert branch.dirty is False and branch.commit_id
    commit = graveler.get_commit("lake-one", "trunk")
    assert commit.parents == [] and commit.generation == 1
    assert graveler.list_objects("lake-one", "trunk")[0] == []


def test_duplicate_repository_is_refused_and_original_untouched(graveler, repo, tmp_path):
    original = graveler.get_repository(repo)
    with pytest.raises(gerrors.RepositoryExists):
        graveler.create_repository(repo, str(tmp_path / "other"))
    assert graveler.get_repository(repo) == original


@pytest.mark.parametrize("name", ["", "ab", "Upper", "-lead", "a" * 64, "has_underscore"])
def test_invalid_repository_names(graveler, tmp_path, name):
    with pytest.raises(gerrors.InvalidName) as caught:
        graveler.create_repository(name, str(tmp_path))
    assert "3-63 characters" in str(caught.value)


@pytest.mark.parametrize("namespace", ["", "relative/dir", "s3://", "s3:///x"])
def test_invalid_storage_namespaces(graveler, namespace):
    with pytest.raises(gerrors.InvalidStorageNamespace):
        graveler.create_repository("good-name", namespace)
    with pytest.raises(gerrors.RepositoryNotFound):
        graveler.get_repository("good-name")


def test_list_repositories_pages(graveler, tmp_path):
    for i in range(5):
        graveler.create_repository(f"repo-{i}", str(tmp_path / str(i)))
    first, token = graveler.list_repositories(page_size=2)
    assert [r.name for r in first] == ["repo-0", "repo-1"] and token
    second, token = graveler.list_repositories(page_size=2, page_token=token)
    third, token = graveler.list_repositories(page_size=2, page_token=token)
    assert [r.name for r in second + third] == ["repo-2", "repo-3", "repo-4"]
    assert token == ""
    with pytest.raises(gerrors.InvalidPageToken):
        graveler.list_repositories(page_token="garbage!")


def test_a_ref_longer_than_any_name_is_not_found_before_any_lookup(graveler, repo):
    """It used to reach the KV store as a branch key and fail there (KEY_TOO_LARGE)."""
    for ref in ("a" * 1100, "x" * 256, "a" * 300 + "~1"):
        with pytest.raises(gerrors.RefNotFound):
            graveler.stat_object(repo, ref, "p")
    with pytest.raises(gerrors.RefNotFound):
        graveler.log(repo, "b" * 5000)


def test_a_deeply_nested_page_token_is_refused_not_internal(graveler, repo):
    """JSON nested past the interpreter's recursion limit raises RecursionError in json."""
    import base64

    token = base64.urlsafe_b64encode(b"[" * 100_000 + b"]" * 100_000).decode()
    for call in (
        lambda: graveler.list_repositories(page_token=token),
        lambda: graveler.list_objects(repo, "main", page_token=token),
    ):
        with pytest.raises(gerrors.InvalidPageToken):
            call()


@pytest.mark.parametrize(
    "state",
    [
        {"after": True},
        {"after": ["x"]},
        {"after": 5},
        {"after": "a", "skip_prefix": "yes"},
        {"frontier": "c1"},
        {"frontier": [1, 2]},
    ],
)
def test_a_page_token_of_the_wrong_shape_is_refused(graveler, repo, state):
    """Found by tests/integration/test_properties.py: these were INTERNAL (AttributeError)."""
    import base64
    import json

    token = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
    for call in (
        lambda: graveler.list_repositories(page_token=token),
        lambda: graveler.list_branches(repo, page_token=token),
        lambda: graveler.list_objects(repo, "main", page_token=token),
        lambda: graveler.log(repo, "main", page_token=token),
    ):
        try:
            call()
        except gerrors.InvalidPageToken:
            continue  # the fields this listing needs are refused
        except Exception as exc:
            pytest.fail(f"{state}: {exc!r}")


def test_delete_repository_then_recreate_is_empty(graveler, repo, tmp_path):
    graveler.put_objects(repo, "main", [entry("a")])
    graveler.commit(repo, "main", "one")
    graveler.delete_repository(repo)
    with pytest.raises(gerrors.RepositoryNotFound):
        graveler.get_repository(repo)
    graveler.create_repository(repo, str(tmp_path / "again"))
    assert graveler.list_objects(repo, "main")[0] == []


# ---- branches and tags -------------------------------------------------------------------


def test_branch_lifecycle(graveler, repo):
    graveler.put_objects(repo, "main", [entry("a")])
    graveler.commit(repo, "main", "one")
    feature = graveler.create_branch(repo, "feature", "main")
    assert feature.commit_id == graveler.get_branch(repo, "main").commit_id
    with pytest.raises(gerrors.BranchExists):
        graveler.create_branch(repo, "feature", "main")
    names = [b.name for b in graveler.list_branches(repo)[0]]
    assert names == ["feature", "main"]
    graveler.delete_branch(repo, "feature")
    with pytest.raises(gerrors.BranchNotFound):
        graveler.get_branch(repo, "feature")
    with pytest.raises(gerrors.ProtectedBranch):
        graveler.delete_branch(repo, "main")


@pytest.mark.parametrize("name", ["", "a/b", "a~1", "x^", "br@", "a..b", "deadbeef", "sp ace"])
def test_invalid_branch_names_name_the_rule(graveler, repo, name):
    with pytest.raises(gerrors.InvalidName) as caught:
        graveler.create_branch(repo, name, "main")
    assert caught.value.code.name == "INVALID_ARGUMENT"


def test_tags_are_immutable(graveler, repo):
    first = graveler.get_branch(repo, "main").commit_id
    tag = graveler.create_tag(repo, "v1", "main")
    assert tag.commit_id == first
    graveler.put_objects(repo, "main", [entry("a")])
    graveler.commit(repo, "main", "one")
    with pytest.raises(gerrors.TagExists):
        graveler.create_tag(repo, "v1", "main")
    assert graveler.get_tag(repo, "v1").commit_id == first
    assert [t.name for t in graveler.list_tags(repo)[0]] == ["v1"]
    graveler.delete_tag(repo, "v1")
    with pytest.raises(gerrors.TagNotFound):
        graveler.delete_tag(repo, "v1")


def test_refs_resolve_like_git(graveler, repo):
    ids = [graveler.get_branch(repo, "main").commit_id]
    for i in range(3):
        graveler.put_objects(repo, "main", [entry(f"f{i}")])
        ids.append(graveler.commit(repo, "main", f"c{i}").commit.id)
    assert graveler.get_commit(repo, "main").id == ids[3]
    assert graveler.get_commit(repo, "main~1").id == ids[2]
    assert graveler.get_commit(repo, "main~3").id == ids[0]
    assert graveler.get_commit(repo, "main^").id == ids[2]
    assert graveler.get_commit(repo, "main^1^1").id == ids[1]
    assert graveler.get_commit(repo, "main@").id == ids[3]
    assert graveler.get_commit(repo, ids[2][:8]).id == ids[2]
    assert graveler.get_commit(repo, ids[1]).id == ids[1]
    with pytest.raises(gerrors.RefNotFound):
        graveler.get_commit(repo, "main~9")
    with pytest.raises(gerrors.RefNotFound):
        graveler.get_commit(repo, "main^2")
    with pytest.raises(gerrors.RefNotFound):
        graveler.get_commit(repo, "nope")
    with pytest.raises(gerrors.RefNotFound):
        graveler.get_commit(repo, "abc")  # too short to be a commit prefix
    with pytest.raises(gerrors.InvalidRef):
        graveler.get_commit(repo, "main~x")


def test_branch_at_reads_committed_state_only(graveler, repo):
    graveler.put_objects(repo, "main", [entry("a")])
    assert graveler.stat_object(repo, "main", "a").checksum == "c1"
    with pytest.raises(gerrors.ObjectNotFound):
        graveler.stat_object(repo, "main@", "a")


# ---- staging, reads and commits ------------------------------------------------------------


def test_put_stat_list_commit_round_trip(graveler, repo):
    graveler.put_objects(repo, "main", [entry("b/2"), entry("a/1"), entry("b/1")])
    assert is_dirty(graveler.get_branch(repo, "main"))
    listed, prefixes, token = graveler.list_objects(repo, "main")
    assert paths(listed) == ["a/1", "b/1", "b/2"] and token == ""
    outcome = graveler.commit(repo, "main", "first", "alice", {"k": "v"})
    assert (outcome.summary.added, outcome.summary.changed) == (3, 0)
    assert outcome.commit.committer == "alice" and dict(outcome.commit.metadata) == {"k": "v"}
    branch = graveler.get_branch(repo, "main")
    assert branch.dirty is False and list(branch.sealed_tokens) == []
    assert paths(graveler.list_objects(repo, "main@")[0]) == ["a/1", "b/1", "b/2"]
    with pytest.raises(gerrors.NoChanges):
        graveler.commit(repo, "main", "nothing")
    empty = graveler.commit(repo, "main", "empty", allow_empty=True)
    assert empty.commit.parents == [outcome.commit.id]


def test_restaging_identical_content_is_no_change(graveler, repo):
    graveler.put_objects(repo, "main", [entry("a", address="first")])
    graveler.commit(repo, "main", "one")
    # Every field a user reads back equal, only mtime differs: no change.
    again = entry("a", address="first")
    graveler.put_objects(
        repo,
        "main",
        [
            Entry(
                "a",
                again.physical_address,
                again.size_bytes,
                again.checksum,
                123,
                again.content_type,
            )
        ],
    )
    assert graveler.diff_uncommitted(repo, "main")[0] == []
    with pytest.raises(gerrors.NoChanges):
        graveler.commit(repo, "main", "same content")


def test_a_new_address_alone_is_a_change(graveler, repo):
    # Issue 10.1: same size and checksum, another address. Before format 2 this read back
    # the new address while staged and the old one after the commit.
    graveler.put_objects(repo, "main", [entry("a", address="first")])
    graveler.commit(repo, "main", "one")
    graveler.put_objects(repo, "main", [entry("a", address="second-copy")])
    changes = graveler.diff_uncommitted(repo, "main")[0]
    assert [(c.type, c.entry.physical_address) for c in changes] == [
        (ChangeType.CHANGED, "second-copy")
    ]
    assert graveler.commit(repo, "main", "moved").summary.changed == 1
    assert graveler.stat_object(repo, "main@", "a").physical_address == "second-copy"


def test_deletes_tombstones_and_no_ops(graveler, repo):
    graveler.put_objects(repo, "main", [entry("keep"), entry("gone")])
    graveler.commit(repo, "main", "one")
    assert graveler.delete_objects(repo, "main", ["gone", "never-existed"]) == 1
    with pytest.raises(gerrors.ObjectNotFound):
        graveler.stat_object(repo, "main", "gone")
    assert paths(graveler.list_objects(repo, "main")[0]) == ["keep"]
    changes = graveler.diff_uncommitted(repo, "main")[0]
    assert [(c.type, c.path) for c in changes] == [(ChangeType.REMOVED, "gone")]
    outcome = graveler.commit(repo, "main", "delete")
    assert outcome.summary.removed == 1
    # A path that exists nowhere: deleting it writes nothing and leaves the branch clean.
    graveler.delete_objects(repo, "main", ["nowhere"])
    assert graveler.get_branch(repo, "main").dirty is False


def test_staged_then_deleted_never_committed_commits_cleanly(graveler, repo):
    graveler.put_objects(repo, "main", [entry("temp"), entry("real")])
    graveler.delete_objects(repo, "main", ["temp"])
    outcome = graveler.commit(repo, "main", "only real")
    assert outcome.summary.added == 1
    assert paths(graveler.list_objects(repo, "main")[0]) == ["real"]


def test_readding_after_delete(graveler, repo):
    graveler.put_objects(repo, "main", [entry("x", "v1")])
    graveler.commit(repo, "main", "one")
    graveler.delete_objects(repo, "main", ["x"])
    graveler.put_objects(repo, "main", [entry("x", "v2")])
    assert graveler.stat_object(repo, "main", "x").checksum == "v2"
    graveler.commit(repo, "main", "two")
    assert graveler.stat_object(repo, "main", "x").checksum == "v2"


def test_put_if_absent(graveler, repo):
    graveler.put_objects(repo, "main", [entry("a")], if_absent=True)
    with pytest.raises(gerrors.ObjectExists):
        graveler.put_objects(repo, "main", [entry("a", "other")], if_absent=True)
    graveler.commit(repo, "main", "one")
    with pytest.raises(gerrors.ObjectExists):
        graveler.put_objects(repo, "main", [entry("a", "other")], if_absent=True)
    graveler.delete_objects(repo, "main", ["a"])
    graveler.put_objects(repo, "main", [entry("a", "again")], if_absent=True)
    assert graveler.stat_object(repo, "main", "a").checksum == "again"


def test_put_if_match_checksum_replaces_only_the_entry_it_names(graveler, repo):
    graveler.put_objects(repo, "main", [entry("a", "v1")])
    graveler.commit(repo, "main", "one")
    # Committed, then staged: the condition reads whichever is current.
    with pytest.raises(gerrors.ChecksumConditionFailed):
        graveler.put_objects(repo, "main", [entry("a", "v2")], if_match_checksum="v0")
    assert graveler.stat_object(repo, "main", "a").checksum == "v1"
    graveler.put_objects(repo, "main", [entry("a", "v2")], if_match_checksum="v1")
    with pytest.raises(gerrors.ChecksumConditionFailed):
        graveler.put_objects(repo, "main", [entry("a", "v3")], if_match_checksum="v1")
    graveler.put_objects(repo, "main", [entry("a", "v3")], if_match_checksum="v2")
    assert graveler.stat_object(repo, "main", "a").checksum == "v3"
    # No object (never written, or deleted): NOT_FOUND, nothing staged.
    with pytest.raises(gerrors.ObjectNotFound):
        graveler.put_objects(repo, "main", [entry("b", "v1")], if_match_checksum="v0")
    graveler.delete_objects(repo, "main", ["a"])
    with pytest.raises(gerrors.ObjectNotFound):
        graveler.put_objects(repo, "main", [entry("a", "v4")], if_match_checksum="v3")
    with pytest.raises(gerrors.ObjectNotFound):
        graveler.stat_object(repo, "main", "b")
    with pytest.raises(gerrors.InvalidEntry):
        graveler.put_objects(repo, "main", [entry("c")], if_absent=True, if_match_checksum="v1")


def test_listing_with_delimiter_and_pages(graveler, repo):
    files = [f"d{d}/f{f}" for d in range(3) for f in range(4)] + ["top1", "top2"]
    graveler.put_objects(repo, "main", [entry(p) for p in files[:7]])
    graveler.commit(repo, "main", "half")
    graveler.put_objects(repo, "main", [entry(p) for p in files[7:]])
    graveler.delete_objects(repo, "main", ["d1/f0", "d1/f1", "d1/f2", "d1/f3"])
    entries, prefixes, token = graveler.list_objects(repo, "main", delimiter="/")
    assert prefixes == ["d0/", "d2/"]  # d1/ holds only tombstones
    assert paths(entries) == ["top1", "top2"]
    seen, token = [], ""
    while True:
        entries, prefixes, token = graveler.list_objects(
            repo, "main", page_size=3, page_token=token
        )
        assert len(entries) <= 3
        seen += paths(entries)
        if not token:
            break
    assert seen == sorted(set(files) - {f"d1/f{i}" for i in range(4)})
    got, pfx, token = graveler.list_objects(repo, "main", prefix="d2/", page_size=2)
    assert paths(got) == ["d2/f0", "d2/f1"] and token
    got, pfx, token = graveler.list_objects(
        repo, "main", prefix="d2/", page_size=2, page_token=token
    )
    assert paths(got) == ["d2/f2", "d2/f3"]
    out, prefixes, token = graveler.list_objects(repo, "main", delimiter="/", page_size=1)
    assert prefixes == ["d0/"] and token
    out, prefixes, token = graveler.list_objects(
        repo, "main", delimiter="/", page_size=1, page_token=token
    )
    assert prefixes == ["d2/"]


def test_discard_path_prefix_and_everything(graveler, repo):
    graveler.put_objects(repo, "main", [entry("a/1"), entry("a/2"), entry("b/1")])
    graveler.commit(repo, "main", "base")
    graveler.put_objects(
        repo, "main", [entry("a/1", "new"), entry("a/3"), entry("b/1", "new"), entry("c")]
    )
    graveler.delete_objects(repo, "main", ["a/2"])
    graveler.discard_changes(repo, "main", path="b/1")
    assert graveler.stat_object(repo, "main", "b/1").checksum == "c1"
    graveler.discard_changes(repo, "main", prefix="a/")
    assert paths(graveler.list_objects(repo, "main", prefix="a/")[0]) == ["a/1", "a/2"]
    assert graveler.stat_object(repo, "main", "a/1").checksum == "c1"
    assert [c.path for c in graveler.diff_uncommitted(repo, "main")[0]] == ["c"]
    graveler.discard_changes(repo, "main")
    assert graveler.diff_uncommitted(repo, "main")[0] == []
    assert graveler.get_branch(repo, "main").dirty is False


def test_reset_refuses_dirty_unless_forced(graveler, repo):
    first = graveler.get_branch(repo, "main").commit_id
    graveler.put_objects(repo, "main", [entry("a")])
    graveler.commit(repo, "main", "one")
    graveler.put_objects(repo, "main", [entry("b")])
    before = graveler.get_branch(repo, "main")
    for _ in range(3):
        with pytest.raises(gerrors.DirtyBranch):
            graveler.reset_branch(repo, "main", first)
    assert graveler.stat_object(repo, "main", "b")  # nothing half-applied
    # A refused reset changes nothing: no seal, no new token, still dirty (tester hAE).
    assert graveler.get_branch(repo, "main") == before
    branch = graveler.reset_branch(repo, "main", first, force=True)
    assert branch.commit_id == first and branch.dirty is False
    assert graveler.list_objects(repo, "main")[0] == []


def test_a_reset_never_drops_a_write_acknowledged_during_its_check(graveler, repo):
    """A branch dirty with nothing real (a path staged, then deleted) is reset; a put is
    acknowledged while the reset checks the branch for changes. A writer on a dirty branch
    does not touch the branch record, so a reset that checked the token and then swapped
    the record dropped the token with the acknowledged write (found under dynalite and
    SQLite). Now the put is kept and the reset refused, since the branch holds it."""
    first = graveler.get_branch(repo, "main").commit_id
    graveler.put_objects(repo, "main", [entry("tmp")])
    graveler.delete_objects(repo, "main", ["tmp"])  # dirty, with no real change
    real = graveler.reads.has_uncommitted
    raced = []

    def check_while_a_writer_writes(repo_record, branch):
        found = real(repo_record, branch)
        if not raced:
            raced.append(True)
            graveler.put_objects(repo, "main", [entry("raced")])  # acknowledged
        return found

    graveler.reads.has_uncommitted = check_while_a_writer_writes
    try:
        with pytest.raises(gerrors.DirtyBranch):
            graveler.reset_branch(repo, "main", first)
    finally:
        del graveler.reads.has_uncommitted
    assert raced and graveler.stat_object(repo, "main", "raced").path == "raced"


def test_diff_between_refs_and_log(graveler, repo):
    graveler.put_objects(repo, "main", [entry("a"), entry("b")])
    c1 = graveler.commit(repo, "main", "one").commit
    graveler.put_objects(repo, "main", [entry("a", "v2"), entry("c")])
    graveler.delete_objects(repo, "main", ["b"])
    c2 = graveler.commit(repo, "main", "two").commit
    changes, token = graveler.diff(repo, c1.id, "main")
    assert [(c.type, c.path) for c in changes] == [
        (ChangeType.CHANGED, "a"),
        (ChangeType.REMOVED, "b"),
        (ChangeType.ADDED, "c"),
    ]
    page, token = graveler.diff(repo, c1.id, "main", page_size=2)
    rest, token2 = graveler.diff(repo, c1.id, "main", page_size=2, page_token=token)
    assert [c.path for c in page + rest] == ["a", "b", "c"] and token2 == ""
    commits, token = graveler.log(repo, "main", page_size=2)
    assert [c.id for c in commits] == [c2.id, c1.id] and token
    rest, token = graveler.log(repo, "main", page_size=2, page_token=token)
    assert [c.message for c in rest] == ["Repository created"] and token == ""


def test_record_without_dirty_field_reads_as_dirty(graveler, repo, kv_store):
    r = graveler.refs.get_repository(repo)
    branch, predicate = graveler.refs.get_branch(r, "main")
    legacy = types_pb2.Branch(
        name=branch.name, commit_id=branch.commit_id, staging_token=branch.staging_token
    )
    from quarry.kv.store import Equals

    graveler.refs.set_branch_if(r, legacy, Equals(predicate))
    # A value staged directly (as an old writer would have) is visible.
    graveler.staging.set_many(branch.staging_token, [("old", entry("old"))])
    assert graveler.stat_object(repo, "main", "old").path == "old"


# ---- cost model (KV side) ------------------------------------------------------------------


def test_stat_on_clean_branch_reads_no_staging(graveler, repo, kv_store):
    graveler.put_objects(repo, "main", [entry("a")])
    graveler.commit(repo, "main", "one")
    with paused_ttl_caches():  # the repository record cached by the warm call stays fresh
        graveler.stat_object(repo, "main", "a")  # warm caches
        kv_store.reset()
        graveler.stat_object(repo, "main", "a")
    assert kv_store.total(cls="staging") == 0
    assert kv_store.total() == 1  # the branch record
    graveler.put_objects(repo, "main", [entry("b")])
    kv_store.reset()
    graveler.stat_object(repo, "main", "a")
    assert kv_store.total(cls="staging") == 1  # dirty: the staging token is consulted


def test_stat_on_a_dirty_sharded_branch_is_one_staging_read(graveler, repo, kv_store):
    """Sharding changes no read cost: the path names its shard, so a hit or a miss in the
    staging token is one `staging` read, whatever the token's shard count; the staged items
    are spread over every shard of the token. On a branch seen dirty before, that read goes
    in one batch with the fresh branch-record read (Reads._dirty_branch_read): a hit is that
    one batch and nothing else (it was three gets: branch, staging, branch again); a miss
    then reads the branch record once more to validate (three reads, two round trips)."""
    from quarry.graveler.layout import staged_partition, staging_partitions

    paths = [f"data/part-{i:05d}" for i in range(64)]
    graveler.put_objects(repo, "main", [entry(p) for p in paths])
    token = graveler.get_branch(repo, "main").staging_token
    partitions = staging_partitions(token)
    held = {p for p in partitions if list(kv_store.inner.scan(p))}
    assert held == set(partitions)  # N=1: the one partition; N=4: all four
    hit = {("batch_get", "repo"): 1, ("batch_get", "staging"): 1}
    for path, costs in (
        (paths[0], hit),
        (paths[37], hit),
        ("data/missing", {**hit, ("get", "repo"): 1}),
    ):
        graveler.stat_object(repo, "main", paths[1])  # warm caches
        kv_store.reset()
        with contextlib.suppress(gerrors.ObjectNotFound):
            graveler.stat_object(repo, "main", path)
        assert kv_store.total(cls="staging") == 1, path
        assert kv_store.snapshot() == costs, path
    # ... and the one partition read is the path's own shard.
    reads: list[bytes] = []
    real_get, real_batch_get = kv_store.inner.get, kv_store.inner.batch_get

    def spy(partition, key):
        reads.append(partition)
        return real_get(partition, key)

    def batch_spy(items):
        reads.extend(partition for partition, _ in items)
        return real_batch_get(items)

    kv_store.inner.get, kv_store.inner.batch_get = spy, batch_spy
    try:
        for path in (paths[5], "data/missing-too"):
            reads.clear()
            with contextlib.suppress(gerrors.ObjectNotFound):
                graveler.stat_object(repo, "main", path)
            staged = [p for p in reads if p.startswith(b"staging/")]
            assert staged == [staged_partition(token, path)], path
    finally:
        del kv_store.inner.get, kv_store.inner.batch_get


def test_delete_objects_reads_the_staging_token_in_batches_not_per_path(graveler, repo, kv_store):
    """DeleteObjects on a dirty branch looks up its paths (which exist?) in batched KV reads
    of the staging token: 2,510 paths were 2,510 round trips (14 s for 20,000 paths)."""
    staged = [f"d/{i:05d}" for i in range(2500)]
    graveler.put_objects(repo, "main", [entry(p) for p in staged])
    calls: list[str] = []
    real_get, real_batch_get = kv_store.inner.get, kv_store.inner.batch_get

    def get_spy(partition, key):
        calls.append("get")
        return real_get(partition, key)

    def batch_spy(items):
        calls.append("batch_get")
        return real_batch_get(items)

    kv_store.inner.get, kv_store.inner.batch_get = get_spy, batch_spy
    try:
        deleted = graveler.delete_objects(
            repo, "main", staged + [f"missing/{i}" for i in range(10)]
        )
    finally:
        del kv_store.inner.get, kv_store.inner.batch_get
    assert int(deleted) == 2500
    assert len(calls) <= 10, calls  # 3 batches of the token's keys, and the branch reads
    assert graveler.list_objects(repo, "main", prefix="d/")[0] == []


def _reader_of(graveler):
    """A second core on the same KV store (another branch-manager replica): its cached
    branch records are its own, so they go stale when the first one writes."""
    from quarry.graveler.graveler import Graveler

    return Graveler(graveler.kv, graveler.committed, graveler.range_writer)


def test_a_stat_never_answers_from_a_token_its_stale_hint_names(graveler, repo):
    """A StatObject on a branch it saw dirty looks into the staging token it saw
    (Reads._dirty_branch_read); once a commit moved the branch to a new token, a newer
    write of the path sits in the new token and must be what the read returns, never the
    value in the old (sealed, then retired) token."""
    reader = _reader_of(graveler)
    graveler.put_objects(repo, "main", [entry("p", checksum="old")])
    assert reader.stat_object(repo, "main", "p").checksum == "old"  # hint: the first token
    graveler.commit(repo, "main", "one")
    graveler.put_objects(repo, "main", [entry("p", checksum="new")])
    graveler.put_objects(repo, "main", [entry("q", checksum="q1")])
    assert reader.stat_object(repo, "main", "p").checksum == "new"
    assert reader.stat_object(repo, "main", "q").checksum == "q1"
    graveler.delete_objects(repo, "main", ["p"])
    with pytest.raises(gerrors.ObjectNotFound):  # a tombstone in the current token
        reader.stat_object(repo, "main", "p")
    # A commit, then nothing staged: the hint's token is sealed and gone; the branch clean.
    graveler.commit(repo, "main", "two")
    assert reader.stat_object(repo, "main", "q").checksum == "q1"
    with pytest.raises(gerrors.ObjectNotFound):
        reader.stat_object(repo, "main", "p")


def test_a_stat_of_a_branch_replaced_by_a_tag_reads_the_tag(graveler, repo):
    """The hint of a branch that no longer exists: the ref is resolved again (a tag of the
    same name now), never read as the old branch."""
    reader = _reader_of(graveler)
    graveler.create_branch(repo, "x", "main")
    graveler.put_objects(repo, "x", [entry("staged", checksum="s")])
    assert reader.stat_object(repo, "x", "staged").checksum == "s"
    graveler.delete_branch(repo, "x")
    graveler.put_objects(repo, "main", [entry("tagged", checksum="t")])
    graveler.commit(repo, "main", "for the tag")
    graveler.create_tag(repo, "x", "main")
    assert reader.stat_object(repo, "x", "tagged").checksum == "t"
    with pytest.raises(gerrors.ObjectNotFound):
        reader.stat_object(repo, "x", "staged")


def test_dirty_read_optimization_can_be_switched_off(kv_store, committed, tmp_path):
    from quarry.graveler.graveler import Graveler

    g = Graveler(kv_store, committed, committed, dirty_read_optimization=False)
    g.create_repository("demo", str(tmp_path))
    kv_store.reset()
    with pytest.raises(gerrors.ObjectNotFound):
        g.stat_object("demo", "main", "a")
    assert kv_store.total(cls="staging") == 1


def test_write_costs(graveler, repo, kv_store):
    graveler.put_objects(repo, "main", [entry("warm")])
    kv_store.reset()
    graveler.put_objects(repo, "main", [entry(f"p{i}") for i in range(50)])
    # One batch write of 50 staged items, one validation batch read (repo + branch).
    assert kv_store.total(cls="staging") == 50
    assert kv_store.total(op="batch_get") == 2
    assert kv_store.total(op="set_if") == 0  # already dirty: no branch update


def test_bad_input_is_refused_without_change(graveler, repo):
    before = graveler.get_branch(repo, "main")
    with pytest.raises(gerrors.InvalidPath):
        graveler.put_objects(repo, "main", [entry("x" * 1025)])
    with pytest.raises(gerrors.InvalidEntry):
        graveler.put_objects(
            repo, "main", [entry("ok"), Entry("big", "a", 1, "c", metadata={"k": "v" * 9000})]
        )
    with pytest.raises(gerrors.BranchNotFound):
        graveler.put_objects(repo, "nope", [entry("a")])
    with pytest.raises(gerrors.RepositoryNotFound):
        graveler.put_objects("missing-repo", "main", [entry("a")])
    with pytest.raises(errors.InvalidArgument):
        graveler.put_objects(repo, "main", [entry("")])
    assert graveler.get_branch(repo, "main") == before
    assert graveler.list_objects(repo, "main")[0] == []


def test_writing_to_a_tag_says_it_is_not_a_branch(graveler, repo):
    graveler.create_tag(repo, "v1", "main")
    with pytest.raises(gerrors.NotABranch):
        graveler.put_objects(repo, "v1", [entry("a")])
    with pytest.raises(gerrors.NotABranch):
        graveler.diff_uncommitted(repo, "v1")
    with pytest.raises(errors.InvalidArgument):
        graveler.list_objects(repo, "main", page_size=-1)


def test_writes_right_after_delete_and_recreate_land_in_the_new_repository(
    graveler, repo, tmp_path
):
    from quarry.graveler.graveler import Graveler

    # A second process's core has the old repository record cached.
    other = Graveler(graveler.kv, graveler.committed, graveler.range_writer)
    other.put_objects(repo, "main", [entry("before")])
    graveler.delete_repository(repo)
    graveler.create_repository(repo, str(tmp_path / "again"))
    other.put_objects(repo, "main", [entry("after")])  # stale cache: must not fail or vanish
    other.put_objects(repo, "main", [entry("absent")], if_absent=True)
    assert [e.path for e in graveler.list_objects(repo, "main")[0]] == ["absent", "after"]
