"""The committed-storage contract (quarry.testing.committed) against every implementation
graveler may be given: the dict-backed fake of the unit tests (support.fake_committed), the
in-process CommittedManager, and the remote range-writer client (RemoteRangeWriter against a
real range-writer server on loopback; it has no read API, so its reads go through a
CommittedManager over the same namespace, as in the services)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from quarry.blob import LocalBlobStore, open_blob_store
from quarry.committed import CommittedManager
from quarry.committed.remote import RemoteRangeWriter
from quarry.runtime.server import create_server
from quarry.testing.committed import CommittedContract, Implementation
from quarry.v1 import range_writer_pb2, range_writer_pb2_grpc
from support.auth import service_channel
from support.fake_committed import FakeCommitted
from support.servers import settings_for_tests

TARGET_RANGE_ENTRIES = 8  # small ranges: every test spans several


@contextlib.contextmanager
def _range_writer(manager: CommittedManager) -> Iterator[str]:
    from quarry.services.range_writer.service import build

    settings = settings_for_tests()
    server, port = create_server(
        settings, build(settings, manager=manager), port=0, host="127.0.0.1"
    )
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=1.0)


def _local_manager() -> CommittedManager:
    return CommittedManager(
        lambda ns: LocalBlobStore(ns, durable=False),
        None,
        target_range_entries=TARGET_RANGE_ENTRIES,
    )


@pytest.fixture
def committed(request, tmp_path) -> Iterator[Implementation]:
    namespace = str(tmp_path / "ns")
    if request.param == "fake":
        fake = FakeCommitted()
        yield Implementation("fake", fake, fake, namespace)
    elif request.param == "manager":
        manager = _local_manager()
        yield Implementation("manager", manager, manager, namespace, page=manager.metarange_page)
        manager.close()
    else:
        # The server's manager opens namespaces as the service does (validating them).
        served = CommittedManager(
            lambda ns: LocalBlobStore(open_blob_store(ns).root, durable=False),
            None,
            target_range_entries=TARGET_RANGE_ENTRIES,
        )
        reader = _local_manager()
        with (
            _range_writer(served) as target,
            RemoteRangeWriter(target) as remote,
            service_channel(target) as channel,  # as the services call it
        ):
            # Single pages of GetMetaRange: RemoteRangeWriter.get_metarange follows them all.
            stub = range_writer_pb2_grpc.RangeWriterStub(channel)

            def page(ns: str, metarange_id: str, size: int, token: str):
                from quarry.convert import range_info_from_proto
                from quarry.runtime.errors import from_rpc_error

                try:
                    response = stub.GetMetaRange(
                        range_writer_pb2.GetMetaRangeRequest(
                            storage_namespace=ns,
                            metarange_id=metarange_id,
                            page_size=size,
                            page_token=token,
                        ),
                        timeout=30,
                    )
                except Exception as error:  # grpc.RpcError -> the domain error
                    raise from_rpc_error(error) from None
                return (
                    [range_info_from_proto(r) for r in response.ranges],
                    response.next_page_token,
                )

            yield Implementation("remote", remote, reader, namespace, page=page)
        reader.close()


class TestCommittedContract(CommittedContract):
    SUPPORTS = {
        "fake": frozenset(),
        "manager": frozenset({"ranges", "range_reuse", "pages"}),
        "remote": frozenset({"ranges", "range_reuse", "pages"}),
    }
