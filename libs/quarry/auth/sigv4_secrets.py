"""What AWS Signature V4 needs from the Auth service: the credential's secret, kept sealed,
and the check of a signature made with it (Auth/VerifySignature, used by the s3-gateway).

SigV4 signs with a key derived from the secret itself, so a signature cannot be checked
against the scrypt hash the store keeps for Login. A credential therefore also keeps its
secret sealed (AES-256-GCM under a key derived from the suite's signing key, the access key
id as associated data, so a sealed secret copied onto another credential does not open).
lakeFS stores its secrets encrypted the same way. Credentials made before this existed have
no sealed secret: they log in as before but cannot sign S3 requests (create a new one).

Safety rules: the secret is never returned, logged or put in an error message by anything
here; verification answers only "matches" or "does not", in constant time per signature,
and the same refusal for an unknown key, a credential without a sealed secret and a wrong
signature. Rotating the signing key makes sealed secrets unreadable (refused, never
guessed): S3 credentials are then re-created.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from quarry import errors
from quarry.auth import errors as auth_errors

if TYPE_CHECKING:
    from quarry.auth.store import IamStore
    from quarry.storage.v1 import auth_records_pb2 as records

SEAL_VERSION = b"\x01"
_NONCE_BYTES = 12
_SEAL_CONTEXT = b"quarry/credential-secret-seal/v1"
ALGORITHM = "AWS4-HMAC-SHA256"


class SecretSealer:
    """Seals and opens credential secrets with a key derived from the signing key."""

    def __init__(self, signing_key: bytes) -> None:
        # A key of its own (HMAC of a fixed context), so nothing sealed is ever a token key.
        self._aead = AESGCM(hmac.new(signing_key, _SEAL_CONTEXT, hashlib.sha256).digest())

    def seal(self, access_key_id: str, secret: str) -> bytes:
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, secret.encode("utf-8"), access_key_id.encode())
        return SEAL_VERSION + nonce + sealed

    def open(self, access_key_id: str, sealed: bytes) -> str | None:
        """The secret, or None when `sealed` is empty, of another version, or does not open
        under this key for this access key id."""
        if len(sealed) <= 1 + _NONCE_BYTES or sealed[:1] != SEAL_VERSION:
            return None
        nonce, body = sealed[1 : 1 + _NONCE_BYTES], sealed[1 + _NONCE_BYTES :]
        try:
            return self._aead.decrypt(nonce, body, access_key_id.encode()).decode("utf-8")
        except (InvalidTag, UnicodeDecodeError):
            return None


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode("utf-8"), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    """SigV4's derived key: HMAC chain over the scope, starting from "AWS4" + secret."""
    k_date = _hmac(("AWS4" + secret).encode("utf-8"), date)
    return _hmac(_hmac(_hmac(k_date, region), service), "aws4_request")


def sign(key: bytes, string_to_sign: str) -> str:
    return hmac.new(key, string_to_sign.encode("utf-8"), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Scope:
    date: str  # YYYYMMDD
    region: str
    service: str

    def line(self) -> str:
        return f"{self.date}/{self.region}/{self.service}/aws4_request"


def signatures_match(secret: str, scope: Scope, signed: Sequence[tuple[str, str]]) -> bool:
    """True when every (string_to_sign, signature) is signed with `secret` under `scope`, and
    each string to sign names that scope (its third line), so a signature is never checked
    against a scope other than the one the key was derived for."""
    if not signed or not scope.date or not scope.region or not scope.service:
        return False
    key = signing_key(secret, scope.date, scope.region, scope.service)
    ok = True
    for string_to_sign, signature in signed:
        lines = string_to_sign.split("\n")
        if len(lines) < 4 or lines[2] != scope.line():
            ok = False
        # Every signature is computed and compared, matching or not (no early exit).
        ok = hmac.compare_digest(sign(key, string_to_sign), signature.lower()) and ok
    return ok


class SignatureDoesNotMatch(errors.Unauthenticated):
    """A SigV4 signature is not the credential's (or the key is unknown, or keeps no sealed
    secret: the same answer for all three)."""

    reason = "SIGNATURE_DOES_NOT_MATCH"


class InvalidSignatureRequest(errors.InvalidArgument):
    """A VerifySignature request missing what any check needs (a caller's bug, not a bad
    signature)."""

    reason = "INVALID_SIGNATURE_REQUEST"


def verify_signatures(
    iam: IamStore,
    sealer: SecretSealer,
    access_key_id: str,
    scope: Scope,
    signed: Sequence[tuple[str, str]],
) -> records.CredentialRecord:
    """The credential of `access_key_id` when every signature in `signed` is its own under
    `scope`; SignatureDoesNotMatch otherwise (never which part failed).
    InvalidSignatureRequest when the request names no key, scope or signature at all."""
    if not access_key_id or not scope.date or not scope.region or not scope.service or not signed:
        raise InvalidSignatureRequest(
            "VerifySignature needs access_key_id, date, region, service and at least one "
            "signed string"
        )
    refused = SignatureDoesNotMatch(
        "the request signature does not match (unknown access key id, a credential created "
        "before S3 access existed, or a wrong signature)",
        metadata={"access_key_id": access_key_id},
    )
    try:
        record = iam.get_credentials(access_key_id)
    except (auth_errors.CredentialsNotFound, errors.InvalidArgument):
        raise refused from None
    secret = sealer.open(record.access_key_id, record.sealed_secret)
    if secret is None or not signatures_match(secret, scope, signed):
        raise refused
    if not iam.user_exists(record.user_id):
        raise refused
    return record


def scoped_signing_key(
    sealer: SecretSealer, record: records.CredentialRecord, scope: Scope
) -> bytes:
    """The SigV4 key of `record`'s secret for one scope (a day, a region, a service), for a
    caller that verified a signature of that scope with it (verify_signatures) and checks the
    credential's next signatures of the scope itself for a short while (the s3-gateway's
    cache). It cannot be turned back into the secret and signs nothing outside its scope.
    Empty when the sealed secret does not open (never a guess)."""
    secret = sealer.open(record.access_key_id, record.sealed_secret)
    if secret is None:
        return b""
    return signing_key(secret, scope.date, scope.region, scope.service)
