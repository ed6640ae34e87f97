"""Garbage collection of a repository's storage namespace, as a Spark job (`quarry gc`).

1. Stale ephemeral branches of Spark writes (older than the TTL) are dropped (dry run: only
   reported, and treated as gone).
2. Staged entries of every branch are read FIRST, branch heads and tags AFTER: a commit
   landing in between moves entries from staging into a commit that the later head read
   sees, so no entry escapes both reads.
3. Commits to keep: quarry.retention.retained_commits (heads, tags, per-branch windows).
4. Referenced: the metaranges of kept commits and of compacted branches, their ranges, and
   (in Spark, read straight from the range files) every physical address in those ranges,
   plus every staged address.
5. Collectable: objects of the namespace that nothing referenced names — data files,
   ranges, metaranges (orphans of lost races, dry runs and old compactions included) —
   and that are older than the grace period (objects of writes, commits and merges in
   flight are younger). Only keys of the exact shapes Quarry writes are candidates
   (quarry.retention.classify): any other file, whatever its age or depth, is never
   touched, and nothing is touched unless the namespace's ownership marker names this
   repository instance.
6. A report goes to `_quarry/gc/reports/<run>.json`; with `sweep` the objects are deleted by
   executors (metaranges, then ranges, then data files).

Not protected: an object that was unreferenced when GC read the references and is staged
again by a client before the sweep ends (lakeFS has the same window); run GC with a grace
period longer than any such re-use.
"""

from __future__ import annotations

import datetime as _dt
import json
import secrets
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from quarry import errors, telemetry
from quarry.blob.layout import GC_REPORTS_PREFIX, gc_report_key, job_of_key
from quarry.retention import (
    COLLECTABLE,
    FOREIGN,
    CommitNode,
    RetentionRules,
    classify,
    retained_commits,
)
from quarry.spark.common import (
    Connection,
    ephemeral_created_at,
    job_of_branch,
    open_client,
)
from quarry.spark.reader import ranges_dataframe
from quarry.spark.sweep import DEFAULT_EPHEMERAL_TTL, sweep_ephemeral_branches
from quarry.v1 import types_pb2

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Row, SparkSession

    from quarry.blob import BlobStore, ObjectInfo
    from quarry.client import Client

DEFAULT_GRACE = _dt.timedelta(hours=6)
REPORTS_PREFIX = GC_REPORTS_PREFIX
SAMPLE_KEYS = 1000
KINDS = ("metarange", "range", "data")
# A writer's temporary file (quarry.blob.layout.TEMP_FILE_KEY) is garbage only past this
# age, whatever the grace period: a file still being written is never one.
LEFTOVER_GRACE = _dt.timedelta(days=1)
# A file is inherited when written this long before the namespace's claim: S3 keeps an
# object's LastModified to the second (a file written just after the claim can read as
# before it), and the store's clock is not the claiming host's.
CLAIM_CLOCK_SLACK_SECONDS = 2.0


class GarbageCollectionUnsafe(errors.FailedPrecondition):
    """A referenced range or metarange is missing: the references cannot be trusted, so
    nothing is deleted."""

    reason = "GC_REFERENCES_INCOMPLETE"


@dataclass
class KindReport:
    count: int = 0
    bytes: int = 0
    sample: list = field(default_factory=list)

    def add(self, key: str, size: int) -> None:
        self.count += 1
        self.bytes += size
        if len(self.sample) < SAMPLE_KEYS:
            self.sample.append(key)


@dataclass
class GCReport:
    run_id: str
    repository: str
    storage_namespace: str
    started_at: str
    policy_time: str
    sweep: bool
    rules: dict
    grace_seconds: float
    commits_scanned: int = 0
    commits_retained: int = 0
    commits_expired: int = 0
    ephemeral_branches: list = field(default_factory=list)
    objects_scanned: int = 0
    objects_in_grace: int = 0
    objects_foreign: int = 0  # files Quarry did not write: never candidates
    # Files written before this repository claimed its namespace (left by a deleted
    # repository whose namespace it reused): never candidates.
    objects_inherited: int = 0
    referenced_ranges: int = 0
    referenced_metaranges: int = 0
    collectable: dict = field(default_factory=lambda: {k: KindReport() for k in KINDS})
    deleted: int = 0
    report_key: str = ""

    @property
    def collectable_count(self) -> int:
        return sum(k.count for k in self.collectable.values())

    def to_dict(self) -> dict:
        doc = asdict(self)
        doc["collectable"] = {k: asdict(v) for k, v in self.collectable.items()}
        return doc


def collect_garbage(  # noqa: PLR0913 — the public keyword API, used by GC jobs and tests
    spark: SparkSession,
    repository: str,
    *,
    rules: RetentionRules | None = None,
    sweep: bool = False,
    now: _dt.datetime | None = None,
    grace: _dt.timedelta = DEFAULT_GRACE,
    ephemeral_ttl: _dt.timedelta = DEFAULT_EPHEMERAL_TTL,
    connection: Connection | None = None,
) -> GCReport:
    """Find (and with `sweep`, delete) what no retained commit or staged entry references.
    `rules` default to the repository's stored rules (or 21 days when it has none). `now`
    is the policy time retention is measured from (default: the real time); the grace
    period and the age of Spark write branches are always measured from the real time (a
    `now` in the future must never make a running write's files or branch look old).
    Safety rule: a negative grace or ephemeral TTL is refused (it would put the cutoff
    after the real time: files still being written would be candidates)."""
    from quarry.blob import open_blob_store

    if grace < _dt.timedelta(0) or ephemeral_ttl < _dt.timedelta(0):
        raise errors.InvalidArgument("the grace period and the ephemeral TTL may not be negative")
    connection = Connection.resolve(spark, connection)
    started = _dt.datetime.now(_dt.UTC)
    policy_time = now or started
    with (
        open_client(connection) as client,
        telemetry.tracer("quarry.spark").start_as_current_span(
            "quarry.gc", attributes={"quarry.repository": repository, "quarry.gc.sweep": sweep}
        ),
    ):
        repo = client.get_repository(repository)
        claimed_at = check_ownership(repo, connection)
        rules = rules or stored_rules(client, repository)
        report = GCReport(
            run_id=f"{started.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}",
            repository=repository,
            storage_namespace=repo.storage_namespace,
            started_at=started.isoformat(),
            policy_time=policy_time.isoformat(),
            sweep=sweep,
            rules=json.loads(rules.to_json()),
            grace_seconds=grace.total_seconds(),
        )
        # A dry run treats the stale branches as gone too: it reports what a sweep does.
        # Their age is real time's, never `now`'s: a job writing now must keep its branch.
        stale = sweep_ephemeral_branches(
            client, repository, ephemeral_ttl, started, dry_run=not sweep
        )
        report.ephemeral_branches = stale
        references = _References(client, repository, set(stale))
        references.read_staging()
        references.read_heads_and_commits()
        kept = retained_commits(
            references.commits, references.heads, references.tagged, rules, policy_time
        )
        report.commits_scanned = len(references.commits)
        report.commits_retained = len(kept & set(references.commits))
        report.commits_expired = report.commits_scanned - report.commits_retained
        metaranges = {
            references.commits[c].metarange_id for c in kept if c in references.commits
        } | references.compacted
        foreign = _foreign_prefixes(client, repository, repo.storage_namespace)
        with open_blob_store(repo.storage_namespace, connection) as store:
            # Objects of other repositories whose namespaces lie inside this one are theirs.
            listing = [o for o in store.list("") if not o.key.startswith(foreign)]
            metaranges, range_ids = _kept_files(store, metaranges, {o.key for o in listing})
            report.referenced_metaranges, report.referenced_ranges = len(metaranges), len(range_ids)
            # Temporary files writers killed mid-write left (local namespaces): data that
            # nothing may reference, collected once older than LEFTOVER_GRACE too (no
            # writer takes that long to finish a file).
            leftovers = store.list_leftovers((started - max(grace, LEFTOVER_GRACE)).timestamp())
            listing += [o for o in leftovers if not o.key.startswith(foreign)]
            candidates = _candidates(listing, started - grace, claimed_at, report)
        # A running Spark job's files are kept whatever their age, staged or not: Spark's
        # writer stages nothing until its job has committed, and a file GC took from its
        # folder before then would be silently missing from the write.
        data_keys = [
            c
            for c in candidates
            if c[2] == "data" and not _of_running_job(c[0], references.running_jobs)
        ]
        orphan_data = _unreferenced_data_keys(
            spark,
            repo.storage_namespace,
            sorted(range_ids),
            references.staged_addresses,
            data_keys,
            connection,
        )
        # kind -> {key: id} of what goes (id: the range or metarange id; "" for data)
        doomed: dict[str, dict[str, str]] = {k: {} for k in KINDS}
        for key, size, kind, ident in sorted(candidates):
            if (
                (kind == "metarange" and ident not in metaranges)
                or (kind == "range" and ident not in range_ids)
                or (kind == "data" and key in orphan_data)
            ):
                report.collectable[kind].add(key, size)
                doomed[kind][key] = ident
        if sweep:
            _recheck(
                references,
                kept,
                range_ids,
                doomed,
                repo.storage_namespace,
                connection,
            )
            for kind in KINDS:  # metaranges before the ranges they list, data last
                report.deleted += _delete(
                    spark, repo.storage_namespace, list(doomed[kind]), connection
                )
        report.report_key = gc_report_key(report.run_id)
        with open_blob_store(repo.storage_namespace, connection) as store:
            store.put(report.report_key, json.dumps(report.to_dict(), indent=2).encode())
        return report


def _of_running_job(key: str, running_jobs: set[str]) -> bool:
    """Whether `key` lies in the folder of a Spark job whose ephemeral branch exists."""
    return job_of_key(key) in running_jobs


def check_ownership(repo: types_pb2.Repository, connection: Connection) -> float | None:
    """GC reads, reports into and deletes from a namespace only when its ownership marker
    (_quarry/repository.json) names this repository and instance: never a namespace that
    another repository, an earlier repository of the same name or nobody claimed. Returns
    when the repository claimed the namespace (epoch seconds; None for a marker of a
    version that did not say)."""
    from quarry.blob import open_blob_store
    from quarry.blob.ownership import (
        MARKER_KEY,
        InvalidMarker,
        NamespaceNotOwned,
        parse_marker,
        read_marker,
    )

    ns = repo.storage_namespace
    meta = {"repository": repo.name, "storage_namespace": ns}
    with open_blob_store(ns, connection) as store:
        data = read_marker(store)
    if data is None:
        raise NamespaceNotOwned(
            f"storage namespace {ns} has no ownership marker ({MARKER_KEY}): GC deletes "
            f"nothing where repository {repo.name!r} is not recorded as the owner",
            metadata=meta,
        )
    try:
        marker = parse_marker(data)
    except InvalidMarker as exc:
        raise NamespaceNotOwned(
            f"storage namespace {ns}: unreadable ownership marker ({exc}); GC deletes nothing",
            metadata=meta,
        ) from None
    if not marker.owns(repo.name, repo.instance_id):
        raise NamespaceNotOwned(
            f"storage namespace {ns} is owned by repository {marker.repository!r} "
            f"(instance {marker.instance_id}), not by {repo.name!r} (instance "
            f"{repo.instance_id}); GC deletes nothing",
            metadata={**meta, "owner": marker.repository, "owner_instance_id": marker.instance_id},
        )
    try:
        return _dt.datetime.fromisoformat(marker.created).timestamp() if marker.created else None
    except ValueError:
        return None


def _foreign_prefixes(client: Client, repository: str, storage_namespace: str) -> tuple[str, ...]:
    """Key prefixes, inside this repository's namespace, of other repositories' namespaces
    (a namespace inside another is fine for the inner one: nothing of the outer one is in
    it). A namespace shared with another repository cannot be collected at all."""
    from quarry.blob import namespace_location as location

    mine = location(storage_namespace)
    prefixes = []
    for other in client.iter_repositories():
        if other.name == repository:
            continue
        theirs = location(other.storage_namespace)
        if theirs == mine:
            raise GarbageCollectionUnsafe(
                f"the storage namespace of {repository!r} is shared with repository "
                f"{other.name!r}: GC cannot tell whose objects are whose",
                metadata={"repository": repository, "other_repository": other.name},
            )
        if theirs[0] == mine[0] and theirs[1].startswith(mine[1]):
            prefixes.append(theirs[1][len(mine[1]) :])
    return tuple(prefixes)


def stored_rules(client: Client, repository: str) -> RetentionRules:
    """The repository's rules (SetGarbageCollectionRules), else the defaults."""
    try:
        return RetentionRules.from_proto(client.get_gc_rules(repository))
    except errors.NotFound as exc:
        if exc.reason != "GC_RULES_NOT_FOUND":
            raise
        return RetentionRules()


class _References:
    """What a repository's branches and tags refer to, read in the safe order."""

    def __init__(self, client: Client, repository: str, ignored_branches: set[str]) -> None:
        self.client, self.repository, self.ignored = client, repository, ignored_branches
        self.staged_addresses: set[str] = set()
        # Spark jobs whose ephemeral branch is still there (running, or not yet swept).
        self.running_jobs: set[str] = set()
        self.compacted: set[str] = set()
        self.heads: dict[str, str] = {}
        self.tagged: set[str] = set()
        self.commits: dict[str, CommitNode] = {}

    def read_staging(self) -> None:
        for branch in self.client.iter_branches(self.repository):
            if branch.name in self.ignored:
                continue
            if ephemeral_created_at(branch.name) is not None:
                self.running_jobs.add(job_of_branch(branch.name))
            if branch.compacted_metarange_id:
                self.compacted.add(branch.compacted_metarange_id)
            try:
                for change in self.client.iter_uncommitted(self.repository, branch.name):
                    if change.type != types_pb2.CHANGE_TYPE_REMOVED:
                        self.staged_addresses.add(change.entry.physical_address)
            except errors.NotFound:
                continue  # deleted meanwhile: its staged entries went with it

    def metaranges_of_new_heads(self, kept: set[str]) -> set[str]:
        """Metaranges that branches and tags use now but did not when first read: new
        commits, compactions, and branches or tags made on commits judged expired."""
        found: set[str] = set()
        starts = []
        for branch in self.client.iter_branches(self.repository):
            starts.append(branch.commit_id)
            if (
                branch.compacted_metarange_id
                and branch.compacted_metarange_id not in self.compacted
            ):
                found.add(branch.compacted_metarange_id)
        starts += [tag.commit_id for tag in self.client.iter_tags(self.repository)]
        seen: set[str] = set()
        for start in starts:
            if start in kept or start in seen:
                continue
            if start in self.commits:  # an expired commit is a head or tag again
                found.add(self.commits[start].metarange_id)
                continue
            # A new commit: walk back until the history already read.
            frontier = [start]
            while frontier:
                commit = self.client.get_commit(self.repository, frontier.pop())
                seen.add(commit.id)
                found.add(commit.metarange_id)
                frontier += [p for p in commit.parents if p not in self.commits and p not in seen]
        return found

    def read_heads_and_commits(self) -> None:
        for branch in self.client.iter_branches(self.repository):
            if branch.name not in self.ignored:
                self.heads[branch.name] = branch.commit_id
                if branch.compacted_metarange_id:
                    self.compacted.add(branch.compacted_metarange_id)
        self.tagged = {tag.commit_id for tag in self.client.iter_tags(self.repository)}
        for start in [*self.heads.values(), *sorted(self.tagged)]:
            if start in self.commits:
                continue  # its whole history was walked already
            for commit in self.client.iter_log(self.repository, start):
                if commit.id in self.commits:
                    continue
                self.commits[commit.id] = CommitNode(
                    commit.id,
                    tuple(commit.parents),
                    commit.creation_time.ToDatetime(tzinfo=_dt.UTC),
                    commit.generation,
                    commit.metarange_id,
                )


def _recheck(
    references: _References,
    kept: set[str],
    kept_ranges: set[str],
    doomed: dict[str, dict[str, str]],
    storage_namespace: str,
    connection: Connection,
) -> None:
    """Just before deleting: what was committed or staged since the references were read
    must not use a file about to go. Content addressing lets a new commit reuse an old
    range or metarange without rewriting it (a branch created from an expired commit), and
    a new range or staged entry point at an old data file (a revert or cherry-pick brings
    back an entry of an expired commit; a copy stages an entry on an old object's bytes).
    If one does, nothing is deleted: the next run sees the new history.

    What it cannot see is a commit or staged entry made after this check while the
    deletion runs: the grace period protects new files, not old ones brought back then."""
    from quarry.blob import open_blob_store
    from quarry.committed.metaranges import read_metarange_tree

    doomed_metaranges = set(doomed["metarange"].values())
    doomed_ranges = set(doomed["range"].values())
    doomed_data = set(doomed["data"])
    new_addresses = _staged_since(references)
    new_metaranges = references.metaranges_of_new_heads(kept)
    with open_blob_store(storage_namespace, connection) as store:
        for metarange_id in new_metaranges:
            pages, ranges = read_metarange_tree(store, metarange_id)
            used = {r.id for r in ranges}
            if (
                metarange_id in doomed_metaranges
                or doomed_metaranges.intersection(pages)
                or used & doomed_ranges
            ):
                raise GarbageCollectionUnsafe(
                    f"a commit made during this run uses files GC was about to delete "
                    f"(metarange {metarange_id}); nothing deleted, run again",
                    metadata={"metarange_id": metarange_id},
                )
            if doomed_data:
                for range_id in sorted(used - kept_ranges):
                    new_addresses |= _addresses_of_range(store, range_id)
    if doomed_data and new_addresses:
        from quarry.blob.layout import referenced_keys

        for address in sorted(new_addresses):
            reused = doomed_data.intersection(referenced_keys(storage_namespace, address))
            if reused:
                raise GarbageCollectionUnsafe(
                    f"an entry committed or staged during this run points at data GC was "
                    f"about to delete ({sorted(reused)[0]}); nothing deleted, run again",
                    metadata={"key": sorted(reused)[0]},
                )


def _staged_since(references: _References) -> set[str]:
    """The addresses staged since `references` read the staging areas (read them again)."""
    before = set(references.staged_addresses)
    references.read_staging()
    return references.staged_addresses - before


def _addresses_of_range(store: BlobStore, range_id: str) -> set[str]:
    """The physical addresses a range file's entries point at."""
    from quarry.committed import format as rformat

    table = rformat.read_tagged_parquet(
        store.get(rformat.range_key(range_id)), "range", rformat.RANGE_FORMAT, ["physical_address"]
    )
    return {a for a in table.column("physical_address").to_pylist() if a}


def _kept_files(
    store: BlobStore, metarange_ids: set[str], existing_keys: set[str]
) -> tuple[set[str], set[str]]:
    """The metarange files (the metaranges and their index pages) and range ids that the
    metaranges keep, checked against the namespace's listing: if a referenced file is
    missing, the references are not trustworthy and GC stops. Must never leave out a page
    of a kept metarange: pages are metarange files, and one GC did not count as kept it
    would delete, leaving the metarange unreadable."""
    from quarry.blob import ObjectNotFound
    from quarry.committed import format as rformat
    from quarry.committed.metaranges import read_metarange_tree

    range_ids: set[str] = set()
    page_ids: set[str] = set()
    pages_read: dict[str, list] = {}  # each page shared by many commits is read once
    for metarange_id in metarange_ids:
        try:
            pages, ranges = read_metarange_tree(store, metarange_id, pages_read)
        except ObjectNotFound:
            raise GarbageCollectionUnsafe(
                f"metarange {metarange_id} of a retained commit (or one of its index pages) "
                f"is missing; nothing deleted",
                metadata={"metarange_id": metarange_id},
            ) from None
        page_ids.update(pages)
        range_ids.update(r.id for r in ranges)
    missing = [rid for rid in range_ids if rformat.range_key(rid) not in existing_keys]
    if missing:
        raise GarbageCollectionUnsafe(
            f"{len(missing)} ranges of retained commits are missing (e.g. {missing[0]}); "
            f"nothing deleted",
            metadata={"range_id": missing[0]},
        )
    return metarange_ids | page_ids, range_ids


def _candidates(
    listing: Iterable[ObjectInfo],
    older_than: _dt.datetime,
    claimed_at: float | None,
    report: GCReport,
) -> list[tuple]:
    """(key, size, kind, id) of every listed object GC may consider: not internal, older
    than the grace period, and written since the repository claimed its namespace.

    Safety rule: a file written before the claim is never a candidate. It was left by a
    deleted repository whose namespace this one reused, and another repository may have
    imported it since (an import may read a deleted repository's folder): it is not this
    repository's to delete, whatever this repository's history says."""
    limit = older_than.timestamp()
    found = []
    for info in listing:
        report.objects_scanned += 1
        what = classify(info.key)
        if what.kind not in COLLECTABLE:  # never a file Quarry did not write
            if what.kind == FOREIGN:
                report.objects_foreign += 1
            continue
        if claimed_at is not None and info.modified < claimed_at - CLAIM_CLOCK_SLACK_SECONDS:
            report.objects_inherited += 1
            continue
        if info.modified >= limit:
            report.objects_in_grace += 1
            continue
        found.append((info.key, info.size, what.kind, what.id))
    return found


def _unreferenced_data_keys(
    spark: SparkSession,
    storage_namespace: str,
    range_ids: list[str],
    staged_addresses: set[str],
    data_candidates: list[tuple],
    connection: Connection,
) -> set[str]:
    """The candidate data keys that no retained range and no staged entry refers to: the
    addresses are read from the range files in Spark, turned into every namespace key they
    may name (quarry.blob.layout.referenced_keys: resolved and literal, in any notation),
    and anti-joined with the candidates there."""
    from pyspark.sql import functions as F

    if not data_candidates:
        return set()
    addresses = ranges_dataframe(spark, storage_namespace, range_ids, connection).select(
        "physical_address"
    )
    if staged_addresses:
        addresses = addresses.unionByName(
            spark.createDataFrame(
                [(a,) for a in sorted(staged_addresses)], "physical_address string"
            )
        )
    referenced = addresses.mapInArrow(_keys_of_addresses(storage_namespace), "key string")
    referenced = referenced.where(F.col("key").isNotNull()).distinct()
    candidates = spark.createDataFrame([(c[0],) for c in data_candidates], "key string")
    orphans = candidates.join(referenced, "key", "left_anti").collect()
    return {row.key for row in orphans}


def _keys_of_addresses(
    storage_namespace: str,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """For mapInArrow: batches of `physical_address` to batches of the namespace keys they
    may name (quarry.blob.layout.referenced_keys, the one place that decides it)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        from quarry.blob.layout import referenced_keys

        for batch in batches:
            keys = [
                key
                for address in batch.column(0).to_pylist()
                if address
                for key in referenced_keys(storage_namespace, address)
            ]
            yield pa.RecordBatch.from_arrays([pa.array(keys, pa.string())], names=["key"])

    return run


def _delete(
    spark: SparkSession, storage_namespace: str, keys: list[str], connection: Connection
) -> int:
    """Delete `keys` from the namespace in executors; returns how many."""
    if not keys:
        return 0
    slices = max(1, min(len(keys) // 1000 + 1, spark.sparkContext.defaultParallelism * 4))

    def delete_partition(rows: Iterator[Row]) -> None:
        from quarry.blob import open_blob_store

        with open_blob_store(storage_namespace, connection) as store:
            for row in rows:
                store.delete(row.key)

    frame = spark.createDataFrame([(k,) for k in keys], "key string").repartition(slices)
    spark.sparkContext.setJobDescription(f"quarry gc: delete {len(keys)} objects")
    try:
        frame.foreachPartition(delete_partition)
    finally:
        spark.sparkContext.setJobDescription(None)  # type: ignore[arg-type]  # None clears it
    return len(keys)
