"""The CLI's reading of an unreachable service: not retried when the connection is refused
(nothing listens there and a person is waiting), and reported naming the service."""

from __future__ import annotations

from quarry import errors
from quarry.cli.base import CLI_RETRY, unreachable

REFUSED = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:7402: "
    "Failed to connect to remote host: Connection refused"
)


def test_a_refused_connection_is_not_retried_other_unavailable_is():
    assert not CLI_RETRY.is_retryable(errors.Unavailable(REFUSED))
    assert CLI_RETRY.is_retryable(errors.Unavailable("the kv-gateway is draining"))


def test_an_unreachable_service_is_named_with_its_address():
    services = {"branch-manager": "127.0.0.1:7402", "committer": "127.0.0.1:7403"}
    error = unreachable(errors.Unavailable(REFUSED), services)
    assert error is not None and error.reason == "SERVICE_UNREACHABLE"
    assert error.message.startswith(
        "cannot reach the branch-manager at 127.0.0.1:7402 (connection refused)"
    )
    assert "`quarry up`" in error.message and "--branch-manager" in error.message
    assert unreachable(errors.Unavailable("draining"), services) is None
    assert unreachable(errors.NotFound(REFUSED), services) is None


def test_a_dependency_a_service_could_not_reach_is_not_blamed_on_the_users_connection():
    """The committer reached, its range-writer down: the refusal names the range-writer's
    address, which the CLI never dialled — not "Is Quarry running? give --committer"."""
    services = {"branch-manager": "127.0.0.1:7402", "committer": "127.0.0.1:7403"}
    between = REFUSED.replace("7402", "7405")
    error = unreachable(errors.Unavailable(between), services)
    assert error is not None and error.reason == "DEPENDENCY_UNREACHABLE"
    assert "ipv4:127.0.0.1:7405" in error.message and "its log says why" in error.message
    assert "Is Quarry running" not in error.message and "--" not in error.message


def test_a_dependency_whose_tls_handshake_failed_keeps_its_tls_reason():
    """A range-writer restarted with an expired certificate: the committer's refusal says
    so, and the CLI passed on "it is down or restarting" instead (docs/tls.md promises the
    TLS message)."""
    services = {"branch-manager": "127.0.0.1:7402", "committer": "127.0.0.1:7403"}
    refusal = errors.Unavailable(
        "committer is waiting for its dependencies: TLS handshake failed: ... — failed to "
        "connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:7405: Ssl handshake "
        "failed: SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
        "CERTIFICATE_VERIFY_FAILED: certificate has expired"
    )
    assert unreachable(refusal, services) is None  # shown as the service said it
