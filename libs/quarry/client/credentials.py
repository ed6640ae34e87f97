"""The credentials a client logs in with: an access key id and its secret.

Found, in this order: the environment (`QUARRY_ACCESS_KEY_ID` + `QUARRY_SECRET_ACCESS_KEY`),
then `$QUARRY_HOME/credentials.json` (written by `quarry setup` / `quarry up`), else none.

Safety rule: the secret never appears in a repr, a log line or a world-readable file: the
file is created mode 0600 (never widened afterwards, never written through a pre-existing
file's wider mode), and `Credentials` leaves the secret out of its repr.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from quarry import errors

ACCESS_KEY_ENV = "QUARRY_ACCESS_KEY_ID"
SECRET_KEY_ENV = "QUARRY_SECRET_ACCESS_KEY"
CREDENTIALS_FILE = "credentials.json"
FILE_MODE = 0o600


class InvalidCredentialsFile(errors.FailedPrecondition):
    reason = "INVALID_CREDENTIALS_FILE"


@dataclass(frozen=True)
class Credentials:
    """An access key id and its secret (left out of the repr)."""

    access_key_id: str
    secret_access_key: str = field(repr=False)


def default_home() -> Path:
    """QUARRY_HOME as the settings resolve it (env, config file, default)."""
    from quarry.config import load_settings

    return Path(load_settings().home)


def credentials_path(home: Path | str | None = None) -> Path:
    return Path(home if home is not None else default_home()) / CREDENTIALS_FILE


def load_credentials(
    home: Path | str | None = None, env: dict[str, str] | None = None
) -> Credentials | None:
    """The environment's credentials, else the file's in `home` (default: QUARRY_HOME),
    else None. Both env variables or neither: one alone is a mistake worth saying."""
    env = dict(os.environ) if env is None else env
    key_id, secret = env.get(ACCESS_KEY_ENV, ""), env.get(SECRET_KEY_ENV, "")
    if key_id or secret:
        if not (key_id and secret):
            raise InvalidCredentialsFile(
                f"set both {ACCESS_KEY_ENV} and {SECRET_KEY_ENV}, or neither",
                metadata={"source": "environment"},
            )
        return Credentials(key_id, secret)
    path = credentials_path(home)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
        return Credentials(str(data["access_key_id"]), str(data["secret_access_key"]))
    except (ValueError, KeyError, TypeError):
        raise InvalidCredentialsFile(
            f"{path} is not a credentials file "
            '({"access_key_id": ..., "secret_access_key": ...})',
            metadata={"path": str(path)},
        ) from None


def write_credentials(credentials: Credentials, home: Path | str | None = None) -> Path:
    """Write `credentials.json` in `home` (default: QUARRY_HOME), mode 0600 from the first
    byte: a new file is created 0600 and replaces the old one atomically, so the secret is
    never readable by others, not even for a moment."""
    path = credentials_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    payload = json.dumps(
        {
            "access_key_id": credentials.access_key_id,
            "secret_access_key": credentials.secret_access_key,
        }
    )
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(payload + "\n")
        os.chmod(temporary, FILE_MODE)  # whatever the umask
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path


__all__ = [
    "ACCESS_KEY_ENV",
    "SECRET_KEY_ENV",
    "CREDENTIALS_FILE",
    "Credentials",
    "InvalidCredentialsFile",
    "credentials_path",
    "load_credentials",
    "write_credentials",
]
