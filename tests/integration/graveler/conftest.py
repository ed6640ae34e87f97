import grpc
import pytest

from quarry.kv.memory import MemoryStore
from quarry.v1 import branch_manager_pb2_grpc, committer_pb2_grpc
from support.counting import CountingStore
from support.suite import suite_fixture


class Stubs:
    def __init__(self, suite):
        self.suite = suite
        self._channels = [
            grpc.insecure_channel(suite.targets["branch-manager"]),
            grpc.insecure_channel(suite.targets["committer"]),
        ]
        self.bm = branch_manager_pb2_grpc.BranchManagerStub(self._channels[0])
        self.cm = committer_pb2_grpc.CommitterStub(self._channels[1])

    def close(self):
        for channel in self._channels:
            channel.close()


@pytest.fixture(scope="module")
def counting_backend():
    return CountingStore(MemoryStore())


suite = suite_fixture(
    backend="counting_backend", staging_drop_grace_seconds=3.0, staging_drop_interval_seconds=0.05
)


@pytest.fixture(scope="module")
def stubs(suite):
    s = Stubs(suite)
    yield s
    s.close()
