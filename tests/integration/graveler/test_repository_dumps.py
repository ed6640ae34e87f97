"""Repository dumps (quarry.graveler.dumps; lakeFS's refs-dump / refs-restore) through real
branch-managers over gRPC: a dump restores the same history, heads, tags and rules under a new
name, in this installation after a deletion and in another one over the same namespace; and
every refusal of the safety rule leaves nothing visible and the namespace's marker untouched."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import grpc
import pytest

from quarry import errors
from quarry.blob.ownership import MARKER_KEY, build_marker, parse_marker
from quarry.client import Client
from quarry.client.entries import make_entry
from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import types_pb2
from support.suite import suite_fixture

here = suite_fixture(name="here")
there = suite_fixture(name="there")  # another installation: its own KV store


@pytest.fixture
def client(here):
    with here.client(timeout=60) as c:
        yield c


@pytest.fixture
def other(there):
    with there.client(timeout=60) as c:
        yield c


def name() -> str:
    return f"dump-{uuid.uuid4().hex[:10]}"


def history(client: Client, repo: str) -> dict[str, object]:
    """What a restore must reproduce: every branch's log, the tags, rules and objects."""
    branches = {b.name: b.commit_id for b in client.iter_branches(repo)}
    return {
        "branches": branches,
        "logs": {b: [c.id for c in client.iter_log(repo, b)] for b in branches},
        "tags": {t.name: t.commit_id for t in client.iter_tags(repo)},
        "gc": client.get_gc_rules(repo),
        "protection": list(client.get_branch_protection_rules(repo)[0]),
        "objects": {
            b: [(e.path, e.physical_address, e.checksum) for e in client.iter_objects(repo, b)]
            for b in branches
        },
    }


def populated(client: Client, namespace: str) -> str:
    """A repository with two branches, a merge, a tag, rules, and a change left staged."""
    repo = name()
    client.create_repository(repo, namespace)
    client.put_objects(repo, "main", [make_entry("a", f"{namespace}/data/a", 1, "ca")])
    client.commit(repo, "main", "a")
    client.create_branch(repo, "dev", "main")
    client.put_objects(repo, "dev", [make_entry("b", f"{namespace}/data/b", 2, "cb")])
    client.commit(repo, "dev", "b")
    client.merge(repo, "dev", "main")
    client.create_tag(repo, "v1", "main")
    client.set_gc_rules(repo, 7, {"dev": 1})
    client.set_branch_protection_rules(
        repo,
        [
            bm.BranchProtectionRule(
                pattern="main", blocked_actions=[bm.BRANCH_PROTECTION_BLOCKED_ACTION_STAGING_WRITE]
            )
        ],
    )
    client.put_objects(repo, "dev", [make_entry("staged", f"{namespace}/data/s", 3, "cs")])
    return repo


def refused(code: grpc.StatusCode, reason: str, call, *args, **kwargs) -> None:
    with pytest.raises(errors.QuarryError) as caught:
        call(*args, **kwargs)
    assert (caught.value.code, caught.value.reason) == (code, reason), caught.value


def copied(records: list) -> list:
    """A dump's records, copied to be edited."""
    copies = [bm.RepositoryDumpRecord() for _ in records]
    for copy, record in zip(copies, records, strict=True):
        copy.CopyFrom(record)
    return copies


def marker_of(namespace: str):
    return parse_marker((Path(namespace) / MARKER_KEY).read_bytes())


def test_a_dump_restores_history_heads_tags_and_rules_after_the_repository_is_deleted(here, client):
    namespace = here.namespace(name())
    repo = populated(client, namespace)
    before = history(client, repo)
    records = list(client.dump_repository(repo))
    header = records[0].header
    assert header.branches_with_uncommitted_changes == ["dev"]
    assert records[-1].end.commits == len({c for log in before["logs"].values() for c in log})

    client.delete_repository(repo)
    restored = client.restore_repository("restored-" + repo, namespace, records)
    assert (restored.branches, restored.tags) == (2, 1)
    assert history(client, "restored-" + repo) == {
        **before,
        # The staged change is not in a dump; the committed objects all are.
        "objects": {
            **before["objects"],
            "dev": [o for o in before["objects"]["dev"] if o[0] != "staged"],
        },
    }
    marker = marker_of(namespace)
    assert (marker.repository, marker.instance_id) == (
        "restored-" + repo,
        restored.repository.instance_id,
    )
    # The rules came along: main still refuses staging writes.
    refused(
        grpc.StatusCode.FAILED_PRECONDITION,
        "BRANCH_PROTECTED",
        client.put_objects,
        "restored-" + repo,
        "main",
        [make_entry("x", f"{namespace}/data/x", 1, "cx")],
    )
    # And the restored repository works as any: a new commit on the restored head.
    client.put_objects("restored-" + repo, "dev", [make_entry("c", f"{namespace}/data/c", 1, "cc")])
    commit = client.commit("restored-" + repo, "dev", "after the restore").commit
    assert list(commit.parents) == [before["branches"]["dev"]]


def test_a_restore_never_claims_the_namespace_of_a_live_repository(here, client):
    namespace = here.namespace(name())
    repo = populated(client, namespace)
    records = list(client.dump_repository(repo))
    marker = (Path(namespace) / MARKER_KEY).read_bytes()
    refused(
        grpc.StatusCode.FAILED_PRECONDITION,
        "NAMESPACE_IN_USE",
        client.restore_repository,
        "thief-" + repo,
        namespace,
        records,
    )
    # Nor inside or around it: a dump of a repository at its first commit (the empty
    # metarange: no file to find), its header edited to name those places.
    fresh = name()
    client.create_repository(fresh, here.namespace(fresh))
    records = list(client.dump_repository(fresh))
    for target in (f"{namespace}/inside", str(Path(namespace).parent)):
        records[0].header.repository.storage_namespace = target
        refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            "NAMESPACE_IN_USE",
            client.restore_repository,
            "thief-" + repo,
            target,
            records,
        )
    assert (Path(namespace) / MARKER_KEY).read_bytes() == marker
    assert [r.name for r in client.iter_repositories() if r.name == "thief-" + repo] == []


def test_a_dump_restores_only_over_its_own_namespace(here, client):
    """Entries name their objects by address in the dumped namespace: restored over a copy
    they would read the original's objects, which its GC may delete (tester hAG)."""
    namespace = here.namespace(name())
    repo = populated(client, namespace)
    records = list(client.dump_repository(repo))
    copy = here.namespace(name())
    shutil.rmtree(copy)
    shutil.copytree(namespace, copy)
    marker = (Path(copy) / MARKER_KEY).read_bytes()
    refused(
        grpc.StatusCode.FAILED_PRECONDITION,
        "DUMP_NAMESPACE_MISMATCH",
        client.restore_repository,
        "clone-" + repo,
        copy,
        records,
    )
    assert (Path(copy) / MARKER_KEY).read_bytes() == marker


def test_another_installation_adopts_the_namespace_only_when_told_to(here, client, other):
    namespace = here.namespace(name())
    repo = populated(client, namespace)
    before = history(client, repo)
    records = list(client.dump_repository(repo))
    marker = (Path(namespace) / MARKER_KEY).read_bytes()
    refused(
        grpc.StatusCode.FAILED_PRECONDITION,
        "NAMESPACE_OF_ANOTHER_INSTALLATION",
        other.restore_repository,
        repo,
        namespace,
        records,
    )
    assert (Path(namespace) / MARKER_KEY).read_bytes() == marker
    assert [r.name for r in other.iter_repositories()] == []

    other.restore_repository(repo, namespace, records, adopt_namespace=True)
    after = history(other, repo)
    assert after["logs"] == before["logs"] and after["tags"] == before["tags"]
    assert marker_of(namespace).installation_id != parse_marker(marker).installation_id


def test_adopting_needs_a_marker_that_names_the_dumped_repository(here, client, other):
    """A dump of one repository cannot be pointed at another repository's namespace of
    another installation, even with adopt_namespace."""
    first, second = here.namespace(name()), here.namespace(name())
    repo = name()
    client.create_repository(repo, first)  # its head reads the empty metarange: no file
    populated(client, second)
    records = list(client.dump_repository(repo))
    # A header edited to name the second namespace: its marker names another repository.
    records[0].header.repository.storage_namespace = second
    marker = (Path(second) / MARKER_KEY).read_bytes()
    refused(
        grpc.StatusCode.FAILED_PRECONDITION,
        "NAMESPACE_NOT_EMPTY",
        other.restore_repository,
        repo,
        second,
        records,
        adopt_namespace=True,
    )
    assert (Path(second) / MARKER_KEY).read_bytes() == marker


def test_a_namespace_without_its_marker_or_its_data_is_refused_before_any_claim(here, client):
    namespace = here.namespace(name())
    repo = populated(client, namespace)
    records = list(client.dump_repository(repo))
    client.delete_repository(repo)
    marker_file = Path(namespace) / MARKER_KEY

    # No ownership marker, files there: not (any longer) a Quarry namespace.
    marker = marker_file.read_bytes()
    marker_file.unlink()
    refused(
        grpc.StatusCode.FAILED_PRECONDITION,
        "NAMESPACE_NOT_EMPTY",
        client.restore_repository,
        "r-" + repo,
        namespace,
        records,
    )
    assert not marker_file.exists()
    marker_file.write_bytes(marker)

    # A head's metarange gone: refused before the claim (the marker as it was), nothing
    # visible, and the restore works once the file is back.
    head = next(
        r.commit
        for r in records
        if r.WhichOneof("record") == "commit" and r.commit.id == records[1].branch.commit_id
    )
    metarange = next(Path(namespace).rglob(f"*{head.metarange_id}*"))
    saved = metarange.read_bytes()
    metarange.unlink()
    refused(
        grpc.StatusCode.FAILED_PRECONDITION,
        "DUMP_DATA_MISSING",
        client.restore_repository,
        "r-" + repo,
        namespace,
        records,
    )
    assert marker_file.read_bytes() == marker
    assert [r.name for r in client.iter_repositories() if r.name == "r-" + repo] == []
    metarange.write_bytes(saved)
    client.restore_repository("r-" + repo, namespace, records)


def test_a_truncated_or_inconsistent_dump_writes_nothing(here, client):
    namespace = here.namespace(name())
    repo = populated(client, namespace)
    records = list(client.dump_repository(repo))
    client.delete_repository(repo)
    marker = (Path(namespace) / MARKER_KEY).read_bytes()
    head = records[0]
    commits = [r for r in records if r.WhichOneof("record") == "commit"]
    orphan = bm.RepositoryDumpRecord()
    orphan.CopyFrom(commits[-1])
    orphan.commit.parents[:] = ["f" * 64]
    broken = {
        "no end record": records[:-1],
        "no header": records[1:],
        "counts that do not match": records[:-2] + records[-1:],
        "a parent not in the dump": [*records[:-2], orphan, records[-1]],
        "records after the end": [*records, records[1]],
        "a header in the middle": [head, head, *records[1:]],
    }
    for what, dump in broken.items():
        with pytest.raises(errors.QuarryError) as caught:
            client.restore_repository("r-" + repo, namespace, dump)
        assert (caught.value.code, caught.value.reason) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "CORRUPT_DUMP",
        ), what
    assert (Path(namespace) / MARKER_KEY).read_bytes() == marker
    assert [r.name for r in client.iter_repositories() if r.name == "r-" + repo] == []


def test_a_dump_of_another_storage_format_is_refused(here, client):
    namespace = here.namespace(name())
    repo = populated(client, namespace)
    records = list(client.dump_repository(repo))
    client.delete_repository(repo)
    records[0].header.format_version += 1
    refused(
        grpc.StatusCode.FAILED_PRECONDITION,
        "DUMP_FORMAT_MISMATCH",
        client.restore_repository,
        "r-" + repo,
        namespace,
        records,
    )


def test_dumping_a_missing_repository_is_not_found(client):
    with pytest.raises(errors.QuarryError) as caught:
        list(client.dump_repository("no-such-repo"))
    assert caught.value.code == grpc.StatusCode.NOT_FOUND


def test_a_namespace_claimed_by_a_creation_in_progress_is_in_use(here, client):
    """A marker of this installation naming an instance that is neither live nor deleted is
    a creation in flight (or interrupted): a restore must not take the namespace from it."""
    namespace = here.namespace(name())
    repo = populated(client, namespace)
    records = list(client.dump_repository(repo))
    client.delete_repository(repo)
    claimed = marker_of(namespace)
    in_flight = build_marker("creating", uuid.uuid4().hex, claimed.installation_id).to_bytes()
    (Path(namespace) / MARKER_KEY).write_bytes(in_flight)
    refused(
        grpc.StatusCode.FAILED_PRECONDITION,
        "NAMESPACE_IN_USE",
        client.restore_repository,
        "r-" + repo,
        namespace,
        records,
    )
    assert (Path(namespace) / MARKER_KEY).read_bytes() == in_flight


def test_a_dump_holds_only_commits_whose_whole_ancestry_it_holds(here, client):
    """Commits are listed in id order: one made during the listing can come without its
    parent (tester hAG: 13 of 23 dumps taken during commits did not restore). The dump
    leaves such a commit out, and every head and tag read before keeps its ancestry."""
    from quarry.graveler import dumps

    namespace = here.namespace(name())
    repo = populated(client, namespace)
    listed = {c.id: c for c in client.iter_log(repo, "main")}
    orphan = types_pb2.Commit(id="e" * 64, parents=["f" * 64], generation=9)
    child = types_pb2.Commit(id="0" * 64, parents=[orphan.id], generation=10)
    kept = dumps._with_whole_ancestry({**listed, orphan.id: orphan, child.id: child})
    assert {c.id for c in kept} == set(listed)
    positions = {c.id: i for i, c in enumerate(kept)}
    assert all(positions[p] < positions[c.id] for c in kept for p in c.parents)


def test_commits_that_could_not_have_been_made_here_are_corrupt(here, client):
    """A cycle (a log or GC walk would never end), a generation out of line, a time no
    reader can show, an oversized message: CORRUPT_DUMP, nothing written (tester hAG)."""
    namespace = here.namespace(name())
    repo = populated(client, namespace)
    records = list(client.dump_repository(repo))
    client.delete_repository(repo)
    commits = [i for i, r in enumerate(records) if r.WhichOneof("record") == "commit"]
    root = next(i for i in commits if not records[i].commit.parents)
    head = records[1].branch.commit_id

    def edited(index: int, change) -> list:
        copy = copied(records)
        change(copy[index].commit)
        return copy

    broken = {
        "a cycle": edited(root, lambda c: c.parents.append(head)),
        "a generation out of line": edited(commits[-1], lambda c: setattr(c, "generation", 99)),
        "an invalid time": edited(root, lambda c: setattr(c.creation_time, "seconds", 10**13)),
        "a huge message": edited(root, lambda c: setattr(c, "message", "x" * 70_000)),
        # Refused before the claim, not by the KV store's item limit after it (tester hAH).
        "three parents": edited(commits[-1], lambda c: c.parents.extend(["a" * 64, "b" * 64])),
        "a parent twice": edited(commits[-1], lambda c: c.parents.extend(c.parents[:1])),
    }
    rules = next(i for i, r in enumerate(records) if r.WhichOneof("record") == "gc_rules")
    huge = copied(records)
    huge[rules].gc_rules.branch_retention_days.update(
        {f"branch-{i:05d}-{'x' * 80}": 1.0 for i in range(5000)}
    )
    broken["a record over the item limit"] = huge
    for what, dump in broken.items():
        with pytest.raises(errors.QuarryError) as caught:
            client.restore_repository("r-" + repo, namespace, dump)
        assert caught.value.reason == "CORRUPT_DUMP", (what, caught.value)
    assert [r.name for r in client.iter_repositories() if r.name == "r-" + repo] == []
