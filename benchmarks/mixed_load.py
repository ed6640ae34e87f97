"""Writers, readers and committers on one branch at once, over gRPC (the in-process suite on
loopback, auth off): the throughput the concurrency test
(tests/integration/graveler/test_services.py::test_concurrent_writers_readers_committers_over_grpc)
does not assert. That test checks that nothing is stale or lost; this prints how fast.

BENCH_MIXED_WRITES (default 2000) acknowledged writes per run; reads and commits run alongside.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import grpc

from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import branch_manager_pb2_grpc, committer_pb2_grpc, types_pb2
from quarry.v1 import committer_pb2 as cm

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from support.hammer import hammer
from support.suite import running_suite

WRITES = int(os.environ.get("BENCH_MIXED_WRITES", "2000"))


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="quarry-bench-mixed-"))
    with running_suite(home, auth_enabled=False) as suite:
        bm_channel = grpc.insecure_channel(suite.targets["branch-manager"])
        cm_channel = grpc.insecure_channel(suite.targets["committer"])
        branches = branch_manager_pb2_grpc.BranchManagerStub(bm_channel)
        committer = committer_pb2_grpc.CommitterStub(cm_channel)
        branches.CreateRepository(
            bm.CreateRepositoryRequest(
                name="mixed", storage_namespace=suite.namespace("mixed"), default_branch="main"
            )
        )

        def put(path: str, version: int) -> None:
            entry = types_pb2.Entry(
                path=path, physical_address=f"{path}/{version}", checksum=f"v{version}"
            )
            branches.PutObject(bm.PutObjectRequest(repository="mixed", branch="main", entry=entry))

        def read(path: str) -> int | None:
            try:
                request = bm.StatObjectRequest(repository="mixed", ref="main", path=path)
                return int(branches.StatObject(request).entry.checksum[1:])
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.NOT_FOUND:
                    return None
                raise

        def commit() -> bool:
            try:
                committer.Commit(cm.CommitRequest(repository="mixed", branch="main", message="m"))
                return True
            except grpc.RpcError as error:
                if error.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ABORTED):
                    return False
                raise

        started = time.perf_counter()
        result = hammer(put, read, commit, min_writes=WRITES, min_reads=0, min_commits=0)
        seconds = time.perf_counter() - started
        bm_channel.close()
        cm_channel.close()
    print(
        f"  4 writers, 2 readers, 2 committers on one branch: {result.writes / seconds:.0f} "
        f"writes/s, {result.reads / seconds:.0f} reads/s, {result.commits / seconds:.1f} "
        f"commits/s over {seconds:.1f}s; stale reads {len(result.stale_reads)}, "
        f"errors {len(result.errors)}"
    )


if __name__ == "__main__":
    main()
