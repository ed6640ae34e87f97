"""quarry.client.Client's BranchManager calls: repositories, branches, tags, garbage-collection
rules, and objects (stat, put, delete, list, uncommitted diff, discard)."""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, overload

from quarry import errors
from quarry.batching import batches
from quarry.client.calls import RpcCalls
from quarry.client.entries import as_entry, batch_request_id, make_entry
from quarry.client.entries import request_id_or_new as _request_id
from quarry.client.streams import MAX_BATCH_BYTES, PutObjectsStream, StreamTarget, stage_stream
from quarry.runtime.errors import domain_errors
from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import types_pb2

DELETE_BATCH = 1000
# A restore's records per message, and their bytes (as the server's dump streams them).
DUMP_RECORDS_PER_MESSAGE = 500
DUMP_MESSAGE_BYTES = 1 << 20


def _size(record: bm.RepositoryDumpRecord) -> int:
    return record.ByteSize()


def maybe_dirty(branch: types_pb2.Branch) -> bool:
    """Whether the record alone allows uncommitted changes: the current token's `dirty`
    flag (absent in records older than the field: dirty), sealed tokens, a compacted
    metarange. False is certain; True is decided by has_uncommitted."""
    return (
        not branch.HasField("dirty")
        or branch.dirty
        or bool(branch.sealed_tokens)
        or bool(branch.compacted_metarange_id)
    )


class BranchManagerCalls(RpcCalls):
    # ==== BranchManager: repositories ======================================================

    def create_repository(
        self,
        name: str,
        storage_namespace: str,
        default_branch: str = "main",
        *,
        staging_shards: int = 0,
        request_id: str | None = None,
    ) -> types_pb2.Repository:
        """`staging_shards`: KV partitions per staging token (0: the server's default, 1)."""
        return self._unary(
            self._bm.CreateRepository,
            "BranchManager/CreateRepository",
            bm.CreateRepositoryRequest(
                name=name,
                storage_namespace=storage_namespace,
                default_branch=default_branch,
                staging_shards=staging_shards,
                request_id=_request_id(request_id),
            ),
        ).repository

    def update_repository(
        self,
        name: str,
        *,
        staging_shards: int | None = None,
        request_id: str | None = None,
    ) -> types_pb2.Repository:
        """Change settings (None: unchanged); staging_shards applies from each branch's
        next staging token."""
        request = bm.UpdateRepositoryRequest(name=name, request_id=_request_id(request_id))
        if staging_shards is not None:
            request.staging_shards = staging_shards
        return self._unary(
            self._bm.UpdateRepository, "BranchManager/UpdateRepository", request
        ).repository

    def get_repository(self, name: str) -> types_pb2.Repository:
        return self._unary(
            self._bm.GetRepository,
            "BranchManager/GetRepository",
            bm.GetRepositoryRequest(name=name),
        ).repository

    def list_repositories(
        self, page_size: int = 0, page_token: str = ""
    ) -> bm.ListRepositoriesResponse:
        """One page: `.repositories`, `.next_page_token` ('' on the last page)."""
        return self._unary(
            self._bm.ListRepositories,
            "BranchManager/ListRepositories",
            bm.ListRepositoriesRequest(page_size=page_size, page_token=page_token),
        )

    def iter_repositories(self, page_size: int = 0) -> Iterator[types_pb2.Repository]:
        for page in self._pages(self.list_repositories, page_size=page_size):
            yield from page.repositories

    def delete_repository(self, name: str, *, request_id: str | None = None) -> None:
        self._unary(
            self._bm.DeleteRepository,
            "BranchManager/DeleteRepository",
            bm.DeleteRepositoryRequest(name=name, request_id=_request_id(request_id)),
        )

    # ==== repository dumps (quarry.graveler.dumps) =========================================

    def dump_repository(self, name: str) -> Iterator[bm.RepositoryDumpRecord]:
        """The records of a dump of repository `name`, in order, as they stream in (not
        retried: a dump read again starts over, which is the caller's call). Consume it
        within the client's timeout."""
        with domain_errors():
            request = bm.DumpRepositoryRequest(name=name)
            for response in self._bm.DumpRepository(request, timeout=self.timeout):
                yield from response.records

    def restore_repository(
        self,
        name: str,
        storage_namespace: str,
        records: Iterable[bm.RepositoryDumpRecord],
        *,
        adopt_namespace: bool = False,
    ) -> bm.RestoreRepositoryResponse:
        """A new repository `name` from a dump's `records`, over `storage_namespace` (not
        retried: a restore that may have completed answers ALREADY_EXISTS when run again)."""

        def requests() -> Iterator[bm.RestoreRepositoryRequest]:
            first: bm.RestoreRepositoryRequest | None = bm.RestoreRepositoryRequest(
                name=name, storage_namespace=storage_namespace, adopt_namespace=adopt_namespace
            )
            for batch in batches(records, DUMP_RECORDS_PER_MESSAGE, DUMP_MESSAGE_BYTES, _size):
                if first is not None:
                    first.records.extend(batch)
                    yield first
                    first = None
                else:
                    yield bm.RestoreRepositoryRequest(records=batch)
            if first is not None:
                yield first  # an empty dump: the server says what is missing

        with domain_errors():
            return self._bm.RestoreRepository(requests(), timeout=self.timeout)

    # ==== branches =========================================================================

    def create_branch(
        self, repository: str, name: str, source_ref: str = "", *, request_id: str | None = None
    ) -> types_pb2.Branch:
        """`source_ref` empty: the server's default (the repository's default branch)."""
        return self._unary(
            self._bm.CreateBranch,
            "BranchManager/CreateBranch",
            bm.CreateBranchRequest(
                repository=repository,
                name=name,
                source_ref=source_ref,
                request_id=_request_id(request_id),
            ),
        ).branch

    def get_branch(self, repository: str, name: str) -> types_pb2.Branch:
        return self._unary(
            self._bm.GetBranch,
            "BranchManager/GetBranch",
            bm.GetBranchRequest(repository=repository, name=name),
        ).branch

    def branch_to_write(self, repository: str, name: str) -> types_pb2.Branch:
        """get_branch for a writer that checks its target before moving any bytes: a tag's
        name is NOT_A_BRANCH (FAILED_PRECONDITION), as the write itself would answer,
        not "branch not found"."""
        from quarry.graveler import errors as gerrors

        try:
            return self.get_branch(repository, name)
        except errors.NotFound as missing:
            try:
                self.get_tag(repository, name)
            except errors.QuarryError:
                raise missing from None
            raise gerrors.NotABranch(
                f"{name!r} is a tag; writes and uncommitted changes need a branch",
                metadata={"repository": repository, "ref": name},
            ) from None

    def list_branches(
        self, repository: str, page_size: int = 0, page_token: str = ""
    ) -> bm.ListBranchesResponse:
        return self._unary(
            self._bm.ListBranches,
            "BranchManager/ListBranches",
            bm.ListBranchesRequest(
                repository=repository, page_size=page_size, page_token=page_token
            ),
        )

    def iter_branches(self, repository: str, page_size: int = 0) -> Iterator[types_pb2.Branch]:
        for page in self._pages(self.list_branches, repository=repository, page_size=page_size):
            yield from page.branches

    def delete_branch(self, repository: str, name: str, *, request_id: str | None = None) -> None:
        self._unary(
            self._bm.DeleteBranch,
            "BranchManager/DeleteBranch",
            bm.DeleteBranchRequest(
                repository=repository, name=name, request_id=_request_id(request_id)
            ),
        )

    def reset_branch(
        self,
        repository: str,
        branch: str,
        ref: str,
        force: bool = False,
        *,
        request_id: str | None = None,
    ) -> types_pb2.Branch:
        """Hard reset to `ref`; DirtyBranch (FAILED_PRECONDITION) on uncommitted changes
        unless `force`."""
        return self._unary(
            self._bm.ResetBranch,
            "BranchManager/ResetBranch",
            bm.ResetBranchRequest(
                repository=repository,
                branch=branch,
                ref=ref,
                force=force,
                request_id=_request_id(request_id),
            ),
        ).branch

    # ==== tags =============================================================================

    def create_tag(
        self, repository: str, name: str, ref: str, *, request_id: str | None = None
    ) -> types_pb2.Tag:
        return self._unary(
            self._bm.CreateTag,
            "BranchManager/CreateTag",
            bm.CreateTagRequest(
                repository=repository, name=name, ref=ref, request_id=_request_id(request_id)
            ),
        ).tag

    def get_tag(self, repository: str, name: str) -> types_pb2.Tag:
        return self._unary(
            self._bm.GetTag,
            "BranchManager/GetTag",
            bm.GetTagRequest(repository=repository, name=name),
        ).tag

    def list_tags(
        self, repository: str, page_size: int = 0, page_token: str = ""
    ) -> bm.ListTagsResponse:
        return self._unary(
            self._bm.ListTags,
            "BranchManager/ListTags",
            bm.ListTagsRequest(repository=repository, page_size=page_size, page_token=page_token),
        )

    def iter_tags(self, repository: str, page_size: int = 0) -> Iterator[types_pb2.Tag]:
        for page in self._pages(self.list_tags, repository=repository, page_size=page_size):
            yield from page.tags

    def delete_tag(self, repository: str, name: str, *, request_id: str | None = None) -> None:
        self._unary(
            self._bm.DeleteTag,
            "BranchManager/DeleteTag",
            bm.DeleteTagRequest(
                repository=repository, name=name, request_id=_request_id(request_id)
            ),
        )

    # ==== garbage-collection rules ==========================================================

    def set_gc_rules(
        self,
        repository: str,
        default_retention_days: float,
        branch_retention_days: Mapping[str, float] | None = None,
    ) -> None:
        rules = types_pb2.GarbageCollectionRules(
            default_retention_days=default_retention_days,
            branch_retention_days=dict(branch_retention_days or {}),
        )
        self._unary(
            self._bm.SetGarbageCollectionRules,
            "BranchManager/SetGarbageCollectionRules",
            bm.SetGarbageCollectionRulesRequest(repository=repository, rules=rules),
        )

    def get_gc_rules(self, repository: str) -> types_pb2.GarbageCollectionRules:
        """NOT_FOUND (GC_RULES_NOT_FOUND) when the repository has none."""
        return self._unary(
            self._bm.GetGarbageCollectionRules,
            "BranchManager/GetGarbageCollectionRules",
            bm.GetGarbageCollectionRulesRequest(repository=repository),
        ).rules

    def delete_gc_rules(self, repository: str) -> None:
        self._unary(
            self._bm.DeleteGarbageCollectionRules,
            "BranchManager/DeleteGarbageCollectionRules",
            bm.DeleteGarbageCollectionRulesRequest(repository=repository),
        )

    # ==== branch protection =================================================================

    def set_branch_protection_rules(
        self,
        repository: str,
        rules: Sequence[bm.BranchProtectionRule],
        if_checksum: str = "",
        *,
        request_id: str | None = None,
    ) -> str:
        """Replace the repository's branch protection rules; returns their checksum. With
        if_checksum (from get_branch_protection_rules) only if they are unchanged, else
        FAILED_PRECONDITION / PRECONDITION_FAILED."""
        return self._unary(
            self._bm.SetBranchProtectionRules,
            "BranchManager/SetBranchProtectionRules",
            bm.SetBranchProtectionRulesRequest(
                repository=repository,
                rules=list(rules),
                if_checksum=if_checksum,
                request_id=_request_id(request_id),
            ),
        ).checksum

    def get_branch_protection_rules(
        self, repository: str
    ) -> tuple[list[bm.BranchProtectionRule], str]:
        """The rules and their checksum (none: an empty list)."""
        response = self._unary(
            self._bm.GetBranchProtectionRules,
            "BranchManager/GetBranchProtectionRules",
            bm.GetBranchProtectionRulesRequest(repository=repository),
        )
        return list(response.rules), response.checksum

    # ==== objects ==========================================================================

    def stat_object(self, repository: str, ref: str, path: str) -> types_pb2.Entry:
        return self._unary(
            self._bm.StatObject,
            "BranchManager/StatObject",
            bm.StatObjectRequest(repository=repository, ref=ref, path=path),
        ).entry

    def put_object(
        self,
        repository: str,
        branch: str,
        entry: types_pb2.Entry | Mapping[str, Any] | None = None,
        *,
        if_absent: bool = False,
        if_match_checksum: str = "",
        request_id: str = "",
        **fields: Any,
    ) -> types_pb2.Entry:
        """Stage one entry: an Entry message, a mapping of its fields, or the fields as
        keyword arguments (`path=..., physical_address=..., size_bytes=..., checksum=...,
        mtime=datetime|epoch seconds|Timestamp, content_type=..., metadata={...}`).
        `if_absent`: ObjectExists (ALREADY_EXISTS) when the path already has an entry.
        `if_match_checksum`: CHECKSUM_CONDITION_FAILED (FAILED_PRECONDITION) unless the path's entry has
        this checksum (a compare-and-swap).
        `request_id`: none unless given (see the module docstring)."""
        if entry is None:
            entry = make_entry(**fields)
        elif fields:
            raise TypeError("pass an entry or its fields as keywords, not both")
        request = bm.PutObjectRequest(
            repository=repository,
            branch=branch,
            entry=as_entry(entry),
            if_absent=if_absent,
            if_match_checksum=if_match_checksum,
            request_id=request_id,
        )
        return self._unary(
            self._bm.PutObject,
            "BranchManager/PutObject",
            request,
            metadata=self._relay_metadata(),
        ).entry

    def copy_object(  # noqa: PLR0913 — public keyword API
        self,
        repository: str,
        source_ref: str,
        source_path: str,
        branch: str,
        path: str,
        *,
        if_absent: bool = False,
        request_id: str = "",
    ) -> types_pb2.Entry:
        """Stage `path` on `branch` with the entry of `source_path` at `source_ref` (the
        same bytes, content type and metadata); the staged entry. `if_absent`: ObjectExists
        when `path` already has an entry. `request_id`: none unless given."""
        request = bm.CopyObjectRequest(
            repository=repository,
            source_ref=source_ref,
            source_path=source_path,
            branch=branch,
            path=path,
            if_absent=if_absent,
            request_id=request_id,
        )
        return self._unary(self._bm.CopyObject, "BranchManager/CopyObject", request).entry

    def put_objects(  # noqa: PLR0913 — public keyword API, kept for callers
        self,
        repository: str,
        branch: str,
        entries: Iterable[types_pb2.Entry | Mapping[str, Any]],
        batch_size: int = 1000,
        progress: Callable[[int], None] | None = None,
        *,
        replay: bool = True,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        request_id: str = "",
    ) -> int:
        """Stage many entries over one PutObjects stream, `batch_size` entries a message.

        `entries` is consumed lazily, once. `progress(n)` is called with the number of
        entries handed to the stream so far, after each new batch. Returns the server's
        count (within one batch the last entry of a path wins, so duplicates count once).

        On a retryable failure the whole stream is sent again (staging is idempotent by
        entry identity): the batches already sent are kept in memory for that. With
        `replay=False` they are not kept, and the stream is retried only if it failed
        before its first batch.

        `request_id` (none unless given): message i carries batch_request_id(request_id, i),
        so a replayed stream stages no batch twice and answers the first count."""
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        if request_id:
            uuid.UUID(request_id)  # batch ids derive from it
        target = StreamTarget(repository, branch, batch_size, max_batch_bytes, request_id)
        stream = PutObjectsStream(target, entries, replay, progress)
        return stage_stream(
            self._bm.PutObjects, stream, self.retry, self.timeout, self._relay_metadata()
        )

    def delete_object(
        self, repository: str, branch: str, path: str, *, request_id: str = ""
    ) -> None:
        self._unary(
            self._bm.DeleteObject,
            "BranchManager/DeleteObject",
            bm.DeleteObjectRequest(
                repository=repository, branch=branch, path=path, request_id=request_id
            ),
        )

    def delete_objects(
        self,
        repository: str,
        branch: str,
        paths: Iterable[str],
        batch_size: int = DELETE_BATCH,
        progress: Callable[[int], None] | None = None,
        *,
        request_id: str = "",
    ) -> int:
        """Stage tombstones, `batch_size` paths a call. Returns how many existed.
        `progress(n)` gets the number of paths sent so far after each call. `request_id`
        (none unless given): call i carries batch_request_id(request_id, i)."""
        if request_id:
            uuid.UUID(request_id)
        total = 0
        done = 0
        for call, batch in enumerate(batches(paths, max(1, batch_size))):
            call_id = batch_request_id(request_id, call) if request_id else ""
            response = self._unary(
                self._bm.DeleteObjects,
                "BranchManager/DeleteObjects",
                bm.DeleteObjectsRequest(
                    repository=repository, branch=branch, paths=batch, request_id=call_id
                ),
            )
            total += response.deleted
            done += len(batch)
            if progress is not None:
                progress(done)
        return total

    def list_objects(
        self,
        repository: str,
        ref: str,
        prefix: str = "",
        delimiter: str = "",
        page_size: int = 0,
        page_token: str = "",
    ) -> bm.ListObjectsResponse:
        """One page: `.entries`, `.common_prefixes` (with a delimiter), `.next_page_token`."""
        return self._unary(
            self._bm.ListObjects,
            "BranchManager/ListObjects",
            bm.ListObjectsRequest(
                repository=repository,
                ref=ref,
                prefix=prefix,
                delimiter=delimiter,
                page_size=page_size,
                page_token=page_token,
            ),
        )

    def iter_object_pages(
        self, repository: str, ref: str, prefix: str = "", delimiter: str = "", page_size: int = 0
    ) -> Iterator[bm.ListObjectsResponse]:
        return self._pages(
            self.list_objects,
            repository=repository,
            ref=ref,
            prefix=prefix,
            delimiter=delimiter,
            page_size=page_size,
        )

    @overload
    def iter_objects(
        self,
        repository: str,
        ref: str,
        prefix: str = "",
        delimiter: Literal[""] = "",
        page_size: int = 0,
    ) -> Iterator[types_pb2.Entry]: ...

    @overload
    def iter_objects(
        self, repository: str, ref: str, prefix: str = "", delimiter: str = "", page_size: int = 0
    ) -> Iterator[types_pb2.Entry | str]: ...

    def iter_objects(
        self, repository: str, ref: str, prefix: str = "", delimiter: str = "", page_size: int = 0
    ) -> Iterator[types_pb2.Entry | str]:
        """Every entry under `prefix`, in path order, following page tokens. With a
        delimiter, common prefixes come as `str` items in their place in the order
        (without one, only entries)."""
        for page in self.iter_object_pages(repository, ref, prefix, delimiter, page_size):
            if not page.common_prefixes:
                yield from page.entries
                continue
            sources: list[Iterable[types_pb2.Entry | str]] = [page.entries, page.common_prefixes]
            yield from heapq.merge(*sources, key=_path_of)

    def diff_uncommitted(
        self,
        repository: str,
        branch: str,
        prefix: str = "",
        page_size: int = 0,
        page_token: str = "",
    ) -> bm.DiffUncommittedResponse:
        return self._unary(
            self._bm.DiffUncommitted,
            "BranchManager/DiffUncommitted",
            bm.DiffUncommittedRequest(
                repository=repository,
                branch=branch,
                prefix=prefix,
                page_size=page_size,
                page_token=page_token,
            ),
        )

    def has_uncommitted(self, repository: str, branch: str) -> bool:
        """Whether the branch holds uncommitted changes (a corrupt staged value counts):
        one DiffUncommitted page of one change, free on a clean branch. Never decided from
        the record's `dirty` flag, which describes only the current staging token: sealed
        tokens and a compacted metarange hold changes too."""
        page = self.diff_uncommitted(repository, branch, page_size=1)
        return bool(page.changes) or page.skipped_corrupt_records > 0

    def iter_uncommitted(
        self, repository: str, branch: str, prefix: str = "", page_size: int = 0
    ) -> Iterator[types_pb2.Change]:
        for page in self._pages(
            self.diff_uncommitted,
            repository=repository,
            branch=branch,
            prefix=prefix,
            page_size=page_size,
        ):
            yield from page.changes

    def discard_changes(
        self,
        repository: str,
        branch: str,
        path: str = "",
        prefix: str = "",
        *,
        request_id: str | None = None,
    ) -> None:
        """Drop uncommitted changes of one path, of a prefix, or (neither) of everything."""
        self._unary(
            self._bm.DiscardChanges,
            "BranchManager/DiscardChanges",
            bm.DiscardChangesRequest(
                repository=repository,
                branch=branch,
                path=path,
                prefix=prefix,
                request_id=_request_id(request_id),
            ),
        )


def _path_of(item: types_pb2.Entry | str) -> str:
    return item if isinstance(item, str) else item.path
