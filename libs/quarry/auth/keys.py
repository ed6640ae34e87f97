"""Access keys: ids like AWS/lakeFS (`AKIAQ…`, 20 characters), 40-character secrets, and the
salted slow hash that is all the store ever keeps of a secret.

Also the suite's token signing key (resolve_signing_key / ensure_signing_key).

Safety rule: a secret is returned once, at creation, and never stored, logged or put in an
exception message; only `hash_secret`'s output is persisted, and `secret_matches` compares
in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import string
from collections.abc import Callable
from pathlib import Path

from quarry import errors
from quarry.auth.tokens import MIN_KEY_BYTES
from quarry.config import Settings
from quarry.storage.v1 import auth_records_pb2

ACCESS_KEY_PREFIX = "AKIAQ"
ACCESS_KEY_LENGTH = 20
SECRET_LENGTH = 40
# A secret an operator chooses (setup with given keys) is at least this long.
MIN_CHOSEN_SECRET_LENGTH = 16
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


def decoy_hash(*, n: int = SCRYPT_N) -> auth_records_pb2.SecretHash:
    """A hash with the cost parameters of a real one that no secret is known to match (a
    random digest under a random salt): checking a secret against it takes as long as against
    a stored hash, and making it costs no scrypt (a service start pays nothing for it)."""
    return auth_records_pb2.SecretHash(
        algorithm=SCRYPT,
        salt=secrets.token_bytes(SALT_BYTES),
        digest=secrets.token_bytes(DIGEST_BYTES),
        n=n,
        r=SCRYPT_R,
        p=SCRYPT_P,
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


# ---- the signing key of the suite's tokens -----------------------------------------------

SIGNING_KEY_RANDOM_BYTES = 32


class SigningKeyMissing(errors.FailedPrecondition):
    """Auth is on and no signing key is configured: a service refuses to start."""

    reason = "SIGNING_KEY_MISSING"


def resolve_signing_key(settings: Settings) -> bytes:
    """The signing key of `settings`: QUARRY_AUTH_SIGNING_KEY, else the contents of the key
    file (QUARRY_AUTH_SIGNING_KEY_FILE, default `home`/signing.key), stripped.

    Never invents a key: a service that made up its own would reject every other service's
    tokens. SigningKeyMissing (with how to fix it) when neither gives one, or it is short."""
    return read_key(
        settings.auth_signing_key,
        "QUARRY_AUTH_SIGNING_KEY",
        Path(settings.effective_signing_key_file),
        SigningKeyMissing,
        what="the signing key",
        missing=lambda path: (
            f"auth is on but there is no signing key: set QUARRY_AUTH_SIGNING_KEY, or put "
            f"one in {path} (QUARRY_AUTH_SIGNING_KEY_FILE; `quarry up` creates it), or turn "
            "auth off with QUARRY_AUTH_ENABLED=false (trusted development only)"
        ),
    )


def read_key(  # noqa: PLR0913 — where a secret key comes from and how to say it is missing
    value: str,
    variable: str,
    path: Path,
    error: type[errors.QuarryError],
    *,
    what: str,
    missing: Callable[[Path], str],
    min_bytes: int = MIN_KEY_BYTES,
) -> bytes:
    """A secret key from its setting (`value`, named `variable`), else the stripped contents
    of its file: the one way the signing key and the console's session key are read. `error`
    (its message from `missing`) when neither gives one, or the key is shorter than
    `min_bytes`. Never invents a key: processes that made up their own would refuse each
    other's tokens or cookies."""
    if value:
        key, source = value.encode("utf-8"), variable
    else:
        source = str(path)
        try:
            key = path.read_bytes().strip()
        except FileNotFoundError:
            raise error(missing(path), metadata={"file": str(path)}) from None
    if len(key) < min_bytes:
        raise error(
            f"{what} from {source} is {len(key)} bytes; it must be at least {min_bytes}",
            metadata={"source": source},
        )
    return key


def ensure_signing_key(settings: Settings) -> bytes:
    """The signing key, creating the key file (mode 0600, 32 random bytes as hex) when no
    key is configured and the file is missing (`quarry up`). Never overwrites a key file."""
    if not settings.auth_signing_key:
        create_key_file(Path(settings.effective_signing_key_file))
    return resolve_signing_key(settings)


def create_key_file(path: Path) -> None:
    """A key file (mode 0600, 32 random bytes as hex) at `path` when there is none; never
    overwrites one (the signing key, the console's session key)."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_hex(SIGNING_KEY_RANDOM_BYTES).encode("ascii")
    try:
        # O_EXCL: a file created meanwhile by another `quarry up` is kept, not replaced.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "wb") as handle:
        handle.write(key + b"\n")
