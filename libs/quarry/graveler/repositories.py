"""Repositories, branches, tags and settings (docs/architecture.md §4 "Repositories /
branches", "Hard reset"): creation with namespace ownership, listing, deletion, reset.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from quarry import errors
from quarry.blob.namespace import (
    canonical_storage_namespace,
    namespace_location,
    namespaces_overlap,
)
from quarry.blob.ownership import (
    MARKER_KEY,
    InvalidMarker,
    NamespaceClaim,
    NamespaceInUse,
    NamespaceNotEmpty,
    OwnershipMarker,
    build_marker,
    parse_marker,
)
from quarry.graveler import actions, layout, names, records
from quarry.graveler import errors as gerrors
from quarry.graveler.commits import sealer
from quarry.graveler.core import CommitRecord, Core, make_commit, now_seconds
from quarry.graveler.iterators import decode_page_token, encode_page_token
from quarry.graveler.layout import BRANCHES_PREFIX, REPOS_PREFIX, TAGS_PREFIX
from quarry.graveler.protection import COMMIT
from quarry.graveler.reads import Reads
from quarry.graveler.refs import BranchUpdate, Repository
from quarry.graveler.retry import ONCE
from quarry.graveler.staging import new_token
from quarry.kv.partitions import MAX_STAGING_SHARDS
from quarry.kv.store import InvalidStagingShards
from quarry.paging import PageBudget, every_item
from quarry.runtime.format_version import ensure_installation_id
from quarry.v1 import types_pb2
from quarry.v1.branch_manager_pb2 import BranchProtectionRule

log = logging.getLogger(__name__)

INITIAL_COMMIT_MESSAGE = "Repository created"
# A repository creation announced longer ago than this is taken as interrupted (creations
# take well under a second; one that passes half of this gives up before becoming visible).
CREATION_TTL_SECONDS = 600.0
SYSTEM_COMMITTER = "quarry"
LIST_PAGE = 1000


class Named(Protocol):
    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=Named)


def wall_clock() -> float:
    """Seconds since the epoch, comparable across processes (creation announcements)."""
    return time.time()


class Repositories:
    def __init__(self, core: Core, reads: Reads) -> None:
        self.core = core
        self.reads = reads
        self.refs = core.refs
        self.staging = core.staging
        self._installation_id: str | None = None

    # ---- repositories ---------------------------------------------------------------------

    def create_repository(
        self,
        name: str,
        storage_namespace: str,
        default_branch: str = "main",
        staging_shards: int = 0,
    ) -> Repository:
        """`staging_shards`: KV partitions per staging token (0: the default, 1)."""
        names.check_repository_name(name)
        default_branch = default_branch or "main"
        names.check_branch_name(default_branch)
        staging_shards = check_staging_shards(staging_shards or 1)
        # Recorded and compared in canonical form: a local namespace by its real path, so a
        # symlink into another repository's namespace is seen for what it is (and a link
        # re-pointed later never moves this repository's namespace).
        storage_namespace = canonical_storage_namespace(storage_namespace)
        self.core.addresses.check_namespace(storage_namespace)
        repo = Repository(
            name=name,
            storage_namespace=storage_namespace,
            default_branch=default_branch,
            instance_id=uuid.uuid4().hex,
            creation_time=now_seconds(),
            staging_shards=staging_shards,
        )
        return self.create_instance(repo, self._fill_new, self._check_reusable)

    def _fill_new(self, repo: Repository) -> None:
        """A new repository's records: the initial commit (of the empty metarange) and the
        default branch at it."""
        empty = self.core.range_writer.write_metarange(repo.storage_namespace, [])
        initial = make_commit(
            CommitRecord([], empty.metarange_id, INITIAL_COMMIT_MESSAGE, SYSTEM_COMMITTER, {}, 1)
        )
        self.refs.insert_commit(repo, initial)
        branch = types_pb2.Branch(
            name=repo.default_branch,
            commit_id=initial.id,
            staging_token=new_token(repo.staging_shards),
            dirty=False,
        )
        self.refs.insert_branch(repo, branch)

    def create_instance(
        self,
        repo: Repository,
        fill: Callable[[Repository], None],
        check_reusable: Callable[[str, NamespaceClaim], None],
    ) -> Repository:
        """Make `repo` exist (creation, and restore from a dump: quarry.graveler.dumps):
        announced, its namespace free and claimed, `fill` writing its records, and only then
        the record that makes it visible. `check_reusable` raises unless the ownership
        marker found in a non-empty namespace may be replaced."""
        # Announce the creation BEFORE looking for overlapping namespaces: of two creations
        # of nested namespaces racing, the later look sees the other (its announcement, or
        # its record once visible: an announcement is removed only after the record exists).
        started = wall_clock()
        self.refs.add_creation(repo, started)
        try:
            self._check_namespace_free(repo)
            self._create_instance(repo, started, fill, check_reusable)
        finally:
            try:
                self.refs.remove_creation(repo)
            except Exception:  # it expires (CREATION_TTL_SECONDS)
                log.warning("could not remove the creation record of %s", repo.name, exc_info=True)
        return repo

    def _create_instance(
        self,
        repo: Repository,
        started: float,
        fill: Callable[[Repository], None],
        check_reusable: Callable[[str, NamespaceClaim], None],
    ) -> None:
        """Order: the ownership marker claims the namespace, then everything the repository
        needs exists, all BEFORE the repository record that makes it visible. A failure
        leaves only an unreachable instance partition and a marker of a deleted instance."""
        try:
            self._claim_namespace(repo, check_reusable)
            fill(repo)
            if wall_clock() - started > CREATION_TTL_SECONDS / 2:
                # Others ignore announcements older than CREATION_TTL_SECONDS: never
                # become visible that late.
                raise errors.Aborted(
                    f"creating repository {repo.name!r} took too long; nothing was created, retry"
                )
            self.refs.insert_repository(repo)
        except BaseException as exc:
            # The marker may now name an instance that will never become visible (even
            # when the claim itself failed: its answer may be what was lost): let a
            # later creation reuse the namespace (a live record still wins, see
            # _check_reusable).
            try:
                self.refs.record_deleted_instance(repo)
            except Exception:  # the original error is the one to report
                log.warning("could not record the failed creation of %s", repo.name, exc_info=True)
            if isinstance(exc, gerrors.RepositoryExists):
                self.staging.queue_drop([repo.partition])
            raise

    def installation_id(self) -> str:
        if self._installation_id is None:
            self._installation_id = ensure_installation_id(self.core.kv)
        return self._installation_id

    def _check_namespace_free(self, repo: Repository) -> None:
        """A namespace may not contain or lie inside the namespace of another repository
        being created, nor equal, contain or lie inside that of an existing one. A taken
        name is ALREADY_EXISTS as before. (Two creations of the SAME namespace are settled
        by the marker instead: exactly one claims it.)"""
        name, storage_namespace = repo.name, repo.storage_namespace
        now = wall_clock()
        for other in self.refs.list_creations():
            if other.instance_id == repo.instance_id or other.started < now - CREATION_TTL_SECONDS:
                continue  # ours, or interrupted long ago
            if self._overlaps(
                storage_namespace, other.storage_namespace, other.repository
            ) and namespace_location(storage_namespace) != namespace_location(
                other.storage_namespace
            ):
                raise NamespaceInUse(
                    f"storage namespace {storage_namespace} overlaps the namespace "
                    f"{other.storage_namespace} of repository {other.repository!r}, being "
                    f"created",
                    metadata={
                        "storage_namespace": storage_namespace,
                        "other_repository": other.repository,
                        "other_storage_namespace": other.storage_namespace,
                    },
                )
        after = ""
        while True:
            # A corrupt repository record is skipped (logged and counted), so it cannot block
            # every creation; its namespace still holds its marker, which refuses an equal
            # namespace, and `quarry doctor` names the record.
            with records.listing():
                repos = self.refs.list_repositories(after, LIST_PAGE)
            for other_repo in repos:
                if other_repo.name == name:
                    raise gerrors.RepositoryExists(
                        f"repository {name!r} already exists", metadata={"repository": name}
                    )
                if self._overlaps(storage_namespace, other_repo.storage_namespace, other_repo.name):
                    raise NamespaceInUse(
                        f"storage namespace {storage_namespace} overlaps the namespace "
                        f"{other_repo.storage_namespace} of repository {other_repo.name!r}: a "
                        f"namespace may not equal, contain or lie inside another repository's",
                        metadata={
                            "storage_namespace": storage_namespace,
                            "other_repository": other_repo.name,
                            "other_storage_namespace": other_repo.storage_namespace,
                        },
                    )
            if len(repos) < LIST_PAGE:
                return
            after = repos[-1].name

    @staticmethod
    def _overlaps(storage_namespace: str, other: str, other_name: str) -> bool:
        try:
            return namespaces_overlap(storage_namespace, other)
        except gerrors.InvalidStorageNamespace:
            log.warning("repository %s has an unparsable namespace %r", other_name, other)
            return False

    def _claim_namespace(
        self, repo: Repository, check_reusable: Callable[[str, NamespaceClaim], None]
    ) -> None:
        """Write the ownership marker through the range-writer: into an empty namespace, or
        over the marker of a deleted repository of this installation (only then, and only
        if nothing but Quarry's own files is there). Never claims a namespace holding
        anyone else's files, and of two creations racing for one namespace exactly one
        wins (the marker is written if absent / if equal)."""
        ns = repo.storage_namespace
        marker = build_marker(repo.name, repo.instance_id, self.installation_id()).to_bytes()
        claim = self.core.range_writer.claim_namespace(ns, marker)
        if claim.claimed:
            return
        if claim.existing_marker is None:
            # What the directory holds goes to the operator's log, not to the caller: the
            # answer must not let anyone allowed to create repositories list the names of
            # files in directories the server can read (`/etc` named `.pwd.lock`).
            log.info("storage namespace %s is not empty: it holds %r", ns, claim.keys[0])
            raise NamespaceNotEmpty(
                f"storage namespace {ns} is not empty: a repository needs an empty "
                f"namespace, or one left by a deleted repository of this installation",
                metadata={"storage_namespace": ns},
            )
        check_reusable(ns, claim)
        claim = self.core.range_writer.claim_namespace(ns, marker, replace=claim.existing_marker)
        if not claim.claimed:
            raise NamespaceInUse(
                f"storage namespace {ns} was just claimed by another repository",
                metadata={"storage_namespace": ns},
            )

    def _check_reusable(self, ns: str, claim: NamespaceClaim) -> None:
        """Raise unless the marker found is that of a deleted repository of this
        installation and the namespace holds nothing but Quarry's own files."""
        found = self.parse_claimed_marker(ns, claim)
        meta = {
            "storage_namespace": ns,
            "other_repository": found.repository,
            "other_instance_id": found.instance_id,
        }
        if found.installation_id != self.installation_id():
            raise NamespaceNotEmpty(
                f"storage namespace {ns} belongs to repository {found.repository!r} of "
                f"another Quarry installation",
                metadata=meta,
            )
        self.check_instance_gone(ns, found, meta)
        from quarry.retention import FOREIGN, classify

        foreign = [k for k in claim.keys if classify(k).kind == FOREIGN]
        if foreign or claim.keys_truncated:
            example = foreign[0] if foreign else claim.keys[-1]
            raise NamespaceNotEmpty(
                f"storage namespace {ns} was left by deleted repository {found.repository!r} "
                f"but holds "
                + (
                    f"files Quarry did not write (e.g. {example!r})"
                    if foreign
                    else "too many files to check; empty it first"
                ),
                metadata={**meta, "example_key": example},
            )

    def check_instance_gone(self, ns: str, found: OwnershipMarker, meta: dict[str, str]) -> None:
        """NamespaceInUse unless the instance a marker of this installation names is a
        deleted one: not live, and not a creation in progress (or interrupted)."""
        try:
            live: Repository | None = self.refs.get_repository(found.repository, fresh=True)
        except gerrors.RepositoryNotFound:
            live = None
        if live is not None and live.instance_id == found.instance_id:
            raise NamespaceInUse(
                f"storage namespace {ns} is used by repository {found.repository!r}",
                metadata=meta,
            )
        if not self.refs.is_deleted_instance(found.instance_id):
            raise NamespaceInUse(
                f"storage namespace {ns} is being claimed by repository {found.repository!r} "
                f"(or its creation was interrupted: if no repository uses the namespace, "
                f"remove {MARKER_KEY} there)",
                metadata=meta,
            )

    @staticmethod
    def parse_claimed_marker(ns: str, claim: NamespaceClaim) -> OwnershipMarker:
        """The ownership marker a claim found (NamespaceNotEmpty if it is unreadable)."""
        assert claim.existing_marker is not None
        try:
            return parse_marker(claim.existing_marker)
        except InvalidMarker as exc:
            raise NamespaceNotEmpty(
                f"storage namespace {ns} holds an unreadable ownership marker ({exc})",
                metadata={"storage_namespace": ns},
            ) from None

    def get_repository(self, name: str) -> Repository:
        names.check_repository_name(name)
        return self.refs.get_repository(name, fresh=True)

    def update_repository(self, name: str, staging_shards: int | None = None) -> Repository:
        """Change a repository's settings; None leaves a setting as it is. A new
        staging_shards applies to the staging tokens installed from now on (each branch's
        next commit or compaction seal, reset, discard, new branch): tokens already in use
        keep their shard count, which their name records, so no staged item ever moves."""
        names.check_repository_name(name)
        if staging_shards is not None:
            check_staging_shards(staging_shards)

        def change(repo: Repository) -> Repository:
            if staging_shards is None:
                return repo
            return dataclasses.replace(repo, staging_shards=staging_shards)

        return self.refs.update_repository(name, change)

    @records.skips_corrupt_records
    def list_repositories(
        self, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[Repository], str]:
        return page_by_name(
            self.refs.list_repositories, self.core.budget(page_size), page_token, REPOS_PREFIX
        )

    @records.skips_corrupt_records  # a corrupt branch record is dropped with the partition
    def delete_repository(self, name: str) -> None:
        """Each branch's tokens are queued ahead, as by every change that retires staging
        tokens (dropped once no branch record names them). The instance's partition is
        queued only once the record is gone (dropped with the tokens its branches name
        then: a seal after this listing installed one): a dropper of an older build drops
        what is queued without asking whether a repository still names it, and dropped a
        live repository whose deletion had died after queuing it (tester hAJ). A process
        that dies before the record goes leaves the repository as it was; one that dies
        between the record and the queue leaves the instance, which the dropper finds
        through its deleted-instance record (StagingManager.queue_dead_instances)."""
        repo = self.get_repository(name)
        branches = every_item(lambda a, n: self.refs.list_branches(repo, a, n), lambda b: b.name)
        for branch in branches:
            self.staging.queue_retiring_tokens(
                [branch.staging_token, *branch.sealed_tokens], repo.partition, branch.name
            )
        # Recorded before the record goes: its namespace may then be reused (ownership),
        # and queue_dead_instances finds the instance if this process dies below.
        self.refs.record_deleted_instance(repo)
        self.refs.delete_repository_record(repo)
        self.staging.queue_drop([repo.partition])

    # ---- branches ---------------------------------------------------------------------------

    def create_branch(self, repo_name: str, name: str, source_ref: str) -> types_pb2.Branch:
        repo = self.core.live_repo(repo_name)
        names.check_branch_name(name)
        resolved = self.refs.resolve(repo, source_ref or repo.default_branch)
        post = actions.ref_event(
            self.core,
            self.reads,
            repo,
            "create-branch",
            resolved.commit_id,
            branch=name,
            source_ref=source_ref or repo.default_branch,
        )
        branch = types_pb2.Branch(
            name=name,
            commit_id=resolved.commit_id,
            staging_token=new_token(repo.staging_shards),
            dirty=False,
        )
        self.refs.insert_branch(repo, branch)
        post()
        return branch

    def get_branch(self, repo_name: str, name: str) -> types_pb2.Branch:
        repo = self.core.repo(repo_name)
        names.check_branch_name(name)
        return self.refs.get_branch(repo, name)[0]

    @records.skips_corrupt_records
    def list_branches(
        self, repo_name: str, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[types_pb2.Branch], str]:
        repo = self.core.repo(repo_name)
        return page_by_name(
            lambda after, limit: self.refs.list_branches(repo, after, limit),
            self.core.budget(page_size),
            page_token,
            BRANCHES_PREFIX,
        )

    def delete_branch(self, repo_name: str, name: str) -> None:
        repo = self.core.live_repo(repo_name)
        names.check_branch_name(name)
        if name == repo.default_branch:
            raise gerrors.ProtectedBranch(
                f"{name!r} is the default branch of {repo.name!r} and cannot be deleted",
                metadata={"repository": repo.name, "branch": name},
            )
        # Never delete a protected branch: recreated at an older commit it would be rewound.
        self.core.protection.check_delete(repo, name)
        post = (
            actions.ref_event(
                self.core,
                self.reads,
                repo,
                "delete-branch",
                self.refs.get_branch(repo, name)[0].commit_id,
                branch=name,
                source_ref=name,
            )
            if self.core.actions is not None
            else None
        )
        # Compare-and-delete: the tokens retired are those of the record deleted, even when
        # a seal or commit changed the branch since it was first read; each record about to
        # be deleted has its tokens queued first (dropped once no branch record references
        # them: queue_retiring_tokens).
        self.refs.delete_branch(
            repo,
            name,
            lambda branch: self.staging.queue_retiring_tokens(
                [branch.staging_token, *branch.sealed_tokens], repo.partition, name
            ),
        )
        self.core.forget_branch(repo, name)
        if post is not None:
            post()

    def reset_branch(
        self, repo_name: str, name: str, ref: str, force: bool = False
    ) -> types_pb2.Branch:
        """Hard reset: the branch points at `ref` with no uncommitted changes."""
        repo = self.core.live_repo(repo_name)
        names.check_branch_name(name)
        # A hard reset moves the branch's HEAD as a commit does (lakeFS blocks it with commit).
        self.core.protection.check(repo, name, COMMIT)
        target = self.refs.resolve(repo, ref).commit_id

        def refuse_dirty(branch: types_pb2.Branch) -> None:
            if not force and self.reads.has_uncommitted(repo, branch):
                raise gerrors.DirtyBranch(
                    f"branch {name!r} has uncommitted changes; commit or discard them, or "
                    f"reset with force",
                    metadata={"repository": repo.name, "branch": name},
                )

        def reset(branch: types_pb2.Branch) -> types_pb2.Branch:
            refuse_dirty(branch)
            # The tokens this record change retires are queued first (dropped once the
            # branch no longer references them: queue_retiring_tokens).
            self.staging.queue_retiring_tokens(
                [branch.staging_token, *branch.sealed_tokens], repo.partition, name
            )
            return types_pb2.Branch(
                name=name,
                commit_id=target,
                staging_token=new_token(repo.staging_shards),
                dirty=False,
            )

        if force:
            update = self.refs.update_branch(repo, name, reset, step="reset")
        else:
            # Refused before any seal: a refused reset leaves the branch exactly as it was
            # (each refused attempt sealed the token: one more layer for every read).
            refuse_dirty(self.core.branch(repo, name)[0])
            update = self._reset_if_clean(repo, name, reset)
        self.core.forget_branch(repo, name)
        return update.branch

    def _reset_if_clean(
        self,
        repo: Repository,
        name: str,
        reset: Callable[[types_pb2.Branch], types_pb2.Branch],
    ) -> BranchUpdate:
        """A reset that refuses uncommitted changes. Safety rule: it never drops a token
        holding a write it did not see. A writer on a dirty branch writes to the staging
        token without touching the record, so "check the token, then swap the record"
        would miss a write acknowledged in between. So, as a commit does: seal first
        (the token goes to the sealed list, a fresh one with dirty=false takes its
        place: no write is acknowledged on a sealed token after that, a writer that hit
        it writes again to the fresh one), check what the sealed tokens hold, and swap
        only if the record is still exactly the sealed one: a write since then marked
        the branch dirty, the swap fails, and the loop seals again."""
        message = f"branch {name!r} kept changing during the reset"
        for _ in self.core.retries.branch.attempts(lambda: gerrors.BranchContended(message)):
            sealed = self.refs.update_branch(repo, name, sealer(repo.staging_shards), step="seal")
            try:
                return self.refs.update_branch(
                    repo,
                    name,
                    reset,
                    step="reset",
                    policy=ONCE,
                    expect=(sealed.branch, sealed.predicate),
                )
            except gerrors.BranchContended:
                self.core.forget_branch(repo, name)
                continue
        raise AssertionError("unreachable: the policy raises when exhausted")

    # ---- tags -------------------------------------------------------------------------------

    def create_tag(self, repo_name: str, name: str, ref: str) -> types_pb2.Tag:
        repo = self.core.live_repo(repo_name)
        names.check_tag_name(name)
        tag = types_pb2.Tag(name=name, commit_id=self.refs.resolve(repo, ref).commit_id)
        post = actions.ref_event(
            self.core, self.reads, repo, "create-tag", tag.commit_id, source_ref=ref, tag=name
        )
        self.refs.insert_tag(repo, tag)
        post()
        return tag

    def get_tag(self, repo_name: str, name: str) -> types_pb2.Tag:
        repo = self.core.repo(repo_name)
        names.check_tag_name(name)
        return self.refs.get_tag(repo, name)

    @records.skips_corrupt_records
    def list_tags(
        self, repo_name: str, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[types_pb2.Tag], str]:
        repo = self.core.repo(repo_name)
        return page_by_name(
            lambda after, limit: self.refs.list_tags(repo, after, limit),
            self.core.budget(page_size),
            page_token,
            TAGS_PREFIX,
        )

    def delete_tag(self, repo_name: str, name: str) -> None:
        repo = self.core.live_repo(repo_name)
        names.check_tag_name(name)
        post = None
        if self.core.actions is not None:
            commit_id = self.refs.get_tag(repo, name).commit_id
            post = actions.ref_event(
                self.core, self.reads, repo, "delete-tag", commit_id, source_ref=name, tag=name
            )
        self.refs.delete_tag(repo, name)
        if post is not None:
            post()

    # ---- settings ---------------------------------------------------------------------------

    def set_gc_rules(self, repo_name: str, rules: types_pb2.GarbageCollectionRules) -> None:
        from quarry.retention import RetentionRules

        repo = self.core.live_repo(repo_name)
        for branch in rules.branch_retention_days:
            names.check_branch_name(branch)
        RetentionRules.from_proto(rules)  # INVALID_ARGUMENT for days out of range
        self.refs.set_gc_rules(repo, rules)

    def get_gc_rules(self, repo_name: str) -> types_pb2.GarbageCollectionRules:
        return self.refs.get_gc_rules(self.core.repo(repo_name))

    def delete_gc_rules(self, repo_name: str) -> None:
        self.refs.delete_gc_rules(self.core.live_repo(repo_name))

    def set_branch_protection_rules(
        self, repo_name: str, rules: Sequence[BranchProtectionRule], if_checksum: str = ""
    ) -> str:
        """Replace the rules (quarry.graveler.protection); returns their new checksum."""
        return self.core.protection.set(self.core.live_repo(repo_name), rules, if_checksum)

    def get_branch_protection_rules(self, repo_name: str) -> tuple[list[BranchProtectionRule], str]:
        """The rules and their checksum (no rules: an empty list and its checksum)."""
        return self.core.protection.get(self.core.live_repo(repo_name))


def page_by_name(
    fetch: Callable[[str, int], list[N]], budget: PageBudget, page_token: str, key_prefix: bytes
) -> tuple[list[N], str]:
    """One page of a listing ordered by name: `fetch(after, limit)` returns up to `limit`
    items named after `after` (stored at key_prefix + name); one extra item tells whether
    another page follows. The page ends early when the budget's byte limit is reached."""
    after = decode_page_token(page_token, "after").get("after", "")
    items = fetch(after, budget.max_items + 1)
    for index, item in enumerate(items):
        if not budget.admit(item):
            last = items[index - 1].name
            records.next_page_starts_at(layout.scan_start(key_prefix, last))
            return items[:index], encode_page_token(after=last)
    return items, ""


def check_staging_shards(staging_shards: int) -> int:
    """1..MAX_STAGING_SHARDS, else INVALID_ARGUMENT / INVALID_STAGING_SHARDS."""
    if not 1 <= staging_shards <= MAX_STAGING_SHARDS:
        raise InvalidStagingShards(
            f"staging_shards must be 1..{MAX_STAGING_SHARDS}, not {staging_shards}",
            metadata={"staging_shards": str(staging_shards), "max": str(MAX_STAGING_SHARDS)},
        )
    return staging_shards


__all__ = ["CREATION_TTL_SECONDS", "Repositories", "page_by_name"]
