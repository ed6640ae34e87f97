"""Access keys: ids like AWS/lakeFS (`AKIAQ…`, 20 characters), 40-character secrets, and the
salted slow hash that is all the store ever keeps of a secret.

Safety rule: a secret is returned once, at creation, and never stored, logged or put in an
exception message; only `hash_secret`'s output is persisted, and `secret_matches` compares
in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import string

from quarry.storage.v1 import auth_records_pb2

ACCESS_KEY_PREFIX = "AKIAQ"
ACCESS_KEY_LENGTH = 20
SECRET_LENGTH = 40
_KEY_ALPHABET = string.ascii_uppercase + string.digits
_SECRET_ALPHABET = string.ascii_letters + string.digits + "+/"

SCRYPT = "scrypt"
# scrypt cost: ~16 MiB and a few tens of ms per check; logins are rare (tokens are reused).
SCRYPT_N = 2**14
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
DIGEST_BYTES = 32


def new_access_key_id() -> str:
    tail = "".join(
        secrets.choice(_KEY_ALPHABET) for _ in range(ACCESS_KEY_LENGTH - len(ACCESS_KEY_PREFIX))
    )
    return ACCESS_KEY_PREFIX + tail


def new_secret() -> str:
    return "".join(secrets.choice(_SECRET_ALPHABET) for _ in range(SECRET_LENGTH))


def hash_secret(secret: str, *, n: int = SCRYPT_N) -> auth_records_pb2.SecretHash:
    """A fresh per-credential salt and the scrypt digest of `secret` under it."""
    salt = secrets.token_bytes(SALT_BYTES)
    digest = _scrypt(secret, salt, n, SCRYPT_R, SCRYPT_P)
    return auth_records_pb2.SecretHash(
        algorithm=SCRYPT, salt=salt, digest=digest, n=n, r=SCRYPT_R, p=SCRYPT_P
    )


def secret_matches(secret: str, stored: auth_records_pb2.SecretHash) -> bool:
    """Whether `secret` hashes to `stored` (constant-time comparison of the digests)."""
    if stored.algorithm != SCRYPT or not stored.salt or not stored.digest:
        return False
    candidate = _scrypt(secret, stored.salt, stored.n, stored.r, stored.p)
    return hmac.compare_digest(candidate, stored.digest)


def _scrypt(secret: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        secret.encode("utf-8"),
        salt=salt,
        n=n,
        r=r,
        p=p,
        maxmem=64 * 1024 * 1024,
        dklen=DIGEST_BYTES,
    )
