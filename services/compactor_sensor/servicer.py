"""CompactorSensor servicer: proto ⇄ CompactionSensor calls, nothing else."""

from __future__ import annotations

from quarry import errors
from quarry.compaction.sensor import CompactionSensor, StagingStats
from quarry.graveler import names
from quarry.v1 import compactor_sensor_pb2 as pb
from quarry.v1 import compactor_sensor_pb2_grpc


class CompactorSensorServicer(compactor_sensor_pb2_grpc.CompactorSensorServicer):
    def __init__(self, sensor: CompactionSensor):
        self._sensor = sensor

    def ReportStagingActivity(self, request, context):
        # Memory only: the sender (branch-manager's reporter) waits for this answer.
        self._sensor.record(
            StagingStats(r.repository, r.branch, r.staging_token, r.puts, r.deletes)
            for r in request.reports
        )
        return pb.ReportStagingActivityResponse()

    def GetBranchStagingStats(self, request, context):
        if not request.repository or not request.branch:
            raise errors.InvalidArgument("repository and branch are required")
        # Checked as every other service checks them (INVALID_NAME), before any lookup.
        names.check_repository_name(request.repository)
        names.check_branch_name(request.branch)
        stats = self._sensor.get_branch_stats(request.repository, request.branch)
        response = pb.GetBranchStagingStatsResponse(
            puts=stats.puts, deletes=stats.deletes, sealed_tokens=stats.sealed_tokens
        )
        if stats.last_compaction is not None:
            response.last_compaction.FromNanoseconds(int(stats.last_compaction * 1e9))
        return response

    def ListCompactionCandidates(self, request, context):
        candidates = self._sensor.list_candidates(request.page_size)
        return pb.ListCompactionCandidatesResponse(candidates=[c.to_proto() for c in candidates])
