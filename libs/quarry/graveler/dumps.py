"""Repository dumps (lakeFS's refs-dump / refs-restore): a repository's refs out of a running
installation, and into a new repository of this or another installation, over the storage
namespace that holds its data.

A dump is a sequence of RepositoryDumpRecords (quarry.v1, branch_manager.proto):

    header    the repository (name, namespace, default branch, instance id, staging shards),
              the installation and storage format it was dumped from, and the branches that
              had uncommitted changes (which a dump does not hold)
    branch*   each branch's head commit id
    tag*
    gc_rules? branch_protection?
    commit*   every commit of the repository
    end       the counts, so a truncated dump is refused

Branches and tags are read before the commits: commits are immutable and only ever added,
so every commit a dumped head or tag names, and all its ancestry, is among those listed
afterwards. A commit made while the dump runs may be listed without its parent (the listing
is in id order, and its parent may sort before the listing's position): a dump holds only
the commits whose whole ancestry it holds, so it is always restorable. The ranges,
metaranges and uploaded objects are not in a dump: they stay in the namespace, and the
entries name their objects by address in it, so a dump restores only over that namespace
(the same location, reached again: after a deletion, or from another installation).

Restore reads and checks the WHOLE dump before it writes anything (record order, names,
ids, every parent, head and tag among the dumped commits, each commit's generation one above
its parents' -- so no cycle --, timestamps and sizes, the counts) and that the namespace holds
every head's and tag's metarange, then creates the repository the way creation does (quarry.graveler.repositories: announced, namespace
claimed by its ownership marker, records written, the repository record last, so a failed
restore leaves nothing visible and can simply be run again).

Safety rule — a restore must never claim a namespace that:
  * is not the dumped repository's (DUMP_NAMESPACE_MISMATCH: its entries would read, and
    its GC-less copy would depend on, another namespace's objects);
  * a repository of this installation uses (equal to, inside or containing its namespace:
    the same check as creation);
  * holds no ownership marker but other files (it is not a Quarry namespace), or a marker
    of a creation in progress;
  * belongs to another installation, unless the caller says that installation no longer
    uses it (adopt_namespace), and even then only if its marker names the dumped repository.
    That match guards against a mistake, not an adversary (the header is the caller's):
    the authority is fs:ImportFromStorage on the namespace plus adopt_namespace, because a
    lost installation (the point of a dump) cannot release its namespaces itself.
And it never makes visible a repository whose heads or tags name a metarange the namespace
does not hold (DUMP_DATA_MISSING, checked before the namespace is claimed). Unlike creation,
it does not ask the namespace to hold only Quarry's files: it holds a repository's data by
design, and GC never deletes a file Quarry did not write.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from google.protobuf.timestamp_pb2 import Timestamp

import quarry
from quarry import FORMAT_VERSION, errors
from quarry.batching import batches
from quarry.blob.namespace import canonical_storage_namespace
from quarry.blob.ownership import NamespaceClaim, NamespaceNotEmpty
from quarry.graveler import errors as gerrors
from quarry.graveler import layout, names, protection
from quarry.graveler.core import now_seconds
from quarry.graveler.refs import Repository, is_dirty
from quarry.graveler.resolution import COMMIT_ID_HEX
from quarry.graveler.staging import new_token
from quarry.kv import store as kv
from quarry.paging import every_item
from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import types_pb2

if TYPE_CHECKING:
    from quarry.graveler.repositories import Repositories

DUMP_VERSION = 1
# Records per streamed message, and their bytes: far under gRPC's 4 MiB message limit
# (a commit is a few hundred bytes; its metadata can make one much larger).
RECORDS_PER_MESSAGE = 500
MESSAGE_BYTES = 1 << 20
LIST_PAGE = 1000
_COMMIT_ID = re.compile(f"[0-9a-f]{{{COMMIT_ID_HEX}}}")

Record = bm.RepositoryDumpRecord


class CorruptDump(errors.InvalidArgument):
    reason = "CORRUPT_DUMP"


class DumpFormatMismatch(errors.FailedPrecondition):
    reason = "DUMP_FORMAT_MISMATCH"


class DumpDataMissing(errors.FailedPrecondition):
    reason = "DUMP_DATA_MISSING"


class NamespaceOfAnotherInstallation(errors.FailedPrecondition):
    reason = "NAMESPACE_OF_ANOTHER_INSTALLATION"


class DumpNamespaceMismatch(errors.FailedPrecondition):
    reason = "DUMP_NAMESPACE_MISMATCH"


@dataclasses.dataclass
class Dump:
    """A dump read and checked in full (read_dump)."""

    header: bm.RepositoryDumpHeader
    branches: list[bm.RepositoryDumpBranch]
    tags: list[types_pb2.Tag]
    gc_rules: types_pb2.GarbageCollectionRules | None
    protection: list[bm.BranchProtectionRule]
    commits: dict[str, types_pb2.Commit]


@dataclasses.dataclass(frozen=True)
class Restored:
    repository: Repository
    branches: int
    tags: int
    commits: int


# ---- dump -------------------------------------------------------------------------------


def dump_repository(repositories: Repositories, name: str) -> Iterator[Record]:
    """The records of a dump of repository `name`, in order (see the module docstring). A
    corrupt record fails the dump (DATA_LOSS) rather than leaving it out."""
    core = repositories.core
    refs = core.refs
    repo = repositories.get_repository(name)
    branches = list(every_item(lambda a, n: refs.list_branches(repo, a, n), lambda b: b.name))
    tags = list(every_item(lambda a, n: refs.list_tags(repo, a, n), lambda t: t.name))
    try:
        gc_rules: types_pb2.GarbageCollectionRules | None = refs.get_gc_rules(repo)
    except gerrors.GarbageCollectionRulesNotFound:
        gc_rules = None
    rules, _ = core.protection.get(repo)
    header = bm.RepositoryDumpHeader(
        dump_version=DUMP_VERSION,
        repository=repo.to_proto(),
        installation_id=repositories.installation_id(),
        format_version=FORMAT_VERSION,
        quarry_version=quarry.__version__,
        branches_with_uncommitted_changes=[
            b.name for b in branches if _has_uncommitted_changes(repositories, repo, b)
        ],
    )
    header.created.GetCurrentTime()
    yield Record(header=header)
    for branch in branches:
        yield Record(branch=bm.RepositoryDumpBranch(name=branch.name, commit_id=branch.commit_id))
    for tag in tags:
        yield Record(tag=tag)
    if gc_rules is not None:
        yield Record(gc_rules=gc_rules)
    if rules:
        yield Record(branch_protection=bm.RepositoryDumpProtection(rules=rules))
    listed = {
        c.id: c for c in every_item(lambda a, n: refs.list_commits(repo, a, n), lambda c: c.id)
    }
    complete = _with_whole_ancestry(listed)
    for commit in complete:
        yield Record(commit=commit)
    yield Record(
        end=bm.RepositoryDumpEnd(branches=len(branches), tags=len(tags), commits=len(complete))
    )


def _with_whole_ancestry(commits: dict[str, types_pb2.Commit]) -> list[types_pb2.Commit]:
    """The commits whose every ancestor is among `commits`, parents first: a commit made
    during the listing may be there without its parent (module docstring), and is left out
    with its descendants. Every head and tag read before the listing keeps its ancestry."""
    complete: dict[str, types_pb2.Commit] = {}
    for commit in sorted(commits.values(), key=lambda c: (c.generation, c.id)):
        if all(parent in complete for parent in commit.parents):
            complete[commit.id] = commit
    return list(complete.values())


def _has_uncommitted_changes(
    repositories: Repositories, repo: Repository, branch: types_pb2.Branch
) -> bool:
    """Whether `branch` holds a change its head does not (the dirty flag alone may be set
    on a branch whose staged writes were all undone)."""
    if not (is_dirty(branch) or branch.sealed_tokens or branch.compacted_metarange_id):
        return False
    try:
        changes, _ = repositories.reads.diff_uncommitted(repo.name, branch.name, page_size=1)
    except gerrors.BranchNotFound:
        return False  # deleted since it was listed
    return bool(changes)


def messages(records: Iterable[Record]) -> Iterator[list[Record]]:
    """`records` in the batches one streamed message carries."""
    return batches(records, RECORDS_PER_MESSAGE, MESSAGE_BYTES, lambda r: r.ByteSize())


# ---- reading a dump ---------------------------------------------------------------------

# The order records come in: a kind may follow only kinds of the same or a later rank.
_RANK = {"branch": 1, "tag": 2, "gc_rules": 3, "branch_protection": 4, "commit": 5}


def read_dump(records: Iterable[Record]) -> Dump:
    """The dump, checked in full: CorruptDump for anything out of order, missing, repeated
    or inconsistent; DumpFormatMismatch for a dump of another storage format."""
    it = iter(records)
    first = next(it, None)
    if first is None or first.WhichOneof("record") != "header":
        raise CorruptDump("a repository dump starts with its header record")
    header = first.header
    if header.dump_version != DUMP_VERSION:
        raise CorruptDump(
            f"dump version {header.dump_version} is not one this build reads ({DUMP_VERSION})"
        )
    _check_time(header.created, "the dump's header")
    if header.format_version != FORMAT_VERSION:
        raise DumpFormatMismatch(
            f"the dump is of storage format {header.format_version}, this build's is "
            f"{FORMAT_VERSION}: restore it with a build of format {header.format_version}, "
            f"then rebuild with `quarry store export` / `quarry store import`",
            metadata={"dump_format": str(header.format_version)},
        )
    dump = Dump(header, [], [], None, [], {})
    rank = 0
    end: bm.RepositoryDumpEnd | None = None
    for record in it:
        kind = record.WhichOneof("record")
        if end is not None:
            raise CorruptDump("records after the dump's end record")
        if kind == "end":
            end = record.end
            continue
        if kind not in _RANK or _RANK[kind] < rank:
            raise CorruptDump(f"a {kind or 'empty'} record out of place in the dump")
        if kind in ("gc_rules", "branch_protection") and _RANK[kind] == rank:
            raise CorruptDump(f"two {kind} records in the dump")
        rank = _RANK[kind]
        _take(dump, record, kind)
    if end is None:
        raise CorruptDump("the dump has no end record: it is truncated")
    counts = (len(dump.branches), len(dump.tags), len(dump.commits))
    if counts != (end.branches, end.tags, end.commits):
        raise CorruptDump(
            f"the dump holds {counts[0]} branches, {counts[1]} tags and {counts[2]} commits; "
            f"its end record says {end.branches}, {end.tags} and {end.commits}"
        )
    _check_references(dump)
    return dump


# A record written as one KV item (a commit, the rules) must fit one; checked before the
# namespace is claimed, so a restore never fails on it after (DynamoDB's item limit, less
# room for the key and the record's framing).
MAX_RECORD_BYTES = kv.MAX_ITEM_BYTES - 16 * 1024
# Commits here have one parent, or two for a merge.
MAX_PARENTS = 2


def _take(dump: Dump, record: Record, kind: str) -> None:
    if record.ByteSize() > MAX_RECORD_BYTES:
        raise CorruptDump(f"a {kind} record of the dump is larger than a record can be")
    try:
        if kind == "branch":
            names.check_branch_name(record.branch.name)
            dump.branches.append(record.branch)
        elif kind == "tag":
            names.check_tag_name(record.tag.name)
            dump.tags.append(record.tag)
        elif kind == "gc_rules":
            from quarry.retention import RetentionRules

            for branch in record.gc_rules.branch_retention_days:
                names.check_branch_name(branch)
            RetentionRules.from_proto(record.gc_rules)
            dump.gc_rules = record.gc_rules
        elif kind == "branch_protection":
            dump.protection = protection.check_rules(record.branch_protection.rules)
        else:
            # Deferred: the committed package loads Arrow, which the core loads only when
            # it reads committed data (tests/unit/test_import_cost.py).
            from quarry.committed.loader import check_metarange_id

            commit = record.commit
            if not _COMMIT_ID.fullmatch(commit.id):
                raise CorruptDump(f"commit id {commit.id!r} is not a commit id")
            check_metarange_id(commit.metarange_id)
            if commit.id in dump.commits:
                raise CorruptDump(f"commit {commit.id} appears twice in the dump")
            _check_commit_fields(commit)
            dump.commits[commit.id] = commit
    except errors.InvalidArgument as exc:
        if isinstance(exc, CorruptDump):
            raise
        raise CorruptDump(f"a {kind} record of the dump is invalid: {exc.message}") from None


def _check_commit_fields(commit: types_pb2.Commit) -> None:
    """What a commit made here could hold: one or two distinct parents, a valid time, sizes
    within the limits."""
    if len(commit.parents) > MAX_PARENTS or len(set(commit.parents)) != len(commit.parents):
        raise CorruptDump(f"commit {commit.id} has {len(commit.parents)} parents")
    _check_time(commit.creation_time, f"commit {commit.id}")
    if (
        len(commit.message.encode()) > names.MAX_MESSAGE_BYTES
        or len(commit.committer.encode()) > names.MAX_MESSAGE_BYTES
        or sum(len(k.encode()) + len(v.encode()) for k, v in commit.metadata.items())
        > names.MAX_METADATA_BYTES
    ):
        raise CorruptDump(f"commit {commit.id}'s message, committer or metadata is too large")


def _check_time(stamp: Timestamp, what: str) -> None:
    """A Timestamp every reader can show (years 1-9999, nanos 0..1e9-1)."""
    try:
        stamp.ToJsonString()
    except ValueError:
        raise CorruptDump(f"{what} has an invalid time") from None


def _check_references(dump: Dump) -> None:
    """Every branch and tag names a dumped commit, every parent is dumped, names are unique,
    the default branch is among the branches."""
    for kind, named in (("branch", dump.branches), ("tag", dump.tags)):
        seen: set[str] = set()
        for item in named:
            if item.name in seen:
                raise CorruptDump(f"{kind} {item.name!r} appears twice in the dump")
            seen.add(item.name)
            if item.commit_id not in dump.commits:
                raise CorruptDump(
                    f"{kind} {item.name!r} names commit {item.commit_id!r}, which the dump "
                    f"does not hold"
                )
    for commit in dump.commits.values():
        for parent in commit.parents:
            if parent not in dump.commits:
                raise CorruptDump(
                    f"commit {commit.id} names parent {parent!r}, which the dump does not hold"
                )
        # One above its highest parent (1 for a root), as every commit here is made: no
        # cycle can pass (a log or GC walk of one would never end).
        expected = 1 + max((dump.commits[p].generation for p in commit.parents), default=0)
        if commit.generation != expected:
            raise CorruptDump(
                f"commit {commit.id} has generation {commit.generation}, not {expected} "
                f"(one above its parents')"
            )
    default = dump.header.repository.default_branch
    if default not in {b.name for b in dump.branches}:
        raise CorruptDump(f"the dump has no record of its default branch {default!r}")


# ---- restore ----------------------------------------------------------------------------


def restore_repository(
    repositories: Repositories,
    name: str,
    storage_namespace: str,
    records: Iterable[Record],
    adopt_namespace: bool = False,
) -> Restored:
    """A new repository `name` from a dump, over `storage_namespace` (module docstring)."""
    names.check_repository_name(name)
    dump = read_dump(records)
    storage_namespace = canonical_storage_namespace(storage_namespace)
    repositories.core.addresses.check_namespace(storage_namespace)
    dumped = dump.header.repository
    if storage_namespace != dumped.storage_namespace:
        raise DumpNamespaceMismatch(
            f"the dumped repository's entries name their objects in {dumped.storage_namespace}: "
            f"a dump restores only over that namespace, not {storage_namespace}",
            metadata={"storage_namespace": storage_namespace, "dumped": dumped.storage_namespace},
        )
    repo = Repository(
        name=name,
        storage_namespace=storage_namespace,
        default_branch=dumped.default_branch,
        instance_id=uuid.uuid4().hex,
        creation_time=now_seconds(),
        staging_shards=dumped.staging_shards or 1,
    )

    def check_reusable(ns: str, claim: NamespaceClaim) -> None:
        _check_restorable(repositories, dump.header, adopt_namespace, ns, claim)

    def fill(repo: Repository) -> None:
        _write_records(repositories, repo, dump)

    # Read-only, before anything is claimed: a refusal leaves the namespace's marker as it was.
    _check_data(repositories, repo, dump)
    repositories.create_instance(repo, fill, check_reusable)
    return Restored(repo, len(dump.branches), len(dump.tags), len(dump.commits))


def _check_restorable(
    repositories: Repositories,
    header: bm.RepositoryDumpHeader,
    adopt_namespace: bool,
    ns: str,
    claim: NamespaceClaim,
) -> None:
    """Raise unless the marker found in `ns` may be replaced by a restore of `header`'s
    repository (the safety rule in the module docstring)."""
    found = repositories.parse_claimed_marker(ns, claim)
    meta = {
        "storage_namespace": ns,
        "other_repository": found.repository,
        "other_instance_id": found.instance_id,
    }
    dumped = header.repository
    if found.installation_id != repositories.installation_id():
        names_dumped = (found.repository, found.instance_id, found.installation_id) == (
            dumped.name,
            dumped.instance_id,
            header.installation_id,
        )
        if not names_dumped:
            raise NamespaceNotEmpty(
                f"storage namespace {ns} belongs to repository {found.repository!r} of another "
                f"Quarry installation, not to the dumped repository {dumped.name!r}",
                metadata=meta,
            )
        if not adopt_namespace:
            raise NamespaceOfAnotherInstallation(
                f"storage namespace {ns} belongs to repository {found.repository!r} of another "
                f"Quarry installation: restore over it only once that installation no longer "
                f"uses it (it would collect garbage there too), with adopt_namespace "
                f"(`--adopt-namespace`)",
                metadata=meta,
            )
    else:
        repositories.check_instance_gone(ns, found, meta)


def _check_data(repositories: Repositories, repo: Repository, dump: Dump) -> None:
    """DumpDataMissing unless the namespace holds every file the heads' and tags' commits
    read: their metaranges and every range they list (a partial copy restored would be a
    visible, broken repository)."""
    heads = [b.commit_id for b in dump.branches] + [t.commit_id for t in dump.tags]
    needed = sorted({dump.commits[commit_id].metarange_id for commit_id in heads})
    missing = repositories.core.committed.missing_files(repo.storage_namespace, needed)
    if missing:
        raise DumpDataMissing(
            f"storage namespace {repo.storage_namespace} does not hold {len(missing)} "
            f"file(s) the dumped heads and tags read (e.g. {missing[0]}): restore over the "
            f"namespace holding the dumped repository's data, complete",
            metadata={"storage_namespace": repo.storage_namespace, "missing": missing[0]},
        )


def _write_records(repositories: Repositories, repo: Repository, dump: Dump) -> None:
    """Commits first, then tags, rules and branches (each branch with a new, empty staging
    token): all in the new instance's partition, invisible until the repository record."""
    core, refs = repositories.core, repositories.refs
    commits = [
        (repo.partition, layout.commit_key(c.id), layout.encode_commit(c))
        for c in dump.commits.values()
    ]
    for start in range(0, len(commits), LIST_PAGE):
        core.kv.batch_set(commits[start : start + LIST_PAGE])
    for tag in dump.tags:
        refs.insert_tag(repo, tag)
    if dump.gc_rules is not None:
        refs.set_gc_rules(repo, dump.gc_rules)
    if dump.protection:
        core.protection.set(repo, dump.protection)
    for branch in dump.branches:
        refs.insert_branch(
            repo,
            types_pb2.Branch(
                name=branch.name,
                commit_id=branch.commit_id,
                staging_token=new_token(repo.staging_shards),
                dirty=False,
            ),
        )
