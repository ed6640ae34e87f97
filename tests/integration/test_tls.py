"""TLS over real servers on loopback (quarry.runtime.tls through create_server and
open_channel): a TLS server and a verifying client, a wrong CA, a plaintext client, mTLS with
and without a client certificate, the server-name override, the loopback rule, refused
misconfigurations, and the whole suite in-process under mTLS (every service's own calls to
the others present the shared certificate)."""

from __future__ import annotations

import socket
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quarry.kv.memory import MemoryStore
from quarry.runtime.channels import open_channel, with_token
from quarry.runtime.errors import from_rpc_error
from quarry.runtime.server import create_server
from quarry.runtime.tls import (
    PLAINTEXT,
    ConnectionClosedAtSetup,
    InsecureListenRefused,
    TlsHandshakeFailed,
    TlsMisconfigured,
    channel_security,
)
from quarry.v1 import kv_pb2, kv_pb2_grpc
from support.auth import (
    TEST_ACCESS_KEY_ID,
    TEST_SECRET_ACCESS_KEY,
    service_token_source,
    setup_test_admin,
)
from support.processes import free_port
from support.servers import kv_gateway, settings_for_tests
from support.suite import running_suite
from support.tls import make_pki
from support.wait import wait_until


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def server_tls_settings(pki, *, client_auth: bool = False) -> dict:
    overrides = {
        "tls_cert_file": str(pki.server.cert_file),
        "tls_key_file": str(pki.server.key_file),
        "tls_ca_file": str(pki.ca.ca_file),
    }
    if client_auth:
        overrides["tls_client_auth"] = True
    return overrides


def client_security(ca_file, cert=None, **extra):
    overrides = {"tls_ca_file": str(ca_file), **extra}
    if cert is not None:
        overrides.update(tls_cert_file=str(cert.cert_file), tls_key_file=str(cert.key_file))
    return channel_security(settings_for_tests(**overrides))


def health_check(channel: grpc.Channel) -> int:
    return (
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status
    )


def get_missing_item(channel: grpc.Channel) -> grpc.StatusCode:
    """A KV read with a service token: NOT_FOUND proves the call crossed TLS and auth."""
    stub = kv_pb2_grpc.KVGatewayStub(with_token(channel, service_token_source()))
    with pytest.raises(grpc.RpcError) as caught:
        stub.GetItem(kv_pb2.GetItemRequest(partition_key=b"cleanup", key=b"nope"), timeout=5)
    return caught.value.code()


def refusal(channel: grpc.Channel):
    """The domain error a health check on `channel` fails with."""
    with pytest.raises(grpc.RpcError) as caught:
        health_check(channel)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    return from_rpc_error(caught.value)


def test_tls_server_and_verifying_client_round_trip(pki):
    with kv_gateway(**server_tls_settings(pki)) as (_server, target):
        for address in (target, target.replace("127.0.0.1", "localhost")):
            with open_channel(address, security=client_security(pki.ca.ca_file)) as channel:
                assert health_check(channel) == health_pb2.HealthCheckResponse.SERVING
                assert get_missing_item(channel) == grpc.StatusCode.NOT_FOUND


def test_a_client_trusting_another_ca_is_refused_naming_tls(pki):
    with (
        kv_gateway(**server_tls_settings(pki)) as (_server, target),
        open_channel(target, security=client_security(pki.other_ca.ca_file)) as channel,
    ):
        error = refusal(channel)
    assert isinstance(error, TlsHandshakeFailed)
    assert error.reason == "TLS_HANDSHAKE_FAILED" and "TLS" in error.message
    assert "QUARRY_TLS_CA_FILE" in error.message


def test_a_plaintext_client_is_refused_naming_tls(pki):
    with (
        kv_gateway(**server_tls_settings(pki)) as (_server, target),
        open_channel(target, security=PLAINTEXT) as channel,
    ):
        error = refusal(channel)
    assert isinstance(error, ConnectionClosedAtSetup)
    assert "TLS" in error.message and "QUARRY_TLS_CA_FILE" in error.message


def test_a_tls_client_to_a_plaintext_server_is_refused_naming_tls(pki):
    with (
        kv_gateway() as (_server, target),
        open_channel(target, security=client_security(pki.ca.ca_file)) as channel,
    ):
        error = refusal(channel)
    assert isinstance(error, TlsHandshakeFailed)


def test_mtls_requires_a_client_certificate_from_the_ca(pki):
    with kv_gateway(**server_tls_settings(pki, client_auth=True)) as (_server, target):
        with open_channel(target, security=client_security(pki.ca.ca_file)) as channel:
            error = refusal(channel)
        assert isinstance(error, ConnectionClosedAtSetup)
        assert "client certificates" in error.message and "QUARRY_TLS_CERT_FILE" in error.message
        # A certificate another CA signed is no better than none.
        stranger = client_security(pki.ca.ca_file, pki.stranger)
        with open_channel(target, security=stranger) as channel:
            assert isinstance(refusal(channel), ConnectionClosedAtSetup)
        with open_channel(target, security=client_security(pki.ca.ca_file, pki.client)) as channel:
            assert health_check(channel) == health_pb2.HealthCheckResponse.SERVING
            assert get_missing_item(channel) == grpc.StatusCode.NOT_FOUND


def test_the_server_name_setting_verifies_a_certificate_for_another_name(pki):
    internal = pki.ca.issue("internal-only", sans=("quarry.internal",))
    overrides = {
        "tls_cert_file": str(internal.cert_file),
        "tls_key_file": str(internal.key_file),
    }
    with kv_gateway(**overrides) as (_server, target):
        with open_channel(target, security=client_security(pki.ca.ca_file)) as channel:
            assert isinstance(refusal(channel), TlsHandshakeFailed)  # 127.0.0.1 is not named
        named = client_security(pki.ca.ca_file, tls_server_name="quarry.internal")
        with open_channel(target, security=named) as channel:
            assert health_check(channel) == health_pb2.HealthCheckResponse.SERVING


def test_the_client_fails_at_once_on_a_tls_handshake_failure(pki):
    """A Client's retries (a 30 s budget) are not spent on a failure that cannot heal."""
    from quarry.client import Client

    with (
        running_suite_tls(pki, client_auth=False) as suite,
        Client(
            suite.targets["branch-manager"],
            suite.targets["committer"],
            security=client_security(pki.other_ca.ca_file),
        ) as client,
    ):
        started = time.monotonic()
        with pytest.raises(TlsHandshakeFailed):
            client.list_repositories()
        assert time.monotonic() - started < 5


def reports_sent() -> float:
    """Staging report lines branch-manager delivered to the sensor, in this process."""
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("quarry_staging_reports_sent_total") or 0.0


def running_suite_tls(pki, *, client_auth: bool):
    import tempfile
    from pathlib import Path

    home = Path(tempfile.mkdtemp(prefix="quarry-tls-suite-"))
    return running_suite(
        home, compactor_sensor=True, **server_tls_settings(pki, client_auth=client_auth)
    )


@pytest.mark.parametrize("client_auth", [False, True], ids=["tls", "mtls"])
def test_the_whole_suite_in_process_over_tls(pki, client_auth):
    """Every service's channels to the others verify TLS (and under mTLS present the shared
    certificate: the kv-gateway and range-writer would refuse them otherwise); a Client
    with the CA (and under mTLS its own certificate) does a full round trip."""
    import pickle

    from quarry.client import Client
    from quarry.client.credentials import Credentials
    from quarry.spark.common import Connection, client_for

    cert = pki.client if client_auth else None
    sent_before = reports_sent()
    with (
        running_suite_tls(pki, client_auth=client_auth) as suite,
        Client(
            suite.targets["branch-manager"],
            suite.targets["committer"],
            compactor_sensor=suite.targets["compactor-sensor"],
            security=client_security(pki.ca.ca_file, cert),
        ) as client,
    ):
        client.create_repository("tls-repo", suite.namespace("tls-repo"))
        client.put_object(
            "tls-repo",
            "main",
            path="a.parquet",
            physical_address="s3://b/a",
            size_bytes=1,
            checksum="c1",
        )
        # branch-manager's staging reports reach the compactor-sensor over (m)TLS too (the
        # sensor would also find the write by scanning the KV store: count deliveries).
        wait_until(
            lambda: reports_sent() > sent_before,
            timeout=10,
            what="a staging report to reach the sensor",
        )
        # The sensor serves only once its own (m)TLS channels reach the kv-gateway and the
        # committer.
        assert client.branch_staging_stats("tls-repo", "main").puts >= 1
        commit = client.commit("tls-repo", "main", "over TLS").commit
        assert [c.id for c in client.log("tls-repo", "main").commits][0] == commit.id
        # A Spark executor's client: the driver's credentials and TLS material, pickled.
        executor = client_for(
            pickle.loads(
                pickle.dumps(
                    Connection(
                        suite.targets["branch-manager"],
                        suite.targets["committer"],
                        credentials=Credentials(TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY),
                        security=client_security(pki.ca.ca_file, cert),
                    )
                )
            )
        )
        assert [r.name for r in executor.list_repositories().repositories] == ["tls-repo"]
        if client_auth:
            # The same call without a client certificate never reaches the server.
            with (
                Client(
                    suite.targets["branch-manager"],
                    suite.targets["committer"],
                    security=client_security(pki.ca.ca_file),
                ) as anonymous,
                pytest.raises(ConnectionClosedAtSetup),
            ):
                anonymous.server_info()


def _kv_gateway_spec(settings, stopped: list):
    from quarry.services.kv_gateway.service import build

    backend = MemoryStore()
    setup_test_admin(backend)
    spec = build(settings, backend=backend)
    spec.on_stop.append(lambda: stopped.append(True))
    return spec


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


def test_plaintext_beyond_loopback_refuses_to_start_unless_allowed(pki):
    port = free_port()
    settings = settings_for_tests()
    stopped: list = []
    with pytest.raises(InsecureListenRefused) as caught:
        create_server(settings, _kv_gateway_spec(settings, stopped), port=port, host="0.0.0.0")
    assert "QUARRY_ALLOW_INSECURE_LISTEN" in caught.value.message
    assert stopped == [True]  # what the spec held is released
    assert _bindable(port)  # nothing listens

    allowed = settings_for_tests(allow_insecure_listen=True)
    server, bound = create_server(allowed, _kv_gateway_spec(allowed, []), port=port, host="0.0.0.0")
    try:
        with open_channel(f"127.0.0.1:{bound}", security=PLAINTEXT) as channel:
            assert health_check(channel) == health_pb2.HealthCheckResponse.SERVING
    finally:
        server.stop(grace=0)


def test_tls_beyond_loopback_needs_no_permission(pki):
    settings = settings_for_tests(**server_tls_settings(pki))
    server, bound = create_server(
        settings, _kv_gateway_spec(settings, []), port=free_port(), host="0.0.0.0"
    )
    try:
        with open_channel(
            f"127.0.0.1:{bound}", security=client_security(pki.ca.ca_file)
        ) as channel:
            assert health_check(channel) == health_pb2.HealthCheckResponse.SERVING
    finally:
        server.stop(grace=0)


def test_a_misconfigured_server_refuses_to_start_and_binds_nothing(pki):
    port = free_port()
    for overrides, setting in (
        ({"tls_cert_file": str(pki.server.cert_file)}, "QUARRY_TLS_KEY_FILE"),
        ({**server_tls_settings(pki), "tls_key_file": str(pki.client.key_file)}, "KEY_FILE"),
        ({**server_tls_settings(pki), "tls_ca_file": ""} | {"tls_client_auth": True}, "CA_FILE"),
    ):
        settings = settings_for_tests(**overrides)
        stopped: list = []
        with pytest.raises(TlsMisconfigured) as caught:
            create_server(
                settings, _kv_gateway_spec(settings, stopped), port=port, host="127.0.0.1"
            )
        assert setting in caught.value.message
        assert stopped == [True]
        assert _bindable(port)


def test_a_dependency_failing_the_handshake_is_reported_as_a_tls_failure(pki):
    """What an operator reads in a service's log and DEPENDENCY_UNAVAILABLE refusals when
    its CA does not match its dependency's certificate."""
    from quarry.runtime.server import DependencyUnavailable, service_dependency

    with kv_gateway(**server_tls_settings(pki)) as (_server, target):
        wrong = service_dependency(
            "kv-gateway", target, security=client_security(pki.other_ca.ca_file)
        )
        try:
            with pytest.raises(DependencyUnavailable) as caught:
                wrong.probe(2.0)
        finally:
            wrong.close()
        assert "TLS handshake failed" in caught.value.message
        right = service_dependency("kv-gateway", target, security=client_security(pki.ca.ca_file))
        try:
            right.probe(2.0)
        finally:
            right.close()
