"""Request bytes that are not the method's message (garbage, a string field holding invalid
UTF-8) are the caller's mistake: INVALID_ARGUMENT / UNDECODABLE_REQUEST, never INTERNAL and
never an internal-error incident in the server's log (issue 23, item 8). Raw bytes sent over
real gRPC to the real suite, unary, server-streaming and client-streaming methods alike."""

from __future__ import annotations

import logging

import grpc
import pytest

from quarry.runtime.errors import from_rpc_error
from support.auth import admin_token_source, bearer, raw_channel, service_token
from support.suite import suite_fixture

# A length-delimited field 1 (`repository`) holding the bytes FF FE: not UTF-8.
NOT_UTF8 = b"\x0a\x02\xff\xfe"
# A field 1 that says it is 100 bytes long and ends after 2: not a message at all.
GARBAGE = b"\x0a\x64\x00\x01"


suite = suite_fixture()


def refusal(call, payload, token):
    with pytest.raises(grpc.RpcError) as caught:
        call(payload, metadata=bearer(token), timeout=10)
    return from_rpc_error(caught.value)


@pytest.mark.parametrize(
    ("service", "method", "kind", "payload"),
    [
        ("branch-manager", "/quarry.v1.BranchManager/GetBranch", "unary_unary", NOT_UTF8),
        ("branch-manager", "/quarry.v1.BranchManager/GetBranch", "unary_unary", GARBAGE),
        ("branch-manager", "/quarry.v1.BranchManager/PutObjects", "stream_unary", NOT_UTF8),
        ("branch-manager", "/quarry.v1.BranchManager/PutObjects", "stream_unary", GARBAGE),
        # ScanItems' field 1 is bytes (any bytes are valid): garbage only.
        ("kv-gateway", "/quarry.v1.KVGateway/ScanItems", "unary_stream", GARBAGE),
    ],
)
def test_undecodable_request_bytes_are_invalid_argument(
    suite, caplog, payload, service, method, kind
):
    token = service_token() if service == "kv-gateway" else admin_token_source()()
    with raw_channel(suite.targets[service]) as channel, caplog.at_level(logging.ERROR):
        stub = getattr(channel, kind)(method)  # no serializers: the bytes go as they are
        if kind == "stream_unary":
            error = refusal(stub, iter([payload]), token)
        elif kind == "unary_stream":
            error = refusal(lambda p, **kw: list(stub(p, **kw)), payload, token)
        else:
            error = refusal(stub, payload, token)
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "UNDECODABLE_REQUEST")
    assert not [r for r in caplog.records if "internal error" in r.getMessage()]
