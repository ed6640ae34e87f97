"""A scripted fake of BranchManager and Committer on a real gRPC server (port 0), behind
the real error interceptor, so the client sees exactly the statuses Quarry servers send."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc

from quarry import errors
from quarry.client import Client, RetryPolicy
from quarry.runtime.errors import ErrorInterceptor
from quarry.v1 import branch_manager_pb2 as bm
from quarry.v1 import branch_manager_pb2_grpc, committer_pb2_grpc, types_pb2
from quarry.v1 import committer_pb2 as cm


class Script:
    """Per-method queues of exceptions raised before the method answers normally."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.failures: dict[str, list[BaseException]] = {}
        self.calls: dict[str, int] = {}
        self.requests: dict[str, list] = {}

    def fail(self, method: str, *excs: BaseException) -> None:
        self.failures.setdefault(method, []).extend(excs)

    def fail_always(self, method: str, exc: BaseException) -> None:
        self.failures[method] = _Forever(exc)

    def enter(self, method: str, request) -> None:
        with self._lock:
            self.calls[method] = self.calls.get(method, 0) + 1
            self.requests.setdefault(method, []).append(request)
            queue = self.failures.get(method)
            exc = queue.pop(0) if queue else None
        if exc is not None:
            raise exc


class _Forever(list):
    def __init__(self, exc):
        super().__init__([exc])
        self._exc = exc

    def pop(self, _index=0):
        return self._exc


def _entries(n: int, prefix: str = "") -> list[types_pb2.Entry]:
    return [
        types_pb2.Entry(path=f"{prefix}{i:05d}", physical_address=f"s3://b/{i}", size_bytes=i)
        for i in range(n)
    ]


class FakeBranchManager(branch_manager_pb2_grpc.BranchManagerServicer):
    def __init__(self, script: Script):
        self.script = script
        self.streams: list[list[bm.PutObjectsRequest]] = []
        # PutObjects: fail with this after reading `fail_after` messages, `stream_failures`
        # times.
        self.stream_failures = 0
        self.fail_after = 2
        self.stream_error: BaseException = errors.Aborted("lost a race")
        self.objects = [
            types_pb2.Entry(path=p, size_bytes=1)
            for p in ("a.csv", "b/1", "b/2", "c.csv", "d/x", "e.csv")
        ]
        self.delay = 0.0
        # The authorization header of each GetRepository call (None: none sent).
        self.authorization: list[str | None] = []

    def CreateRepository(self, request, context):
        self.script.enter("CreateRepository", request)
        return bm.CreateRepositoryResponse(
            repository=types_pb2.Repository(
                name=request.name,
                storage_namespace=request.storage_namespace,
                default_branch=request.default_branch or "main",
            )
        )

    def GetRepository(self, request, context):
        self.script.enter("GetRepository", request)
        self.authorization.append(dict(context.invocation_metadata()).get("authorization"))
        if self.delay:
            time.sleep(self.delay)
        return bm.GetRepositoryResponse(repository=types_pb2.Repository(name=request.name))

    def GetBranch(self, request, context):
        self.script.enter("GetBranch", request)
        return bm.GetBranchResponse(branch=types_pb2.Branch(name=request.name, commit_id="c1"))

    def ListBranches(self, request, context):
        self.script.enter("ListBranches", request)
        names = [f"b{i}" for i in range(7)]
        start = int(request.page_token or 0)
        size = request.page_size or 3
        page = names[start : start + size]
        token = str(start + size) if start + size < len(names) else ""
        return bm.ListBranchesResponse(
            branches=[types_pb2.Branch(name=n) for n in page], next_page_token=token
        )

    def PutObject(self, request, context):
        self.script.enter("PutObject", request)
        return bm.PutObjectResponse(entry=request.entry)

    def PutObjects(self, request_iterator, context):
        self.script.enter("PutObjects", None)
        received = []
        self.streams.append(received)
        fail = self.stream_failures > 0
        for request in request_iterator:
            received.append(request)
            if fail and len(received) >= self.fail_after:
                self.stream_failures -= 1
                raise self.stream_error
        if not received or not received[0].repository or not received[0].branch:
            raise errors.InvalidArgument("the first message must name repository and branch")
        return bm.PutObjectsResponse(count=sum(len(r.entries) for r in received))

    def DeleteObjects(self, request, context):
        self.script.enter("DeleteObjects", request)
        return bm.DeleteObjectsResponse(deleted=len(request.paths))

    def ListObjects(self, request, context):
        self.script.enter("ListObjects", request)
        items: list = []
        seen = set()
        for entry in self.objects:
            if not entry.path.startswith(request.prefix):
                continue
            rest = entry.path[len(request.prefix) :]
            if request.delimiter and request.delimiter in rest:
                common = request.prefix + rest.split(request.delimiter)[0] + request.delimiter
                if common not in seen:
                    seen.add(common)
                    items.append(common)
            else:
                items.append(entry)
        start = int(request.page_token or 0)
        size = request.page_size or 1000
        page = items[start : start + size]
        token = str(start + size) if start + size < len(items) else ""
        return bm.ListObjectsResponse(
            entries=[i for i in page if not isinstance(i, str)],
            common_prefixes=[i for i in page if isinstance(i, str)],
            next_page_token=token,
        )


class FakeCommitter(committer_pb2_grpc.CommitterServicer):
    def __init__(self, script: Script):
        self.script = script

    def Commit(self, request, context):
        self.script.enter("Commit", request)
        return cm.CommitResponse(
            commit=types_pb2.Commit(id="c2", message=request.message, metadata=request.metadata),
            summary=types_pb2.DiffSummary(added=1),
        )

    def Merge(self, request, context):
        self.script.enter("Merge", request)
        return cm.MergeResponse(commit=types_pb2.Commit(id="m1"), attempts=1)

    def Log(self, request, context):
        self.script.enter("Log", request)
        commits = [types_pb2.Commit(id=f"c{i}") for i in range(10, 0, -1)]
        start = int(request.page_token or 0)
        size = request.page_size or 4
        page = commits[start : start + size]
        token = str(start + size) if start + size < len(commits) else ""
        return cm.LogResponse(commits=page, next_page_token=token)


class Fake:
    def __init__(self):
        self.script = Script()
        self.branch_manager = FakeBranchManager(self.script)
        self.committer = FakeCommitter(self.script)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8), interceptors=[ErrorInterceptor()]
        )
        branch_manager_pb2_grpc.add_BranchManagerServicer_to_server(
            self.branch_manager, self.server
        )
        committer_pb2_grpc.add_CommitterServicer_to_server(self.committer, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.target = f"127.0.0.1:{port}"
        self.server.start()

    def client(self, **kwargs) -> Client:
        kwargs.setdefault("retry", FAST)
        return Client(branch_manager=self.target, committer=self.target, **kwargs)

    def stop(self) -> None:
        self.server.stop(None).wait()


# Tiny delays keep the retry tests fast; jitter stays on.
FAST = RetryPolicy(base_delay=0.005, max_delay=0.02, budget=5.0)


entries = _entries
