"""Committer servicer: proto ⇄ Graveler calls, nothing else."""

from __future__ import annotations

from quarry import errors
from quarry.convert import change_to_proto, summary_to_proto
from quarry.graveler.graveler import Graveler
from quarry.v1 import committer_pb2 as pb
from quarry.v1 import committer_pb2_grpc


class CommitterServicer(committer_pb2_grpc.CommitterServicer):
    def __init__(self, graveler: Graveler):
        self._g = graveler

    def Commit(self, request, context):
        outcome = self._g.commit(request.repository, request.branch, request.message,
                                 request.committer, dict(request.metadata),
                                 request.allow_empty)
        return pb.CommitResponse(commit=outcome.commit, summary=summary_to_proto(outcome.summary),
                                 ranges_written=outcome.ranges_written,
                                 ranges_reused=outcome.ranges_reused)

    def GetCommit(self, request, context):
        return pb.GetCommitResponse(commit=self._g.get_commit(request.repository, request.ref))

    def Log(self, request, context):
        commits, token = self._g.log(request.repository, request.ref, request.first_parent,
                                     request.page_size, request.page_token)
        return pb.LogResponse(commits=commits, next_page_token=token)

    def Diff(self, request, context):
        if request.three_dot:
            raise errors.Unimplemented("three-dot diff arrives with merge (issue 4)")
        changes, token = self._g.diff(request.repository, request.left_ref, request.right_ref,
                                      request.prefix, request.page_size, request.page_token)
        return pb.DiffResponse(changes=[change_to_proto(c) for c in changes],
                               next_page_token=token)

    def Merge(self, request, context):
        raise errors.Unimplemented("Merge is not built yet (issue 4)")

    def Revert(self, request, context):
        raise errors.Unimplemented("Revert is not built yet (issue 4)")

    def CherryPick(self, request, context):
        raise errors.Unimplemented("CherryPick is not built yet (issue 4)")

    def FindMergeBase(self, request, context):
        raise errors.Unimplemented("FindMergeBase is not built yet (issue 4)")

    def Compact(self, request, context):
        raise errors.Unimplemented("Compact is not built yet (issue 5)")
