"""Unauthenticated Auth/Login is throttled per access key id and per client address: each
attempt costs a scrypt, so a guesser must not get them for free (issue 23, item 8). Over
real gRPC; the throttle's clock is frozen so no refill can make the counts flaky."""

from __future__ import annotations

import grpc
import pytest
from auth_harness import auth_server

from quarry.auth.throttle import LoginThrottle, client_address
from quarry.runtime.errors import from_rpc_error
from quarry.v1 import auth_pb2, auth_pb2_grpc
from support.auth import raw_channel

PER_KEY = 3
PER_ADDRESS = 5


def _attempt(stub, access_key_id: str, secret: str = "wrong-secret-0123456789"):
    try:
        stub.Login(
            auth_pb2.LoginRequest(access_key_id=access_key_id, secret_access_key=secret),
            timeout=30,
        )
    except grpc.RpcError as error:
        return from_rpc_error(error)
    return None


@pytest.fixture
def throttled(tmp_path):
    frozen = [1000.0]
    throttle = LoginThrottle(PER_KEY, PER_ADDRESS, clock=lambda: frozen[0])
    with auth_server(tmp_path, login_throttle=throttle) as srv, raw_channel(srv.target) as ch:
        yield srv, auth_pb2_grpc.AuthStub(ch), frozen


def test_guessing_one_key_is_throttled_with_a_retry_hint(throttled):
    srv, stub, frozen = throttled
    srv.iam.create_user("victim")
    record, secret = srv.iam.create_credentials("victim")
    refusals = [_attempt(stub, record.access_key_id) for _ in range(PER_KEY)]
    assert {e.reason for e in refusals} == {"INVALID_CREDENTIALS"}
    error = _attempt(stub, record.access_key_id)
    assert (error.code, error.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "LOGIN_THROTTLED")
    assert error.retry_delay is not None and 0 < error.retry_delay <= 60
    assert error.metadata["throttled_by"] == "access_key_id"
    # Even the right secret waits: the throttle runs before the scrypt.
    error = _attempt(stub, record.access_key_id, secret)
    assert error.reason == "LOGIN_THROTTLED"
    # A minute later the key may try again.
    frozen[0] += 60
    assert _attempt(stub, record.access_key_id, secret) is None


def test_spraying_many_keys_from_one_address_is_throttled(throttled):
    _, stub, _ = throttled
    refusals = [_attempt(stub, f"AKIASPRAY{i:011d}") for i in range(PER_ADDRESS)]
    assert {e.reason for e in refusals} == {"INVALID_CREDENTIALS"}
    error = _attempt(stub, "AKIASPRAYNEXT0000000")
    assert (error.code, error.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "LOGIN_THROTTLED")
    assert error.metadata["throttled_by"] == "client_address"
    assert error.retry_delay is not None and error.retry_delay > 0


def test_client_address_drops_the_port():
    assert client_address("ipv4:10.0.0.1:5123") == "ipv4:10.0.0.1"
    assert client_address("ipv6:[::1]:5123") == "ipv6:[::1]"
    assert client_address("unix:/tmp/socket") == "unix:/tmp/socket"
