"""quarry.client.Client: the BranchManager and Committer APIs with retries and domain errors.

    from quarry.client import Client, RetryPolicy
    from quarry import errors

    with Client("127.0.0.1:7402", "127.0.0.1:7403") as client:
        client.create_repository("lake", "/data/lake")
        client.put_object("lake", "main", path="a.csv", physical_address="/data/a.csv",
                          size_bytes=10, checksum="...")
        outcome = client.commit("lake", "main", "first")
        for entry in client.iter_objects("lake", "main", prefix="a"):
            ...

The client is thin: one method per RPC, returning the protobuf messages of
quarry.v1 (the resource inside the response when the response holds just one, e.g.
`get_branch -> types_pb2.Branch`; the whole response when it carries more, e.g.
`commit -> CommitResponse(commit, summary)`, `list_objects -> ListObjectsResponse`).
`iter_*` helpers follow page tokens. Failures raise the QuarryError rebuilt from the
status (quarry.errors.NotFound and its subclasses such as BranchNotFound, etc.; the
reason is `exc.reason`). Calls failing with ABORTED or UNAVAILABLE, or with a
RESOURCE_EXHAUSTED that carries RetryInfo (throttling), are retried under the client's
RetryPolicy; any other RESOURCE_EXHAUSTED (e.g. MESSAGE_TOO_LARGE) fails at once.

Retries are idempotent: every mutating call except the staging writes (put_object(s),
delete_object(s)) carries a request_id (AIP-155), a fresh uuid4 per logical call kept
across its retries, so a Commit or Merge whose answer was lost is answered by the server
with the first result instead of running again. Pass `request_id=` to choose it (e.g. a
stable id derived from a job id, so a restarted driver gets the same answer), or "" for
none. Staging writes carry one only when asked (`request_id=`): they are idempotent by
entry identity already (an id only matters when another writer re-points the same path
between a lost answer and its retry), and an id costs two more conditional KV writes per
call: measured over loopback, a PutObject goes from 1 KV write to 3 and ~1.7x the latency;
a 1,000-entry PutObjects message +2 writes (+0.2 %) but ~1.3x the latency (the fingerprint
and two gateway round trips) — too much for the bulk path to pay by default. The records
also land in the repository's partition, not the staging one: ids on every staging write
would cap a repository at ~500 such calls/s under DynamoDB's 1,000 WCU/s per partition.

A Client is thread-safe (gRPC channels are); close it, or use it as a context manager.
"""

from __future__ import annotations

import heapq
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import grpc

from quarry import errors
from quarry.batching import batches
from quarry.client.entries import (
    Entry,
    as_entry,
    batch_request_id,
    make_entry,
    new_request_id,
    to_timestamp,
)
from quarry.client.entries import request_id_or_new as _request_id
from quarry.client.retry import Retrier, RetryPolicy
from quarry.client.streams import MAX_BATCH_BYTES, PutObjectsStream, StreamTarget, stage_stream

# Loaded so from_rpc_error can rebuild the core's classes (BranchNotFound, ...) by reason.
from quarry.graveler import errors as gerrors  # noqa: F401
from quarry.graveler import records as _records  # noqa: F401 — CORRUPT_RECORD
from quarry.graveler.model import MergeStrategy
from quarry.runtime.channels import open_channel
from quarry.runtime.errors import domain_errors, from_rpc_error
from quarry.v1 import (
    branch_manager_pb2 as bm,
)
from quarry.v1 import (
    branch_manager_pb2_grpc,
    committer_pb2_grpc,
    compactor_sensor_pb2_grpc,
    server_info_pb2,
    server_info_pb2_grpc,
    types_pb2,
)
from quarry.v1 import (
    committer_pb2 as cm,
)
from quarry.v1 import (
    compactor_sensor_pb2 as cs,
)

DELETE_BATCH = 1000

DeadlineExceeded = errors.DeadlineExceeded
Cancelled = errors.Cancelled


def rebuild_error(error: grpc.RpcError) -> errors.QuarryError:
    """The domain exception a call failed with (quarry.runtime.errors.from_rpc_error)."""
    return from_rpc_error(error)


def _strategy(value: int | str | None) -> int:
    """The wire value of a merge strategy (MergeStrategy.parse). A number other than a
    member goes to the server as is: it, not this build, knows which strategies exist."""
    if isinstance(value, int) and not isinstance(value, MergeStrategy):
        return value
    return int(MergeStrategy.parse(value))


# ---- the client -------------------------------------------------------------------------


class IncompleteListing(errors.DataLoss):
    """A listing page came back without some records the server could not read."""

    reason = "INCOMPLETE_LISTING"


class Client:
    """A client of the BranchManager and Committer services (see the module docstring),
    and of the CompactorSensor's statistics (`compactor_sensor`, dialed on first use)."""

    def __init__(
        self,
        branch_manager: str | grpc.Channel = "127.0.0.1:7402",
        committer: str | grpc.Channel = "127.0.0.1:7403",
        retry: RetryPolicy | None = None,
        timeout: float | None = 30.0,
        compactor_sensor: str | grpc.Channel = "127.0.0.1:7404",
        allow_incomplete_listings: bool = False,
    ):
        self.retry = retry if retry is not None else RetryPolicy()
        self.timeout = timeout
        # The iter_* helpers refuse a page the server left corrupt records out of
        # (IncompleteListing), unless this is set: code that decides from a listing what
        # is unreferenced (GC) or what a table holds (Spark) must never act on one. The CLI
        # sets it and warns instead.
        self.allow_incomplete_listings = allow_incomplete_listings
        # Corrupt records the server left out of the pages this client walked (see _pages).
        self.skipped_corrupt_records = 0
        self._owned: list[grpc.Channel] = []
        channels: dict[str, grpc.Channel] = {}

        def channel(target: str | grpc.Channel) -> grpc.Channel:
            if not isinstance(target, str):
                return target
            if target not in channels:
                channels[target] = open_channel(target)
                self._owned.append(channels[target])
            return channels[target]

        self.branch_manager_target = branch_manager if isinstance(branch_manager, str) else ""
        self.committer_target = committer if isinstance(committer, str) else ""
        self._bm_channel = channel(branch_manager)
        self._cm_channel = channel(committer)
        self._bm = branch_manager_pb2_grpc.BranchManagerStub(self._bm_channel)
        self._cm = committer_pb2_grpc.CommitterStub(self._cm_channel)
        self.compactor_sensor_target = compactor_sensor if isinstance(compactor_sensor, str) else ""
        self._cs_target = compactor_sensor
        self._cs_channel_factory = channel
        self._cs_stub: compactor_sensor_pb2_grpc.CompactorSensorStub | None = None
        self._cs_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Any, **kwargs: Any) -> Client:
        """Dial `settings.branch_manager_address`, `settings.committer_address` (and
        `settings.compactor_sensor_address` when sensor statistics are asked for)."""
        kwargs.setdefault("compactor_sensor", settings.compactor_sensor_address)
        return cls(
            branch_manager=settings.branch_manager_address,
            committer=settings.committer_address,
            **kwargs,
        )

    def close(self) -> None:
        for channel in self._owned:
            channel.close()
        self._owned.clear()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- plumbing ----

    def _unary(
        self,
        stub_method: Callable[..., Any],
        name: str,
        request: Any,
        before_retry: Callable[[errors.QuarryError, Any], None] | None = None,
    ) -> Any:
        def attempt(_number: int) -> Any:
            with domain_errors():
                return stub_method(request, timeout=self.timeout)

        hook: Callable[[errors.QuarryError], bool] | None = None
        if before_retry is not None:
            adjust = before_retry

            def hook(exc: errors.QuarryError) -> bool:
                adjust(exc, request)
                return True

        return Retrier(self.retry, name).run(attempt, hook)

    def _pages(self, call: Callable[..., Any], page_token: str = "", **kwargs: Any) -> Iterator:
        token = page_token
        while True:
            page = call(page_token=token, **kwargs)
            # The server left corrupt records out of this page (CORRUPT_RECORD): refuse, or
            # tally them so a caller (the CLI) can warn; `quarry doctor` names them.
            skipped = getattr(page, "skipped_corrupt_records", 0)
            if skipped:
                self.skipped_corrupt_records += skipped
                if not self.allow_incomplete_listings:
                    raise IncompleteListing(
                        f"the server left {skipped} corrupt record(s) out of this listing; "
                        f"refusing to go on with an incomplete listing (run `quarry doctor` "
                        f"to find them)",
                        metadata={"skipped_corrupt_records": str(skipped)},
                    )
            yield page
            token = page.next_page_token
            if not token:
                return

    def server_info(self, service: str = "branch-manager") -> server_info_pb2.GetServerInfoResponse:
        """GetServerInfo of the branch-manager or the committer."""
        channel = self._cm_channel if service == "committer" else self._bm_channel
        stub = server_info_pb2_grpc.ServerInfoStub(channel)
        return self._unary(
            stub.GetServerInfo, "ServerInfo/GetServerInfo", server_info_pb2.GetServerInfoRequest()
        )

    # ==== BranchManager: repositories ======================================================

    def create_repository(
        self,
        name: str,
        storage_namespace: str,
        default_branch: str = "main",
        *,
        request_id: str | None = None,
    ) -> types_pb2.Repository:
        return self._unary(
            self._bm.CreateRepository,
            "BranchManager/CreateRepository",
            bm.CreateRepositoryRequest(
                name=name,
                storage_namespace=storage_namespace,
                default_branch=default_branch,
                request_id=_request_id(request_id),
            ),
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
        request_id: str = "",
        **fields: Any,
    ) -> types_pb2.Entry:
        """Stage one entry: an Entry message, a mapping of its fields, or the fields as
        keyword arguments (`path=..., physical_address=..., size_bytes=..., checksum=...,
        mtime=datetime|epoch seconds|Timestamp, content_type=..., metadata={...}`).
        `if_absent`: ObjectExists (ALREADY_EXISTS) when the path already has an entry.
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
            request_id=request_id,
        )
        return self._unary(self._bm.PutObject, "BranchManager/PutObject", request).entry

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
        return stage_stream(self._bm.PutObjects, stream, self.retry, self.timeout)

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

    def iter_objects(
        self, repository: str, ref: str, prefix: str = "", delimiter: str = "", page_size: int = 0
    ) -> Iterator[types_pb2.Entry | str]:
        """Every entry under `prefix`, in path order, following page tokens. With a
        delimiter, common prefixes come as `str` items in their place in the order."""
        for page in self.iter_object_pages(repository, ref, prefix, delimiter, page_size):
            if not page.common_prefixes:
                yield from page.entries
                continue
            yield from heapq.merge(
                page.entries,
                page.common_prefixes,
                key=lambda item: item if isinstance(item, str) else item.path,
            )

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

    # ==== Committer ========================================================================

    def commit(  # noqa: PLR0913 — public keyword API, kept for callers
        self,
        repository: str,
        branch: str,
        message: str,
        committer: str = "",
        metadata: Mapping[str, str] | None = None,
        allow_empty: bool = False,
        *,
        request_id: str | None = None,
    ) -> cm.CommitResponse:
        """`.commit` and its `.summary` (added/removed/changed). NoChanges
        (FAILED_PRECONDITION) when nothing is staged and not `allow_empty`."""
        return self._unary(
            self._cm.Commit,
            "Committer/Commit",
            cm.CommitRequest(
                repository=repository,
                branch=branch,
                message=message,
                committer=committer,
                metadata=dict(metadata or {}),
                allow_empty=allow_empty,
                request_id=_request_id(request_id),
            ),
        )

    def merge(  # noqa: PLR0913 — public keyword API, kept for callers
        self,
        repository: str,
        source_ref: str,
        destination_branch: str,
        *,
        strategy: int | str | None = None,
        message: str = "",
        committer: str = "",
        metadata: Mapping[str, str] | None = None,
        squash: bool = False,
        allow_empty: bool = False,
        dry_run: bool = False,
        hint_metarange_id: str = "",
        request_id: str | None = None,
    ) -> cm.MergeResponse:
        """`strategy`: a MergeStrategy value or 'source-wins' / 'dest-wins'. Conflicts raise
        FAILED_PRECONDITION / MERGE_CONFLICT (a MergeConflicts message in `exc.details`).
        A retry after ABORTED / HEAD_MOVED passes the server's hint_metarange_id back."""
        request = cm.MergeRequest(
            repository=repository,
            source_ref=source_ref,
            destination_branch=destination_branch,
            strategy=_strategy(strategy),
            message=message,
            committer=committer,
            metadata=dict(metadata or {}),
            squash=squash,
            allow_empty=allow_empty,
            dry_run=dry_run,
            hint_metarange_id=hint_metarange_id,
            request_id=_request_id(request_id),
        )

        def use_hint(exc: errors.QuarryError, req: cm.MergeRequest) -> None:
            for detail in exc.details:
                if detail.Is(types_pb2.MergeRetryHint.DESCRIPTOR):
                    hint = types_pb2.MergeRetryHint()
                    detail.Unpack(hint)
                    if hint.hint_metarange_id:
                        req.hint_metarange_id = hint.hint_metarange_id

        return self._unary(self._cm.Merge, "Committer/Merge", request, before_retry=use_hint)

    def revert(  # noqa: PLR0913 — public keyword API, kept for callers
        self,
        repository: str,
        branch: str,
        ref: str,
        parent_number: int = 0,
        message: str = "",
        committer: str = "",
        *,
        request_id: str | None = None,
    ) -> types_pb2.Commit:
        return self._unary(
            self._cm.Revert,
            "Committer/Revert",
            cm.RevertRequest(
                repository=repository,
                branch=branch,
                ref=ref,
                parent_number=parent_number,
                message=message,
                committer=committer,
                request_id=_request_id(request_id),
            ),
        ).commit

    def cherry_pick(  # noqa: PLR0913 — public keyword API, kept for callers
        self,
        repository: str,
        branch: str,
        ref: str,
        parent_number: int = 0,
        message: str = "",
        committer: str = "",
        *,
        request_id: str | None = None,
    ) -> types_pb2.Commit:
        return self._unary(
            self._cm.CherryPick,
            "Committer/CherryPick",
            cm.CherryPickRequest(
                repository=repository,
                branch=branch,
                ref=ref,
                parent_number=parent_number,
                message=message,
                committer=committer,
                request_id=_request_id(request_id),
            ),
        ).commit

    def diff(  # noqa: PLR0913 — public keyword API, kept for callers
        self,
        repository: str,
        left_ref: str,
        right_ref: str,
        prefix: str = "",
        three_dot: bool = False,
        page_size: int = 0,
        page_token: str = "",
    ) -> cm.DiffResponse:
        """One page of changes from `left_ref` to `right_ref`."""
        return self._unary(
            self._cm.Diff,
            "Committer/Diff",
            cm.DiffRequest(
                repository=repository,
                left_ref=left_ref,
                right_ref=right_ref,
                prefix=prefix,
                three_dot=three_dot,
                page_size=page_size,
                page_token=page_token,
            ),
        )

    def iter_diff(
        self,
        repository: str,
        left_ref: str,
        right_ref: str,
        prefix: str = "",
        three_dot: bool = False,
        page_size: int = 0,
    ) -> Iterator[types_pb2.Change]:
        for page in self._pages(
            self.diff,
            repository=repository,
            left_ref=left_ref,
            right_ref=right_ref,
            prefix=prefix,
            three_dot=three_dot,
            page_size=page_size,
        ):
            yield from page.changes

    def get_commit(self, repository: str, ref: str) -> types_pb2.Commit:
        return self._unary(
            self._cm.GetCommit,
            "Committer/GetCommit",
            cm.GetCommitRequest(repository=repository, ref=ref),
        ).commit

    def log(
        self,
        repository: str,
        ref: str,
        first_parent: bool = False,
        page_size: int = 0,
        page_token: str = "",
    ) -> cm.LogResponse:
        """One page of history from `ref`, newest first."""
        return self._unary(
            self._cm.Log,
            "Committer/Log",
            cm.LogRequest(
                repository=repository,
                ref=ref,
                first_parent=first_parent,
                page_size=page_size,
                page_token=page_token,
            ),
        )

    def iter_log(
        self,
        repository: str,
        ref: str,
        first_parent: bool = False,
        limit: int | None = None,
        page_size: int = 0,
    ) -> Iterator[types_pb2.Commit]:
        """History from `ref`; at most `limit` commits (pages are sized to fit)."""
        if limit is not None and limit <= 0:
            return
        if limit is not None and not page_size:
            page_size = min(limit, 1000)
        count = 0
        for page in self._pages(
            self.log, repository=repository, ref=ref, first_parent=first_parent, page_size=page_size
        ):
            for commit in page.commits:
                yield commit
                count += 1
                if limit is not None and count >= limit:
                    return

    def find_merge_base(self, repository: str, left_ref: str, right_ref: str) -> types_pb2.Commit:
        return self._unary(
            self._cm.FindMergeBase,
            "Committer/FindMergeBase",
            cm.FindMergeBaseRequest(repository=repository, left_ref=left_ref, right_ref=right_ref),
        ).commit

    def compact(
        self, repository: str, branch: str, *, request_id: str | None = None
    ) -> cm.CompactResponse:
        """Compact the branch's staging area now: `.compacted_metarange_id` and
        `.tokens_compacted`."""
        return self._unary(
            self._cm.Compact,
            "Committer/Compact",
            cm.CompactRequest(
                repository=repository, branch=branch, request_id=_request_id(request_id)
            ),
        )

    # ==== CompactorSensor ==================================================================

    @property
    def _cs(self) -> compactor_sensor_pb2_grpc.CompactorSensorStub:
        with self._cs_lock:
            if self._cs_stub is None:
                self._cs_stub = compactor_sensor_pb2_grpc.CompactorSensorStub(
                    self._cs_channel_factory(self._cs_target)
                )
            return self._cs_stub

    def branch_staging_stats(
        self, repository: str, branch: str
    ) -> cs.GetBranchStagingStatsResponse:
        """The sensor's view of a branch: staged `.puts`, `.deletes` (tombstones),
        `.sealed_tokens` and `.last_compaction` (start time; unset if never)."""
        return self._unary(
            self._cs.GetBranchStagingStats,
            "CompactorSensor/GetBranchStagingStats",
            cs.GetBranchStagingStatsRequest(repository=repository, branch=branch),
        )

    def compaction_candidates(self, page_size: int = 0) -> list[cs.CompactionCandidate]:
        """Branches past a compaction threshold, with the threshold crossed (`.reason`)."""
        return list(
            self._unary(
                self._cs.ListCompactionCandidates,
                "CompactorSensor/ListCompactionCandidates",
                cs.ListCompactionCandidatesRequest(page_size=page_size),
            ).candidates
        )


__all__ = [
    "Client",
    "RetryPolicy",
    "DeadlineExceeded",
    "Cancelled",
    "make_entry",
    "as_entry",
    "to_timestamp",
    "rebuild_error",
    "Entry",
    "IncompleteListing",
    "new_request_id",
    "batch_request_id",
]
