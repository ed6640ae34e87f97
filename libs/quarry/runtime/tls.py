"""Transport security: the TLS material of servers and client channels, read and checked from
the settings (docs/tls.md).

- A server serves TLS when QUARRY_TLS_CERT_FILE and QUARRY_TLS_KEY_FILE are set (`server_tls`);
  with QUARRY_TLS_CLIENT_AUTH it also requires a client certificate signed by a CA of
  QUARRY_TLS_CA_FILE (mTLS).
- A client channel (`channel_security`) uses TLS when QUARRY_TLS_CA_FILE is set (and verifies
  the server against that bundle) or when QUARRY_TLS_CERT_FILE is set without it (a process
  holding a certificate is part of a TLS deployment; it verifies servers against gRPC's
  built-in public roots). It presents the certificate and key, when set, as its client
  certificate. Otherwise it is plaintext. Server names are checked against the address, or
  against QUARRY_TLS_SERVER_NAME when set.
- Safety rule (`check_listen`): a server never listens in plaintext on a non-loopback address
  unless QUARRY_ALLOW_INSECURE_LISTEN says so; `quarry up` binds 127.0.0.1 and stays plaintext.

Every file is read and checked once, when the server or channel is set up: a missing or
unreadable file, a PEM that is not a certificate (or key), a key that does not match its
certificate, or half a pair refuses with TlsMisconfigured (FAILED_PRECONDITION) naming the
setting — never a stack trace and never a silent fallback to plaintext. The private key is
kept out of every repr.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from quarry import errors

log = logging.getLogger(__name__)

CERT_FILE_ENV = "QUARRY_TLS_CERT_FILE"
KEY_FILE_ENV = "QUARRY_TLS_KEY_FILE"
CA_FILE_ENV = "QUARRY_TLS_CA_FILE"
CLIENT_AUTH_ENV = "QUARRY_TLS_CLIENT_AUTH"
SERVER_NAME_ENV = "QUARRY_TLS_SERVER_NAME"
ALLOW_INSECURE_LISTEN_ENV = "QUARRY_ALLOW_INSECURE_LISTEN"


class TlsMisconfigured(errors.FailedPrecondition):
    """The TLS settings cannot be used as given (a file missing or unreadable, not PEM, a key
    that does not match its certificate, half a pair, client auth without a CA)."""

    reason = "TLS_MISCONFIGURED"


class InsecureListenRefused(errors.FailedPrecondition):
    """A server was asked to listen in plaintext beyond loopback."""

    reason = "INSECURE_LISTEN_REFUSED"


class TlsHandshakeFailed(errors.Unavailable):
    """A client's TLS handshake failed (the server's certificate is not signed by a trusted CA,
    does not name the address, or the server does not speak TLS). The same on every retry, so
    never retried (quarry.runtime.errors.is_retryable)."""

    reason = "TLS_HANDSHAKE_FAILED"
    permanent = True


class ConnectionClosedAtSetup(errors.Unavailable):
    """The server closed the connection while it was being set up: what a plaintext client
    sees from a TLS server, and a client without an accepted certificate from an mTLS one
    (it is also what a server shutting down at that instant looks like: retried)."""

    reason = "CONNECTION_CLOSED_AT_SETUP"


@dataclass(frozen=True)
class ChannelSecurity:
    """How a client channel is secured: plaintext (`tls` False) or TLS verifying the server
    against `root_certificates` (None: gRPC's built-in public roots), presenting
    `certificate_chain` + `private_key` when given (mTLS). Picklable and hashable: Spark
    executors receive the driver's."""

    tls: bool = False
    root_certificates: bytes | None = None
    certificate_chain: bytes | None = None
    private_key: bytes | None = field(default=None, repr=False)
    server_name: str = ""

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )

    def options(self) -> list[tuple[str, Any]]:
        """Channel options TLS adds: the name to verify the server's certificate against."""
        if self.tls and self.server_name:
            return [("grpc.ssl_target_name_override", self.server_name)]
        return []


PLAINTEXT = ChannelSecurity()


@dataclass(frozen=True)
class ServerTls:
    """A server's TLS material: its certificate chain and key, and for mTLS the CA bundle
    client certificates must chain to."""

    certificate_chain: bytes
    private_key: bytes = field(repr=False)
    client_ca: bytes | None = None  # set: client certificates are required and verified

    @property
    def requires_client_auth(self) -> bool:
        return self.client_ca is not None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.private_key, self.certificate_chain)],
            root_certificates=self.client_ca,
            require_client_auth=self.client_ca is not None,
        )


# An empty file is read again, for up to this many seconds, before it is refused: a file
# replaced in place reads empty for a moment (podman's `kube play` rewrites a mounted Secret's
# files for each pod it starts, while the pods started before it read them; a branch-manager
# worker starting then found its certificate empty). Only the start of a misconfigured
# process waits this long.
EMPTY_FILE_SETTLE_SECONDS = 2.0
_EMPTY_FILE_PAUSE = 0.1


def _read(path: str, env: str) -> bytes:
    for _ in range(int(EMPTY_FILE_SETTLE_SECONDS / _EMPTY_FILE_PAUSE)):
        data = _read_once(path, env)
        if data.strip():
            return data
        time.sleep(_EMPTY_FILE_PAUSE)
    raise TlsMisconfigured(f"{env}={path} is empty", metadata={"setting": env, "path": path})


def _read_once(path: str, env: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise TlsMisconfigured(
            f"{env}={path} cannot be read: {exc.strerror or exc}",
            metadata={"setting": env, "path": path},
        ) from None


def _no_password() -> bytes:
    raise TlsMisconfigured(f"{KEY_FILE_ENV}: the private key is encrypted; give an unencrypted key")


def _certificate_pair(settings: Any) -> tuple[bytes, bytes] | None:
    """(certificate chain, key) PEM bytes, checked to parse and to match; None when unset."""
    cert_file, key_file = settings.tls_cert_file, settings.tls_key_file
    if not cert_file and not key_file:
        return None
    if not key_file:
        raise TlsMisconfigured(
            f"{CERT_FILE_ENV} is set but {KEY_FILE_ENV} is not: a certificate needs its key",
            metadata={"setting": KEY_FILE_ENV},
        )
    if not cert_file:
        raise TlsMisconfigured(
            f"{KEY_FILE_ENV} is set but {CERT_FILE_ENV} is not: a key needs its certificate",
            metadata={"setting": CERT_FILE_ENV},
        )
    chain, key = _read(cert_file, CERT_FILE_ENV), _read(key_file, KEY_FILE_ENV)
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
            cert_file, key_file, password=_no_password
        )
    except (ssl.SSLError, ValueError) as exc:
        raise TlsMisconfigured(
            f"{CERT_FILE_ENV}={cert_file} and {KEY_FILE_ENV}={key_file} are not a PEM "
            f"certificate and its matching unencrypted private key ({exc})",
            metadata={"setting": CERT_FILE_ENV, "path": cert_file},
        ) from None
    _warn_if_not_valid_now(cert_file, chain)
    return chain, key


_warned: set[tuple[str, str]] = set()


def _warn_if_not_valid_now(cert_file: str, chain: bytes) -> None:
    """A warning (once per file and validity) when the service's own certificate has
    expired or is not valid yet: every client will refuse the handshake, and the clients'
    errors are all an operator would otherwise see (a rotation that installed an old
    certificate)."""
    import datetime

    from cryptography import x509

    try:
        leaf = x509.load_pem_x509_certificate(chain)
    except ValueError:
        return  # it loaded for the server above: another PEM form; nothing to say
    now = datetime.datetime.now(datetime.UTC)
    after, before = leaf.not_valid_after_utc, leaf.not_valid_before_utc
    if before <= now <= after or (cert_file, str(after)) in _warned:
        return
    _warned.add((cert_file, str(after)))
    when = (
        f"expired on {after:%Y-%m-%d %H:%M} UTC"
        if now > after
        else (f"is not valid before {before:%Y-%m-%d %H:%M} UTC")
    )
    log.warning(
        "the certificate in %s=%s %s: clients will refuse every TLS handshake with this "
        "service until it is replaced",
        CERT_FILE_ENV,
        cert_file,
        when,
    )


def _ca_bundle(settings: Any) -> bytes | None:
    ca_file = settings.tls_ca_file
    if not ca_file:
        return None
    data = _read(ca_file, CA_FILE_ENV)
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(
            cadata=data.decode("ascii", errors="replace")
        )
    except (ssl.SSLError, ValueError) as exc:
        raise TlsMisconfigured(
            f"{CA_FILE_ENV}={ca_file} is not a PEM bundle of CA certificates ({exc})",
            metadata={"setting": CA_FILE_ENV, "path": ca_file},
        ) from None
    return data


def server_tls(settings: Any) -> ServerTls | None:
    """The server's TLS material, or None to serve plaintext (no certificate configured).
    Raises TlsMisconfigured for unusable settings, client auth without a CA among them, and
    for an unusable CA bundle even when only the process's own calls would use it: a service
    refuses at start rather than at its first call."""
    pair = _certificate_pair(settings)
    ca = _ca_bundle(settings)
    if pair is None:
        if settings.tls_client_auth:
            raise TlsMisconfigured(
                f"{CLIENT_AUTH_ENV} needs TLS: set {CERT_FILE_ENV} and {KEY_FILE_ENV}",
                metadata={"setting": CLIENT_AUTH_ENV},
            )
        return None
    client_ca = None
    if settings.tls_client_auth:
        client_ca = ca
        if client_ca is None:
            raise TlsMisconfigured(
                f"{CLIENT_AUTH_ENV} needs {CA_FILE_ENV}: the CA bundle client certificates "
                "are verified against",
                metadata={"setting": CA_FILE_ENV},
            )
    return ServerTls(pair[0], pair[1], client_ca)


def channel_security(settings: Any) -> ChannelSecurity:
    """How this process's client channels are secured (module docstring): TLS when a CA bundle
    or a certificate is configured, else plaintext."""
    roots = _ca_bundle(settings)
    pair = _certificate_pair(settings)
    if roots is None and pair is None:
        return PLAINTEXT
    chain, key = pair if pair is not None else (None, None)
    return ChannelSecurity(True, roots, chain, key, settings.tls_server_name.strip())


def environment_channel_security() -> ChannelSecurity:
    """channel_security of the settings this process's environment (and config file) give:
    what a user's client (CLI, Python client, Spark driver) dials with unless told."""
    from quarry.config import CONFIG_FILE_ENV, load_settings

    # Neither a config file nor a QUARRY_TLS_* variable: the defaults, plaintext, without
    # the millisecond of resolving every setting.
    if not os.environ.get(CONFIG_FILE_ENV) and not any(
        os.environ.get(name) for name in (CERT_FILE_ENV, KEY_FILE_ENV, CA_FILE_ENV)
    ):
        return PLAINTEXT
    return channel_security(load_settings())


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and `localhost`; False for wildcards (0.0.0.0, ::, "") and
    for any other name, which could resolve anywhere."""
    name = host.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_listen(settings: Any, service: str, host: str, tls: ServerTls | None) -> None:
    """Refuse (InsecureListenRefused) to listen in plaintext on a non-loopback `host` unless
    QUARRY_ALLOW_INSECURE_LISTEN is set. Safety rule: this must never let a server accept
    plaintext connections from other machines by default — tokens and data would cross the
    network readable by anyone on the path."""
    if tls is not None or is_loopback(host) or settings.allow_insecure_listen:
        return
    raise InsecureListenRefused(
        f"{service} refuses to listen on {host or '*'} without TLS: set {CERT_FILE_ENV} and "
        f"{KEY_FILE_ENV} (docs/tls.md), bind a loopback address, or set "
        f"{ALLOW_INSECURE_LISTEN_ENV}=true to allow plaintext beyond loopback",
        metadata={"host": host, "setting": ALLOW_INSECURE_LISTEN_ENV},
    )


# Substrings of gRPC's connection-failure details (grpcio 1.85, BoringSSL).
_HANDSHAKE_FAILURES = (
    "tls handshake failed",
    "ssl handshake failed",
    "hostname verification check failed",
    "certificate_verify_failed",
)
_CONNECT_FAILURE = "failed to connect to all addresses"
_CLOSED_AT_SETUP = "socket closed"


def names_tls_failure(message: str) -> bool:
    """Whether a connection failure's text says its TLS set-up failed (a certificate not
    trusted or expired, a name that does not match, no TLS on the other end)."""
    lowered = message.lower()
    return any(marker in lowered for marker in _HANDSHAKE_FAILURES)


def connection_error(message: str) -> errors.QuarryError | None:
    """The TLS-aware error for gRPC's own UNAVAILABLE `message` about a connection that
    failed to set up, or None when it is not one of those (used by from_rpc_error)."""
    lowered = message.lower()
    if _CONNECT_FAILURE not in lowered:
        return None
    if names_tls_failure(message):
        return TlsHandshakeFailed(
            f"TLS handshake failed: the server's certificate is not trusted or does not name "
            f"the address, or the server does not serve TLS (check {CA_FILE_ENV}, "
            f"{SERVER_NAME_ENV}, and the server's {CERT_FILE_ENV}) — {message}"
        )
    if _CLOSED_AT_SETUP in lowered:
        return ConnectionClosedAtSetup(
            f"the server closed the connection during set-up: if it serves TLS, set "
            f"{CA_FILE_ENV}; if it requires client certificates (mTLS), set {CERT_FILE_ENV} "
            f"and {KEY_FILE_ENV} to a certificate its CA signed — {message}"
        )
    return None


__all__ = [
    "ChannelSecurity",
    "ConnectionClosedAtSetup",
    "InsecureListenRefused",
    "PLAINTEXT",
    "ServerTls",
    "TlsHandshakeFailed",
    "TlsMisconfigured",
    "channel_security",
    "check_listen",
    "connection_error",
    "environment_channel_security",
    "is_loopback",
    "names_tls_failure",
    "server_tls",
]
