"""A throwaway PKI for TLS tests: a CA, server/client certificates it signs (SAN 127.0.0.1 and
localhost), and a second, unrelated CA for "wrong CA" cases — written as PEM files, the way an
operator hands them to Quarry (QUARRY_TLS_CERT_FILE, QUARRY_TLS_KEY_FILE, QUARRY_TLS_CA_FILE)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SANS = ("localhost", "127.0.0.1")


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _validity(builder: x509.CertificateBuilder, days: float = 2) -> x509.CertificateBuilder:
    """Valid from an hour ago for `days` (negative: expired that long ago)."""
    now = dt.datetime.now(dt.UTC)
    start = now - dt.timedelta(hours=1) if days > 0 else now + dt.timedelta(days=days - 1)
    return builder.not_valid_before(start).not_valid_after(now + dt.timedelta(days=days))


@dataclass(frozen=True)
class Leaf:
    """A certificate and its key, as files."""

    cert_file: Path
    key_file: Path

    @property
    def cert(self) -> bytes:
        return self.cert_file.read_bytes()

    @property
    def key(self) -> bytes:
        return self.key_file.read_bytes()


class TestCA:
    """A self-signed CA that issues leaf certificates into `directory`."""

    __test__ = False  # not a pytest test class

    def __init__(self, directory: Path, name: str = "quarry-test-ca"):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = _name(name)
        self._cert = (
            _validity(x509.CertificateBuilder())
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.ca_file = self.directory / f"{name}.pem"
        self.ca_file.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    @property
    def ca(self) -> bytes:
        return self.ca_file.read_bytes()

    def issue(self, common_name: str, sans: tuple[str, ...] = SANS, days: float = 2) -> Leaf:
        """A certificate for `common_name` valid for both server and client authentication,
        naming `sans` (DNS names and IP addresses), for `days` (negative: expired)."""
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for san in sans:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(san)))
            except ValueError:
                names.append(x509.DNSName(san))
        cert = (
            _validity(x509.CertificateBuilder(), days)
            .subject_name(_name(common_name))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        leaf = Leaf(self.directory / f"{common_name}.crt", self.directory / f"{common_name}.key")
        leaf.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        leaf.key_file.write_bytes(_pem_key(key))
        leaf.key_file.chmod(0o600)
        return leaf


@dataclass(frozen=True)
class Pki:
    """What a TLS test needs: the CA, a certificate the services share, a client's, and an
    unrelated CA with a certificate of its own (trusted by nobody here)."""

    ca: TestCA
    server: Leaf
    client: Leaf
    other_ca: TestCA
    stranger: Leaf

    def env(self, *, client_auth: bool = False) -> dict[str, str]:
        """QUARRY_TLS_* for a service process (its certificate, the CA, mTLS or not)."""
        env = {
            "QUARRY_TLS_CERT_FILE": str(self.server.cert_file),
            "QUARRY_TLS_KEY_FILE": str(self.server.key_file),
            "QUARRY_TLS_CA_FILE": str(self.ca.ca_file),
        }
        if client_auth:
            env["QUARRY_TLS_CLIENT_AUTH"] = "true"
        return env

    def client_env(self, *, with_certificate: bool = False) -> dict[str, str]:
        """QUARRY_TLS_* for a user's client: the CA, and its own certificate for mTLS."""
        env = {"QUARRY_TLS_CA_FILE": str(self.ca.ca_file)}
        if with_certificate:
            env["QUARRY_TLS_CERT_FILE"] = str(self.client.cert_file)
            env["QUARRY_TLS_KEY_FILE"] = str(self.client.key_file)
        return env


def make_pki(directory: Path) -> Pki:
    ca = TestCA(Path(directory) / "ca")
    other = TestCA(Path(directory) / "other-ca", name="unrelated-ca")
    return Pki(
        ca=ca,
        server=ca.issue("quarry-services"),
        client=ca.issue("quarry-user"),
        other_ca=other,
        stranger=other.issue("stranger"),
    )
