"""quarry.client.Client's Committer calls: commit, merge, revert, cherry-pick, diff, log,
merge base and compaction."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import cast

from quarry import errors
from quarry.client.calls import RpcCalls
from quarry.client.entries import request_id_or_new as _request_id
from quarry.graveler.model import MergeStrategy
from quarry.v1 import committer_pb2 as cm
from quarry.v1 import types_pb2


def _strategy(value: int | str | None) -> types_pb2.MergeStrategy.ValueType:
    """The wire value of a merge strategy (MergeStrategy.parse). A number other than a
    member goes to the server as is: it, not this build, knows which strategies exist."""
    if isinstance(value, int) and not isinstance(value, MergeStrategy):
        return cast("types_pb2.MergeStrategy.ValueType", value)
    return cast("types_pb2.MergeStrategy.ValueType", int(MergeStrategy.parse(value)))


class CommitterCalls(RpcCalls):
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
        destination_head_id: str = "",
        request_id: str | None = None,
    ) -> cm.MergeResponse:
        """`strategy`: a MergeStrategy value or 'source-wins' / 'dest-wins'. Conflicts raise
        FAILED_PRECONDITION / MERGE_CONFLICT (a MergeConflicts message in `exc.details`).
        A retry after ABORTED / HEAD_MOVED passes the server's hint_metarange_id back.
        `destination_head_id`: merge only while the destination's HEAD is that commit
        (FAILED_PRECONDITION / DESTINATION_MOVED otherwise, nothing written)."""
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
            destination_head_id=destination_head_id,
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

    def log(  # noqa: PLR0913 — the Log request, field for field
        self,
        repository: str,
        ref: str,
        first_parent: bool = False,
        page_size: int = 0,
        page_token: str = "",
        objects: Sequence[str] = (),
        prefixes: Sequence[str] = (),
        since: float | None = None,
    ) -> cm.LogResponse:
        """One page of history from `ref`, newest first; with `objects` / `prefixes` only
        the commits that changed those paths or something under those prefixes, with
        `since` (epoch seconds) only those made at or after it. A filtered page may hold
        fewer commits than asked, or none, and a token to go on (iter_log follows it)."""
        request = cm.LogRequest(
            repository=repository,
            ref=ref,
            first_parent=first_parent,
            page_size=page_size,
            page_token=page_token,
            objects=list(objects),
            prefixes=list(prefixes),
        )
        if since is not None:
            request.since.FromNanoseconds(int(since * 1e9))
        return self._unary(self._cm.Log, "Committer/Log", request)

    def iter_log(  # noqa: PLR0913 — the Log request's filters, and a limit
        self,
        repository: str,
        ref: str,
        first_parent: bool = False,
        limit: int | None = None,
        page_size: int = 0,
        objects: Sequence[str] = (),
        prefixes: Sequence[str] = (),
        since: float | None = None,
    ) -> Iterator[types_pb2.Commit]:
        """History from `ref`; at most `limit` commits (pages are sized to fit)."""
        if limit is not None and limit <= 0:
            return
        if limit is not None and not page_size:
            page_size = min(limit, 1000)
        count = 0
        for page in self._pages(
            self.log,
            repository=repository,
            ref=ref,
            first_parent=first_parent,
            page_size=page_size,
            objects=objects,
            prefixes=prefixes,
            since=since,
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

    # ---- imports ----------------------------------------------------------------------

    def start_import(
        self,
        repository: str,
        branch: str,
        sources: list[tuple[str, str]],
        message: str = "",
        metadata: Mapping[str, str] | None = None,
        committer: str = "",
    ) -> cm.Import:
        """Start a zero-copy import of `sources` [(uri, destination_path)] into the branch;
        returns the import (RUNNING) at once: poll get_import_status with its `.id`."""
        response = self._unary(
            self._cm.StartImport,
            "Committer/StartImport",
            cm.StartImportRequest(
                repository=repository,
                branch=branch,
                sources=[cm.ImportSource(uri=u, destination_path=p) for u, p in sources],
                message=message,
                metadata=dict(metadata or {}),
                committer=committer,
            ),
        )
        return getattr(response, "import")

    def list_action_runs(
        self,
        repository: str,
        branch: str = "",
        commit_id: str = "",
        page_size: int = 0,
        page_token: str = "",
    ) -> cm.ListActionRunsResponse:
        """Action runs newest first (docs/actions.md), optionally of a branch / a commit."""
        return self._unary(
            self._cm.ListActionRuns,
            "Committer/ListActionRuns",
            cm.ListActionRunsRequest(
                repository=repository,
                branch=branch,
                commit_id=commit_id,
                page_size=page_size,
                page_token=page_token,
            ),
        )

    def get_action_run(self, repository: str, run_id: str) -> cm.ActionRun:
        response = self._unary(
            self._cm.GetActionRun,
            "Committer/GetActionRun",
            cm.GetActionRunRequest(repository=repository, run_id=run_id),
        )
        return response.run

    def get_import_status(self, repository: str, import_id: str) -> cm.Import:
        response = self._unary(
            self._cm.GetImportStatus,
            "Committer/GetImportStatus",
            cm.GetImportStatusRequest(repository=repository, id=import_id),
        )
        return getattr(response, "import")

    def cancel_import(self, repository: str, import_id: str) -> cm.Import:
        response = self._unary(
            self._cm.CancelImport,
            "Committer/CancelImport",
            cm.CancelImportRequest(repository=repository, id=import_id),
        )
        return getattr(response, "import")
