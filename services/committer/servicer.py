"""Committer servicer: proto ⇄ Graveler calls, and who the committer is (quarry.auth.checks)."""

from __future__ import annotations

from quarry import errors
from quarry.actions.runs import Actions, Run
from quarry.auth.checks import committer_for
from quarry.convert import change_to_proto, conflict_to_proto, seconds_of, summary_to_proto
from quarry.graveler.core import check_page_size
from quarry.graveler.graveler import Graveler, MergeParams
from quarry.graveler.imports import ImportSource, ImportView
from quarry.graveler.iterators import decode_page_token, encode_page_token
from quarry.graveler.requests import RequestLog
from quarry.runtime.idempotency import idempotent
from quarry.v1 import committer_pb2 as pb
from quarry.v1 import committer_pb2_grpc


class CommitterServicer(committer_pb2_grpc.CommitterServicer):
    def __init__(self, graveler: Graveler, requests: RequestLog, authorizer=None):
        self._g = graveler
        # Auth on: the committer recorded is the calling user (quarry.auth.checks).
        self._authorizer = authorizer
        # Calls with a request_id run at most once (quarry.runtime.idempotency).
        self._requests = requests

    @idempotent(pb.CommitResponse)
    def Commit(self, request, context):
        outcome = self._g.commit(
            request.repository,
            request.branch,
            request.message,
            committer_for(request.committer, self._authorizer),
            dict(request.metadata),
            request.allow_empty,
        )
        return pb.CommitResponse(
            commit=outcome.commit,
            summary=summary_to_proto(outcome.summary),
            ranges_written=outcome.ranges_written,
            ranges_reused=outcome.ranges_reused,
        )

    def GetCommit(self, request, context):
        return pb.GetCommitResponse(commit=self._g.get_commit(request.repository, request.ref))

    def Log(self, request, context):
        commits, token = self._g.log(
            request.repository,
            request.ref,
            request.first_parent,
            request.page_size,
            request.page_token,
            objects=list(request.objects),
            prefixes=list(request.prefixes),
            since=seconds_of(request.since, "since") if request.HasField("since") else None,
        )
        return pb.LogResponse(commits=commits, next_page_token=token)

    def Diff(self, request, context):
        changes, token = self._g.diff(
            request.repository,
            request.left_ref,
            request.right_ref,
            request.prefix,
            request.page_size,
            request.page_token,
            three_dot=request.three_dot,
        )
        return pb.DiffResponse(changes=[change_to_proto(c) for c in changes], next_page_token=token)

    @idempotent(pb.MergeResponse, ignore=("hint_metarange_id",))
    def Merge(self, request, context):
        params = MergeParams(
            strategy=request.strategy,
            message=request.message,
            committer=committer_for(request.committer, self._authorizer),
            metadata=dict(request.metadata),
            squash=request.squash,
            allow_empty=request.allow_empty,
            dry_run=request.dry_run,
            hint_metarange_id=request.hint_metarange_id,
            destination_head_id=request.destination_head_id,
        )
        outcome = self._g.merge(
            request.repository, request.source_ref, request.destination_branch, params
        )
        response = pb.MergeResponse(
            summary=summary_to_proto(outcome.summary),
            conflicts=[conflict_to_proto(c) for c in outcome.conflicts],
            more_conflicts=outcome.more_conflicts,
            attempts=outcome.attempts,
            ranges_written=outcome.ranges_written,
            ranges_reused=outcome.ranges_reused,
        )
        if outcome.commit is not None:
            response.commit.CopyFrom(outcome.commit)
        return response

    @idempotent(pb.RevertResponse)
    def Revert(self, request, context):
        outcome = self._g.revert(
            request.repository,
            request.branch,
            request.ref,
            request.parent_number,
            request.message,
            committer_for(request.committer, self._authorizer),
        )
        return pb.RevertResponse(commit=outcome.commit)

    @idempotent(pb.CherryPickResponse)
    def CherryPick(self, request, context):
        outcome = self._g.cherry_pick(
            request.repository,
            request.branch,
            request.ref,
            request.parent_number,
            request.message,
            committer_for(request.committer, self._authorizer),
        )
        return pb.CherryPickResponse(commit=outcome.commit)

    def FindMergeBase(self, request, context):
        return pb.FindMergeBaseResponse(
            commit=self._g.find_merge_base(request.repository, request.left_ref, request.right_ref)
        )

    @idempotent(pb.CompactResponse)
    def Compact(self, request, context):
        compacted, tokens = self._g.compact(request.repository, request.branch)
        return pb.CompactResponse(compacted_metarange_id=compacted, tokens_compacted=tokens)

    # ---- imports (quarry.graveler.imports) -------------------------------------------------

    def StartImport(self, request, context):
        view = self._g.start_import(
            request.repository,
            request.branch,
            [ImportSource(s.uri, s.destination_path) for s in request.sources],
            request.message,
            committer_for(request.committer, self._authorizer),
            dict(request.metadata),
        )
        return pb.StartImportResponse(**{"import": import_to_proto(view)})

    def GetImportStatus(self, request, context):
        view = self._g.get_import(request.repository, request.id)
        return pb.GetImportStatusResponse(**{"import": import_to_proto(view)})

    def CancelImport(self, request, context):
        view = self._g.cancel_import(request.repository, request.id)
        return pb.CancelImportResponse(**{"import": import_to_proto(view)})

    # ---- action runs (quarry.actions.runs) -------------------------------------------------

    def ListActionRuns(self, request, context):
        # A commit as the CLI shows it (12 characters) or any ref names the commit whose
        # runs are listed; only a whole id matched, so a short one listed nothing.
        commit_id = request.commit_id
        if commit_id:
            commit_id = self._g.get_commit(request.repository, commit_id).id
        runs, token = self._actions().list_runs(
            self._g.repo(request.repository).partition,
            branch=request.branch,
            commit_id=commit_id,
            page_size=check_page_size(request.page_size),
            after=decode_page_token(request.page_token, "after").get("after", ""),
        )
        return pb.ListActionRunsResponse(
            runs=[run_to_proto(r) for r in runs],
            next_page_token=encode_page_token(after=token) if token else "",
        )

    def GetActionRun(self, request, context):
        if not request.run_id:
            raise errors.InvalidArgument("run_id is required")
        run = self._actions().get_run(self._g.repo(request.repository).partition, request.run_id)
        return pb.GetActionRunResponse(run=run_to_proto(run))

    def _actions(self) -> Actions:
        # Runs are readable even when this committer runs no hooks (QUARRY_ACTIONS_ENABLED
        # off now, on before): the records are in KV either way.
        return self._g.actions or Actions(self._g.kv)


def run_to_proto(run: Run) -> pb.ActionRun:
    message = pb.ActionRun(
        run_id=run.run_id,
        event=run.event_type,
        branch=run.branch_id,
        ref=run.source_ref,
        commit_id=run.commit_id,
        status=run.status,
        error=run.error,
    )
    message.start_time.FromNanoseconds(int(run.start_time * 1e9))
    if run.end_time:
        message.end_time.FromNanoseconds(int(run.end_time * 1e9))
    for hook in run.hooks:
        result = message.hooks.add(
            action=hook.action_name,
            hook_id=hook.hook_id,
            status=hook.status,
            http_status=hook.http_status,
            output=hook.output,
            error=hook.error,
        )
        result.duration.FromNanoseconds(int(hook.duration_seconds * 1e9))
    return message


def import_to_proto(view: ImportView) -> pb.Import:
    record = view.record
    message = pb.Import(
        id=record.id,
        repository=record.repository,
        branch=record.branch,
        state=pb.ImportState.Value(f"IMPORT_STATE_{record.state}"),
        sources=[pb.ImportSource(**source) for source in record.sources],
        objects_listed=record.objects_listed,
        bytes_listed=record.bytes_listed,
        objects_skipped=record.objects_skipped,
        ranges_written=record.ranges_written,
        error=record.error,
        cancel_requested=record.cancel_requested,
    )
    message.started.FromNanoseconds(int(record.started * 1e9))
    message.updated.FromNanoseconds(int(record.updated * 1e9))
    if view.commit is not None:
        message.commit.CopyFrom(view.commit)
    return message
