"""`quarry doctor`: a read-only check of the KV store and the storage namespaces.

It reads the KV store (through the kv-gateway, like every other client of the store) and the
repositories' storage namespaces, and lists:

* corrupt records: any stored record that records.decode_record refuses (repositories,
  branches, tags, commits, garbage-collection rules, staged values, cleanup items), and the
  cleanup items the dropper parked;
* dangling references: branch → missing commit (or compacted metarange), tag → missing
  commit, commit → missing parent or metarange, metarange → missing range file (or an
  unreadable metarange file);
* staging tokens: a staging token a branch still uses that is queued for dropping (the
  dropper would delete acknowledged writes), and an orphan staging token — a staging
  partition holding items that no branch references and that is not queued for dropping.
  The KV contract has no call that lists partitions, so orphan candidates are the staging
  partitions the kv-gateway has served since it started (its capacity report); a token
  orphaned before the gateway's last restart is found once something touches it.

It never writes: the store it is given is wrapped in ReadOnlyStore, whose write methods
refuse, and the storage namespaces are only read (exists/get).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NoReturn

from google.protobuf.message import Message

from quarry import errors
from quarry.blob.base import BlobStore, ObjectNotFound
from quarry.blob.layout import MARKER_KEY
from quarry.blob.ownership import InvalidMarker, parse_marker, read_marker
from quarry.committed import format as rformat
from quarry.committed.metaranges import read_metarange_tree
from quarry.graveler import layout, records
from quarry.graveler.layout import (
    BRANCHES_PREFIX,
    CLEANUP_PARTITION,
    COMMITS_PREFIX,
    GC_RULES_KEY,
    PARKED_PREFIX,
    QUARRY_PARTITION,
    REPOS_PREFIX,
    TAGS_PREFIX,
    prefix_end,
    staging_partitions,
)
from quarry.graveler.model import RangeInfo
from quarry.graveler.refs import Repository
from quarry.graveler.staging import RETIRING_EXPIRY_SECONDS
from quarry.kv import store as kv
from quarry.kv.partitions import STAGING, partition_class
from quarry.v1 import types_pb2

# Finding kinds.
CORRUPT_RECORD = "corrupt_record"
PARKED_ITEM = "parked_cleanup_item"
BRANCH_MISSING_COMMIT = "branch_missing_commit"
TAG_MISSING_COMMIT = "tag_missing_commit"
COMMIT_MISSING_PARENT = "commit_missing_parent"
MISSING_METARANGE = "missing_metarange"
UNREADABLE_METARANGE = "unreadable_metarange"
METARANGE_MISSING_RANGE = "metarange_missing_range"
UNREADABLE_RANGE = "unreadable_range"
RANGE_CONTENT_MISMATCH = "range_content_mismatch"
NAMESPACE_NOT_OWNED = "namespace_not_owned"
QUEUED_TOKEN_IN_USE = "staging_token_in_use_but_queued_for_drop"
ORPHAN_STAGING_TOKEN = "orphan_staging_token"
DEFAULT_BRANCH_MISSING = "default_branch_missing"

# Enough for every partition a gateway meters (it forgets the colder half past its cap).
_CAPACITY_REPORT_PARTITIONS = 1_000_000


@dataclass(frozen=True)
class Finding:
    kind: str
    message: str
    repository: str = ""
    partition: str = ""  # the KV record concerned, when there is one
    key: str = ""
    object: str = ""  # the storage object concerned, when there is one (namespace/key)

    def where(self) -> str:
        if self.object:
            return self.object
        if self.partition:
            return f"{self.partition} {self.key}".strip()
        return self.repository


@dataclass
class Report:
    scope: str  # a repository name, or "" for the whole installation
    findings: list[Finding] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # checks that could not run, and why

    @property
    def ok(self) -> bool:
        return not self.findings

    def count(self, what: str, n: int = 1) -> None:
        self.checked[what] = self.checked.get(what, 0) + n

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "scope": self.scope or "*",
            "checked": dict(self.checked),
            "findings": [asdict(f) for f in self.findings],
            "notes": list(self.notes),
        }


class ReadOnlyStore(kv.Store):
    """Passes reads to `inner`; every write refuses. The doctor must never change data."""

    def __init__(self, inner: kv.Store):
        self.inner = inner

    def get(self, partition: bytes, key: bytes) -> kv.GetResult:
        return self.inner.get(partition, key)

    def scan(
        self,
        partition: bytes,
        start: bytes = b"",
        end: bytes | None = None,
        batch_size: int = kv.DEFAULT_SCAN_BATCH_SIZE,
    ) -> kv.ScanIterator:
        return self.inner.scan(partition, start, end, batch_size)

    def batch_get(self, items: Sequence[tuple[bytes, bytes]]) -> list[kv.GetResult | None]:
        return self.inner.batch_get(items)

    def _refuse(self, *_args: object, **_kwargs: object) -> NoReturn:
        raise errors.FailedPrecondition("quarry doctor is read-only: it never writes")

    set = set_if = delete = delete_if = batch_set = batch_delete = _refuse

    def close(self) -> None:
        self.inner.close()


class Doctor:
    def __init__(
        self,
        store: kv.Store,
        open_namespace: Callable[[str], BlobStore],
        staging_candidates: Callable[[], list[bytes]] = lambda: [],
    ):
        """`open_namespace` opens a repository's storage namespace for reading;
        `staging_candidates` lists staging partitions worth checking for orphans."""
        self.kv = ReadOnlyStore(store)
        self._open_namespace = open_namespace
        self._staging_candidates = staging_candidates

    # ---- entry point ---------------------------------------------------------------------

    def check(self, repository: str = "") -> Report:
        """Check one repository, or (repository "") every repository plus the cleanup
        queue and the staging partitions no branch references."""
        report = Report(repository)
        used_tokens: dict[str, str] = {}  # staging token → "repo/branch" using it
        for _name, repo in self._repositories(report, repository):
            self._check_repository(report, repo, used_tokens)
        if not repository:
            queued = self._check_cleanup_queue(report, used_tokens)
            self._check_orphans(report, used_tokens, queued)
        return report

    def _tokens_in_use_now(self) -> dict[str, str]:
        """The staging tokens the branch records reference when read again (records that
        do not decode are left out: they were reported). The installation keeps working
        while doctor reads it: a commit that retires a token between the first read of a
        branch and the read of the cleanup queue, or a branch created meanwhile, must not
        be reported as a token "queued but in use" (a data-loss alarm) or an orphan."""
        used: dict[str, str] = {}
        for item in self._scan(QUARRY_PARTITION, REPOS_PREFIX):
            try:
                repo = Repository.from_record(item.value, item.key)
            except Exception:  # reported by the first pass
                continue
            for branch_item in self._scan(repo.partition, BRANCHES_PREFIX):
                try:
                    branch = layout.decode(
                        types_pb2.Branch, repo.partition, branch_item.key, branch_item.value
                    )
                except Exception:  # reported by the first pass
                    continue
                for token in (branch.staging_token, *branch.sealed_tokens):
                    used[token] = f"{repo.name}/{branch.name}"
        return used

    def _queued_now(self) -> set[bytes]:
        return {
            item.key
            for item in self._scan(CLEANUP_PARTITION)
            if not item.key.startswith(PARKED_PREFIX)
        }

    # ---- repositories --------------------------------------------------------------------

    def _repositories(self, report: Report, only: str) -> Iterator[tuple[str, Repository]]:
        if only:
            key = layout.repository_key(only)
            try:
                value = self.kv.get(QUARRY_PARTITION, key).value
            except kv.KeyNotFound:
                raise errors.NotFound(
                    f"repository {only!r} not found", metadata={"repository": only}
                ) from None
            items: Iterable[kv.KeyValue] = [kv.KeyValue(key, value)]
        else:
            items = self._scan(QUARRY_PARTITION, REPOS_PREFIX)
        for item in items:
            name = item.key[len(REPOS_PREFIX) :].decode("utf-8", "backslashreplace")
            report.count("repositories")
            repo = self._decode(report, Repository.from_record, QUARRY_PARTITION, item, name)
            if repo is not None:
                yield name, repo

    def _check_repository(
        self, report: Report, repo: Repository, used_tokens: dict[str, str]
    ) -> None:
        partition = repo.partition
        branches: list[types_pb2.Branch] = []
        tags: list[types_pb2.Tag] = []
        commits: dict[str, types_pb2.Commit] = {}
        decoders = (
            (BRANCHES_PREFIX, types_pb2.Branch, branches.append),
            (TAGS_PREFIX, types_pb2.Tag, tags.append),
            (COMMITS_PREFIX, types_pb2.Commit, lambda c: commits.setdefault(c.id, c)),
        )
        for item in self._scan(partition):
            for prefix, message_type, keep in decoders:
                if item.key.startswith(prefix):
                    report.count(prefix.decode().rstrip("/"))
                    value = self._decode_record(report, message_type, partition, item, repo.name)
                    if value is not None:
                        keep(value)
                    break
            else:
                if item.key == GC_RULES_KEY:
                    self._decode_record(
                        report, types_pb2.GarbageCollectionRules, partition, item, repo.name
                    )
        # Commits whose record is corrupt are reported once as corrupt, not again as missing.
        corrupt_commits = {
            f.key[len(COMMITS_PREFIX) :]
            for f in report.findings
            if f.kind == CORRUPT_RECORD
            and f.partition == records.show(partition)
            and f.key.startswith(COMMITS_PREFIX.decode())
        }
        known = set(commits) | corrupt_commits
        self._check_default_branch(report, repo, branches)
        metaranges = _MetarangeChecker(self, report, repo)
        for branch in branches:
            where = {
                "repository": repo.name,
                "partition": records.show(partition),
                "key": layout.branch_key(branch.name).decode(),
            }
            if branch.commit_id not in known:
                report.findings.append(
                    Finding(
                        BRANCH_MISSING_COMMIT,
                        f"branch {branch.name!r} points at commit "
                        f"{branch.commit_id!r}, which does not exist",
                        **where,
                    )
                )
            if branch.compacted_metarange_id:
                metaranges.check(
                    branch.compacted_metarange_id,
                    f"the compacted metarange of branch {branch.name!r}",
                )
            for token in (branch.staging_token, *branch.sealed_tokens):
                used_tokens[token] = f"{repo.name}/{branch.name}"
                self._check_staged_values(report, token, repo.name)
        for tag in tags:
            if tag.commit_id not in known:
                report.findings.append(
                    Finding(
                        TAG_MISSING_COMMIT,
                        f"tag {tag.name!r} points at commit "
                        f"{tag.commit_id!r}, which does not exist",
                        repo.name,
                        records.show(partition),
                        layout.tag_key(tag.name).decode(),
                    )
                )
        # A branch head's or a tag's commit must be readable; an older commit's metarange
        # may be gone by design (GC deletes the metaranges of expired commits): counted,
        # not a finding. Anchored commits go first, so a metarange they share with an older
        # commit is judged as theirs.
        anchored = {b.commit_id for b in branches} | {t.commit_id for t in tags}
        for commit_id, commit in sorted(commits.items(), key=lambda item: item[0] not in anchored):
            key = layout.commit_key(commit_id).decode()
            for parent in commit.parents:
                if parent not in known:
                    report.findings.append(
                        Finding(
                            COMMIT_MISSING_PARENT,
                            f"commit {commit_id[:12]} has parent {parent!r}, which does not exist",
                            repo.name,
                            records.show(partition),
                            key,
                        )
                    )
            metaranges.check(
                commit.metarange_id,
                f"commit {commit_id[:12]}",
                partition=records.show(partition),
                key=key,
                collectable=commit_id not in anchored,
            )
        metaranges.check_marker()
        metaranges.close()

    def _check_default_branch(
        self, report: Report, repo: Repository, branches: list[types_pb2.Branch]
    ) -> None:
        """A repository whose default branch is gone has lost its record of every branch
        (a repository is created with it, and it can be neither deleted nor renamed):
        nothing else would say so (tester hAJ: an older build's dropper emptied a live
        repository and doctor found nothing wrong). A corrupt record of it is reported as
        corrupt already."""
        key = layout.branch_key(repo.default_branch).decode()
        if any(b.name == repo.default_branch for b in branches) or any(
            f.kind == CORRUPT_RECORD and f.key == key for f in report.findings
        ):
            return
        report.findings.append(
            Finding(
                DEFAULT_BRANCH_MISSING,
                f"the default branch {repo.default_branch!r} has no record "
                f"({len(branches)} other branch record(s) left)",
                repo.name,
                records.show(repo.partition),
                key,
            )
        )

    def _check_staged_values(self, report: Report, token: str, repository: str) -> None:
        try:
            partitions = staging_partitions(token)
        except errors.QuarryError:
            return  # the branch record itself was reported
        for partition in partitions:
            for item in self._scan(partition):
                report.count("staged values")
                self._decode_record(report, types_pb2.StagedValue, partition, item, repository)

    # ---- cleanup queue and orphans -----------------------------------------------------------

    def _check_cleanup_queue(self, report: Report, used_tokens: dict[str, str]) -> set[bytes]:
        queued: set[bytes] = set()
        suspects: list[tuple[str, bytes]] = []
        for item in self._scan(CLEANUP_PARTITION):
            report.count("cleanup items")
            if item.key.startswith(PARKED_PREFIX):
                report.findings.append(
                    Finding(
                        PARKED_ITEM,
                        "a corrupt cleanup item the dropper moved aside; its "
                        "partition was not dropped",
                        "",
                        records.show(CLEANUP_PARTITION),
                        records.show(item.key),
                    )
                )
                continue
            record = self._decode(
                report,
                lambda value, key: layout.decode_cleanup(key, value),
                CLEANUP_PARTITION,
                item,
                "",
            )
            if record is None:
                continue
            queued.add(item.key)
            token = layout.staging_token_of(item.key) if _is_staging(item.key) else None
            if record.branch and time.time() - record.queued_at < RETIRING_EXPIRY_SECONDS:
                continue  # queued ahead of a branch change: in use until it is made
            if token is not None and token in used_tokens:
                suspects.append((token, item.key))
        in_use = self._tokens_in_use_now() if suspects else {}
        for token, key in suspects:
            if token not in in_use:
                continue  # retired since the branch was read: queued as it should be
            report.findings.append(
                Finding(
                    QUEUED_TOKEN_IN_USE,
                    f"staging token {token} is queued for dropping but "
                    f"branch {in_use[token]} still uses it",
                    "",
                    records.show(CLEANUP_PARTITION),
                    records.show(key),
                )
            )
        return queued

    def _check_orphans(
        self, report: Report, used_tokens: dict[str, str], queued: set[bytes]
    ) -> None:
        used = {p for t in used_tokens if t and "/" not in t for p in _partitions_of(t)}
        try:
            candidates = set(self._staging_candidates())
        except errors.QuarryError as exc:
            report.notes.append(f"orphan staging tokens not checked: {exc.reason}: {exc.message}")
            return
        suspects = []
        for partition in sorted(candidates):
            if not _is_staging(partition) or partition in used or partition in queued:
                continue
            report.count("unreferenced staging partitions")
            if kv.has_items(self.kv, partition):
                suspects.append(partition)
        if not suspects:
            return
        # Read again, branches then the queue: a token a branch took or retired while the
        # first reads ran is referenced, or queued, by now.
        used_now = {p for t in self._tokens_in_use_now() if t for p in _partitions_of(t)}
        queued_now = self._queued_now()
        for partition in suspects:
            if partition in used_now or partition in queued_now:
                continue
            if not kv.has_items(self.kv, partition):
                # Dropped meanwhile: queued by a deletion after the first reads, and its
                # queue entry gone with it before the second (tester hAQ).
                continue
            report.findings.append(
                Finding(
                    ORPHAN_STAGING_TOKEN,
                    "a staging partition with items that no branch "
                    "references and that is not queued for dropping",
                    "",
                    records.show(partition),
                    "",
                )
            )

    # ---- helpers -------------------------------------------------------------------------

    def _scan(self, partition: bytes, prefix: bytes = b"") -> Iterator[kv.KeyValue]:
        iterator = self.kv.scan(partition, prefix, prefix_end(prefix) if prefix else None)
        try:
            yield from iterator
        finally:
            iterator.close()

    def _decode_record(  # one finding's context, field for field
        self,
        report: Report,
        message_type: type[Message],
        partition: bytes,
        item: kv.KeyValue,
        repository: str,
    ) -> Any:
        return self._decode(
            report,
            lambda value, key: layout.decode(message_type, partition, key, value),
            partition,
            item,
            repository,
        )

    @staticmethod
    def _decode(
        report: Report,
        decode: Callable[[bytes, bytes], Any],
        partition: bytes,
        item: kv.KeyValue,
        repository: str,
    ) -> Any:
        """decode(value, key), or None with a corrupt_record finding."""
        try:
            return decode(item.value, item.key)
        except records.CorruptRecord as exc:
            report.findings.append(
                Finding(
                    CORRUPT_RECORD,
                    exc.message,
                    repository,
                    records.show(partition),
                    records.show(item.key),
                )
            )
            return None


class _MetarangeChecker:
    """Metarange → range files of one namespace, each checked once."""

    def __init__(self, doctor: Doctor, report: Report, repo: Repository):
        self._doctor = doctor
        self._report = report
        self._repo = repo
        self._store: BlobStore | None = None
        self._seen: set[str] = set()
        self._ranges: set[str] = set()
        self._pages: dict[str, list[RangeInfo]] = {}  # index pages read (shared by commits)

    def _object(self, key: str) -> str:
        return f"{self._repo.storage_namespace.rstrip('/')}/{key}"

    def check(
        self,
        metarange_id: str,
        referrer: str,
        partition: str = "",
        key: str = "",
        collectable: bool = False,
    ) -> None:
        """`collectable`: the referrer is a commit no branch or tag points at, whose
        metarange GC may have deleted (a missing one is counted, not a finding)."""
        if metarange_id in ("", rformat.EMPTY_METARANGE_ID) or metarange_id in self._seen:
            return
        self._seen.add(metarange_id)
        store = self._store_of()
        report = self._report
        report.count("metaranges")
        where = self._object(rformat.metarange_key(metarange_id))
        try:
            _pages, ranges = read_metarange_tree(store, metarange_id, self._pages)
        except errors.NotFound:
            if collectable:
                report.count("metaranges of unanchored commits missing (GC collects them)")
                return
            report.findings.append(
                Finding(
                    MISSING_METARANGE,
                    f"{referrer} uses metarange {metarange_id[:12]}, whose file (or one of "
                    f"its index pages) is missing",
                    self._repo.name,
                    partition,
                    key,
                    where,
                )
            )
            return
        except errors.QuarryError as exc:
            report.findings.append(
                Finding(
                    UNREADABLE_METARANGE,
                    f"{referrer} uses metarange {metarange_id[:12]}, whose "
                    f"file cannot be read: {exc.message}",
                    self._repo.name,
                    partition,
                    key,
                    where,
                )
            )
            return
        for info in ranges:
            if info.id in self._ranges:
                continue
            self._ranges.add(info.id)
            report.count("ranges")
            self._check_range(metarange_id, info.id)

    def _check_range(self, metarange_id: str, range_id: str) -> None:
        """The range file is there, reads back, and holds what its id (a hash of its
        content) says: a file damaged in place, even one that is still valid Parquet, is
        found here rather than served as another object's entry."""
        key = rformat.range_key(range_id)
        found = None
        try:
            table = rformat.decode_range(self._store_of().get(key))
            if rformat.range_id_of(table) != range_id:
                found = (
                    RANGE_CONTENT_MISMATCH,
                    "does not hold what its id says (changed in place)",
                )
        except ObjectNotFound:
            found = (METARANGE_MISSING_RANGE, "is missing")
        except errors.QuarryError as exc:  # RangeCorrupt, a format of another version
            found = (UNREADABLE_RANGE, f"cannot be read: {exc.message}")
        if found is not None:
            kind, what = found
            self._report.findings.append(
                Finding(
                    kind,
                    f"metarange {metarange_id[:12]} lists range {range_id[:12]}, whose file {what}",
                    self._repo.name,
                    object=self._object(key),
                )
            )

    def check_marker(self) -> None:
        """The namespace's ownership marker names this repository: without it GC refuses
        the repository (NAMESPACE_NOT_OWNED), and a marker of another one means two
        repositories share the namespace."""
        data = read_marker(self._store_of())
        problem = ""
        if data is None:
            problem = "is missing"
        else:
            try:
                marker = parse_marker(data)
            except InvalidMarker as exc:
                problem = f"cannot be read ({exc})"
            else:
                if not marker.owns(self._repo.name, self._repo.instance_id):
                    problem = f"names repository {marker.repository!r}, another instance"
        if problem:
            self._report.findings.append(
                Finding(
                    NAMESPACE_NOT_OWNED,
                    f"the ownership marker of {self._repo.storage_namespace} {problem}: GC "
                    "refuses this repository until it is restored",
                    self._repo.name,
                    object=self._object(MARKER_KEY),
                )
            )

    def _store_of(self) -> BlobStore:
        if self._store is None:
            self._store = self._doctor._open_namespace(self._repo.storage_namespace)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


def _is_staging(partition: bytes) -> bool:
    try:
        return partition_class(partition) == STAGING
    except errors.QuarryError:
        return False


def _partitions_of(token: str) -> list[bytes]:
    try:
        return staging_partitions(token)
    except errors.QuarryError:
        return []  # a malformed token: the branch record holding it is reported


def gateway_staging_partitions(store: Any) -> list[bytes]:
    """The staging partitions a kv-gateway (quarry.kv.remote.RemoteStore) has served since
    it started, from its capacity report."""
    report = store.capacity_report(top_n=_CAPACITY_REPORT_PARTITIONS)
    return [
        bytes(p.partition_key)
        for p in report.hottest_partitions
        if _is_staging(bytes(p.partition_key))
    ]


__all__ = ["Doctor", "Finding", "Report", "ReadOnlyStore", "gateway_staging_partitions"]
