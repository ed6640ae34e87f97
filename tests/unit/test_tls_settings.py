"""TLS settings (quarry.runtime.tls): what serves and dials TLS, every misconfiguration refused
with TLS_MISCONFIGURED naming the setting, the loopback rule, and gRPC's connection failures
turned into errors that name TLS."""

from __future__ import annotations

import threading

import pytest

from quarry import errors
from quarry.config import load_settings
from quarry.runtime.errors import from_rpc_error, is_retryable
from quarry.runtime.tls import (
    PLAINTEXT,
    ConnectionClosedAtSetup,
    InsecureListenRefused,
    TlsHandshakeFailed,
    TlsMisconfigured,
    channel_security,
    check_listen,
    connection_error,
    is_loopback,
    server_tls,
)
from support.tls import make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def settings(**env: str):
    """Settings from QUARRY_* environment variables only (as a process reads them)."""
    return load_settings(env={f"QUARRY_{k.upper()}": v for k, v in env.items()})


def test_the_settings_are_read_from_the_environment(pki):
    s = settings(
        tls_cert_file=str(pki.server.cert_file),
        tls_key_file=str(pki.server.key_file),
        tls_ca_file=str(pki.ca.ca_file),
        tls_client_auth="true",
        tls_server_name="quarry.internal",
        allow_insecure_listen="yes",
    )
    assert (s.tls_cert_file, s.tls_key_file, s.tls_ca_file) == (
        str(pki.server.cert_file),
        str(pki.server.key_file),
        str(pki.ca.ca_file),
    )
    assert s.tls_client_auth and s.allow_insecure_listen
    assert s.tls_server_name == "quarry.internal"
    defaults = settings()
    assert not defaults.tls_client_auth and not defaults.allow_insecure_listen


def test_nothing_configured_is_plaintext_both_ways():
    assert server_tls(settings()) is None
    assert channel_security(settings()) == PLAINTEXT
    assert not PLAINTEXT.tls


def test_a_certificate_and_key_serve_tls_without_client_auth(pki):
    tls = server_tls(
        settings(tls_cert_file=str(pki.server.cert_file), tls_key_file=str(pki.server.key_file))
    )
    assert tls is not None
    assert tls.certificate_chain == pki.server.cert and tls.private_key == pki.server.key
    assert not tls.requires_client_auth
    assert tls.credentials() is not None


def test_client_auth_requires_certificates_from_the_ca(pki):
    tls = server_tls(settings(**_service_env(pki), tls_client_auth="true"))
    assert tls is not None and tls.requires_client_auth
    assert tls.client_ca == pki.ca.ca


def test_a_ca_makes_clients_verify_tls_and_a_certificate_is_presented(pki):
    only_ca = channel_security(settings(tls_ca_file=str(pki.ca.ca_file)))
    assert only_ca.tls and only_ca.root_certificates == pki.ca.ca
    assert only_ca.certificate_chain is None and only_ca.private_key is None
    mutual = channel_security(settings(**_service_env(pki)))
    assert mutual.tls and mutual.certificate_chain == pki.server.cert
    assert mutual.private_key == pki.server.key


def test_a_certificate_without_a_ca_verifies_against_public_roots(pki):
    # A process holding a certificate is in a TLS deployment: never plaintext.
    security = channel_security(
        settings(tls_cert_file=str(pki.server.cert_file), tls_key_file=str(pki.server.key_file))
    )
    assert security.tls and security.root_certificates is None


def test_the_server_name_override_becomes_a_channel_option(pki):
    security = channel_security(
        settings(tls_ca_file=str(pki.ca.ca_file), tls_server_name=" quarry.internal ")
    )
    assert security.options() == [("grpc.ssl_target_name_override", "quarry.internal")]
    assert channel_security(settings(tls_ca_file=str(pki.ca.ca_file))).options() == []


def test_the_private_key_is_never_in_a_repr(pki):
    secret = pki.server.key.decode()
    body = secret.splitlines()[1]
    assert body not in repr(channel_security(settings(**_service_env(pki))))
    assert body not in repr(server_tls(settings(**_service_env(pki))))


def _service_env(pki) -> dict[str, str]:
    return {
        "tls_cert_file": str(pki.server.cert_file),
        "tls_key_file": str(pki.server.key_file),
        "tls_ca_file": str(pki.ca.ca_file),
    }


def _refused(make, s, setting: str) -> TlsMisconfigured:
    with pytest.raises(TlsMisconfigured) as caught:
        make(s)
    error = caught.value
    assert isinstance(error, errors.FailedPrecondition)
    assert error.reason == "TLS_MISCONFIGURED"
    assert setting in error.message
    return error


@pytest.mark.parametrize("make", [server_tls, channel_security])
def test_half_a_pair_is_refused(pki, make):
    _refused(make, settings(tls_cert_file=str(pki.server.cert_file)), "QUARRY_TLS_KEY_FILE")
    _refused(make, settings(tls_key_file=str(pki.server.key_file)), "QUARRY_TLS_CERT_FILE")


@pytest.mark.parametrize("make", [server_tls, channel_security])
def test_missing_or_empty_files_are_refused(pki, tmp_path, make):
    missing = str(tmp_path / "nope.pem")
    error = _refused(
        make,
        settings(tls_cert_file=missing, tls_key_file=str(pki.server.key_file)),
        "QUARRY_TLS_CERT_FILE",
    )
    assert missing in error.message
    empty = tmp_path / "empty.pem"
    empty.write_text("\n")
    _refused(
        make,
        settings(tls_cert_file=str(pki.server.cert_file), tls_key_file=str(empty)),
        "QUARRY_TLS_KEY_FILE",
    )
    _refused(make, settings(tls_ca_file=missing), "QUARRY_TLS_CA_FILE")


def test_a_certificate_file_rewritten_in_place_is_read_once_it_is_whole(pki, tmp_path):
    """A mounted Secret's file that an orchestrator rewrites in place reads empty for a
    moment (podman's kube play does, for every pod it starts): the service reads it again
    instead of refusing to start. A file that stays empty is still refused (above)."""
    cert = tmp_path / "tls.crt"
    cert.write_bytes(b"")
    threading.Timer(0.3, lambda: cert.write_bytes(pki.server.cert_file.read_bytes())).start()
    tls = server_tls(settings(tls_cert_file=str(cert), tls_key_file=str(pki.server.key_file)))
    assert tls is not None and tls.certificate_chain == pki.server.cert_file.read_bytes()


def test_a_directory_is_not_a_readable_file(pki, tmp_path):
    _refused(
        server_tls,
        settings(tls_cert_file=str(tmp_path), tls_key_file=str(pki.server.key_file)),
        "QUARRY_TLS_CERT_FILE",
    )


@pytest.mark.parametrize("make", [server_tls, channel_security])
def test_invalid_pem_is_refused(pki, tmp_path, make):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text(
        "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n"
    )
    _refused(
        make,
        settings(tls_cert_file=str(garbage), tls_key_file=str(pki.server.key_file)),
        "QUARRY_TLS_CERT_FILE",
    )
    _refused(
        make,
        settings(tls_cert_file=str(pki.server.cert_file), tls_key_file=str(garbage)),
        "QUARRY_TLS_CERT_FILE",
    )
    # A certificate where the key belongs.
    _refused(
        make,
        settings(tls_cert_file=str(pki.server.cert_file), tls_key_file=str(pki.server.cert_file)),
        "QUARRY_TLS_KEY_FILE",
    )


def test_a_ca_file_that_holds_no_certificate_is_refused(pki, tmp_path):
    garbage = tmp_path / "ca.pem"
    garbage.write_text("hello\n")
    _refused(channel_security, settings(tls_ca_file=str(garbage)), "QUARRY_TLS_CA_FILE")
    # A private key is not a CA bundle either.
    _refused(channel_security, settings(tls_ca_file=str(pki.server.key_file)), "QUARRY_TLS_CA_FILE")


def test_a_key_that_does_not_match_its_certificate_is_refused(pki):
    error = _refused(
        server_tls,
        settings(tls_cert_file=str(pki.server.cert_file), tls_key_file=str(pki.client.key_file)),
        "QUARRY_TLS_KEY_FILE",
    )
    assert "matching" in error.message


def test_an_encrypted_key_is_refused(pki, tmp_path):
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pki.server.key, password=None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    error = _refused(
        server_tls,
        settings(tls_cert_file=str(pki.server.cert_file), tls_key_file=str(encrypted)),
        "QUARRY_TLS_KEY_FILE",
    )
    assert "encrypted" in error.message


def test_client_auth_without_a_ca_or_without_tls_is_refused(pki):
    _refused(
        server_tls,
        settings(
            tls_cert_file=str(pki.server.cert_file),
            tls_key_file=str(pki.server.key_file),
            tls_client_auth="true",
        ),
        "QUARRY_TLS_CA_FILE",
    )
    _refused(
        server_tls,
        settings(tls_ca_file=str(pki.ca.ca_file), tls_client_auth="true"),
        "QUARRY_TLS_CLIENT_AUTH",
    )


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("[::]", False),
        ("", False),
        ("10.0.0.5", False),
        ("192.168.1.1", False),
        ("quarry.example.com", False),
        ("localhost.evil.example", False),
        ("128.0.0.1", False),
    ],
)
def test_loopback_addresses(host, loopback):
    assert is_loopback(host) is loopback


def test_plaintext_beyond_loopback_is_refused_unless_allowed(pki):
    plain = settings()
    with pytest.raises(InsecureListenRefused) as caught:
        check_listen(plain, "kv-gateway", "0.0.0.0", None)
    assert caught.value.code.name == "FAILED_PRECONDITION"
    assert "QUARRY_ALLOW_INSECURE_LISTEN" in caught.value.message
    assert "kv-gateway" in caught.value.message
    with pytest.raises(InsecureListenRefused):
        check_listen(plain, "kv-gateway", "10.1.2.3", None)
    check_listen(plain, "kv-gateway", "127.0.0.1", None)  # `quarry up`'s default
    check_listen(plain, "kv-gateway", "::1", None)
    check_listen(settings(allow_insecure_listen="true"), "kv-gateway", "0.0.0.0", None)
    check_listen(plain, "kv-gateway", "0.0.0.0", server_tls(settings(**_service_env(pki))))


# gRPC's (1.85, BoringSSL) details of connections that failed to set up, as seen over loopback.
WRONG_CA = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:41115: Tls "
    "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL "
    "routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: unable to get local issuer "
    "certificate: OK"
)
WRONG_NAME = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:41115: Custom "
    "verification check failed with error: UNAUTHENTICATED: Hostname Verification Check failed."
)
CLOSED = "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:41115: Socket closed"
REFUSED = (
    "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1: "
    "Connection refused"
)


def test_connection_failures_name_tls():
    for message in (WRONG_CA, WRONG_NAME):
        error = connection_error(message)
        assert isinstance(error, TlsHandshakeFailed)
        assert error.code.name == "UNAVAILABLE" and error.reason == "TLS_HANDSHAKE_FAILED"
        assert "TLS" in error.message and "QUARRY_TLS_CA_FILE" in error.message
        assert not is_retryable(error)  # the same certificates fail the same way
    closed = connection_error(CLOSED)
    assert isinstance(closed, ConnectionClosedAtSetup)
    assert "TLS" in closed.message and "QUARRY_TLS_CERT_FILE" in closed.message
    assert is_retryable(closed)  # ambiguous: also a server closing at that instant
    assert connection_error(REFUSED) is None
    assert connection_error("Socket closed") is None  # not a connection set-up failure


class _FakeRpcError(Exception):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


def test_from_rpc_error_maps_only_grpcs_own_unavailable():
    import grpc

    assert isinstance(
        from_rpc_error(_FakeRpcError(grpc.StatusCode.UNAVAILABLE, WRONG_CA)), TlsHandshakeFailed
    )
    refused = from_rpc_error(_FakeRpcError(grpc.StatusCode.UNAVAILABLE, REFUSED))
    assert refused.reason == "UNAVAILABLE" and is_retryable(refused)
    other = from_rpc_error(_FakeRpcError(grpc.StatusCode.INTERNAL, WRONG_CA))
    assert not isinstance(other, TlsHandshakeFailed)


def test_a_spark_connection_carries_the_drivers_tls_to_executors(pki, monkeypatch):
    import pickle

    from quarry.spark.common import Connection

    monkeypatch.delenv("QUARRY_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("QUARRY_SECRET_ACCESS_KEY", raising=False)
    s = settings(**_service_env(pki))
    connection = Connection.from_settings(s)
    assert connection.security == channel_security(s) and connection.security.tls
    assert pki.server.key.decode().splitlines()[1] not in repr(connection)
    again = pickle.loads(pickle.dumps(connection))
    assert again == connection and hash(again) == hash(connection)
    # A plaintext driver sends none: each executor reads its own settings.
    assert Connection.from_settings(settings()).security is None


def test_user_clients_follow_the_environment_and_the_config_file(pki, monkeypatch, tmp_path):
    from quarry.runtime.tls import environment_channel_security

    for name in ("QUARRY_TLS_CERT_FILE", "QUARRY_TLS_KEY_FILE", "QUARRY_TLS_CA_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("QUARRY_CONFIG_FILE", raising=False)
    assert environment_channel_security() == PLAINTEXT
    monkeypatch.setenv("QUARRY_TLS_CA_FILE", str(pki.ca.ca_file))
    assert environment_channel_security().root_certificates == pki.ca.ca
    monkeypatch.delenv("QUARRY_TLS_CA_FILE")
    config = tmp_path / "quarry.toml"
    config.write_text(f'tls_ca_file = "{pki.ca.ca_file}"\n')
    monkeypatch.setenv("QUARRY_CONFIG_FILE", str(config))
    security = environment_channel_security()
    assert security.tls and security.root_certificates == pki.ca.ca


def test_an_expired_certificate_is_named_in_the_log_at_start(pki, caplog):
    """Every client refuses the handshake of a service whose certificate expired (a
    rotation that installed an old one): the service's own log says so at start, once."""
    import logging

    expired = pki.ca.issue("expired-service", days=-1)
    with caplog.at_level(logging.WARNING, logger="quarry.runtime.tls"):
        for _ in range(2):
            server_tls(
                settings(tls_cert_file=str(expired.cert_file), tls_key_file=str(expired.key_file))
            )
        server_tls(
            settings(tls_cert_file=str(pki.server.cert_file), tls_key_file=str(pki.server.key_file))
        )
    warned = [r.getMessage() for r in caplog.records if "expired on" in r.getMessage()]
    assert len(warned) == 1 and str(expired.cert_file) in warned[0], warned
