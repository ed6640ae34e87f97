import grpc
import pytest

from quarry.kv.memory import MemoryStore
from quarry.v1 import branch_manager_pb2_grpc, committer_pb2_grpc
from support.counting import CountingStore
from support.suite import running_suite


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


@pytest.fixture(scope="module")
def suite(tmp_path_factory, counting_backend):
    with running_suite(
        tmp_path_factory.mktemp("suite"),
        backend=counting_backend,
        # A valid grace (Settings refuses one within the repository cache); tests that wait
        # for a drop move the droppers' clock past it (Suite.age_cleanup_queue).
        staging_drop_grace_seconds=3.0,
        staging_drop_interval_seconds=0.05,
    ) as suite:
        yield suite


@pytest.fixture(scope="module")
def stubs(suite):
    s = Stubs(suite)
    yield s
    s.close()
