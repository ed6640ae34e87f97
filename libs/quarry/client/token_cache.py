"""Bearer tokens kept between command runs: `$QUARRY_HOME/tokens.json`, so each `quarry`
command does not log in again (one scrypt on the server, one Auth/Login) — as the cloud CLIs
keep theirs.

A token is filed under the endpoint it was obtained from (the branch-manager's address,
where Login goes) and the credentials that logged in — the access key id and a digest of
its secret: another server, another key, or the right key id with a wrong secret never get
it (the cache once answered a command run with a mistyped secret). It is used until REFRESH_MARGIN_SECONDS before it expires; a
call refused as UNAUTHENTICATED with a cached token drops it, and the client logs in again
once (quarry.client.session.TokenSource).

Safety rules: the file is written mode 0600 from the first byte (a new file replaced
atomically, never through an existing file's wider mode), like the credentials file; a token
never goes to an endpoint or key other than the ones that obtained it; the cache is only a
shortcut — an unreadable or malformed file is ignored (and rewritten), never an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from quarry.client.credentials import Credentials

TOKENS_FILE = "tokens.json"
FILE_MODE = 0o600


class TokenCache:
    """The tokens file in `home`: lookup, store, drop (each a whole-file read or replace;
    concurrent CLI runs at worst lose one entry, which costs one Login)."""

    def __init__(self, home: Path | str, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(home) / TOKENS_FILE
        self._clock = clock

    @staticmethod
    def key(endpoint: str, credentials: Credentials) -> str:
        """The entry's name. The secret enters only as a SHA-256 digest: the file (0600)
        already holds a bearer token good for the same access, so the digest gives its
        reader nothing more, and the secrets Quarry issues are random, not guessable."""
        secret = hashlib.sha256(
            b"quarry token cache\0" + credentials.secret_access_key.encode()
        ).hexdigest()[:32]
        return f"{endpoint} {credentials.access_key_id} {secret}"

    def _read(self) -> dict[str, dict[str, object]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self, data: dict[str, dict[str, object]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh)
            os.chmod(temporary, FILE_MODE)  # whatever the umask
            os.replace(temporary, self.path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise

    def lookup(
        self, endpoint: str, credentials: Credentials, margin: float
    ) -> tuple[str, float] | None:
        """The token for (endpoint, credentials) and its expiry, if it is good for `margin`
        seconds."""
        entry = self._read().get(self.key(endpoint, credentials))
        if not isinstance(entry, dict):
            return None
        token, expires_at = entry.get("token"), entry.get("expires_at")
        if not isinstance(token, str) or not token or not isinstance(expires_at, (int, float)):
            return None
        if expires_at - self._clock() < margin:
            return None
        return token, float(expires_at)

    def store(self, endpoint: str, credentials: Credentials, token: str, expires_at: float) -> None:
        data = self._read()
        now = self._clock()
        # Expired entries go: the file holds only tokens still good.
        data = {
            key: entry
            for key, entry in data.items()
            if isinstance(entry, dict) and float(entry.get("expires_at", 0) or 0) > now  # type: ignore[arg-type]
        }
        data[self.key(endpoint, credentials)] = {"token": token, "expires_at": expires_at}
        with contextlib.suppress(OSError):  # a read-only home: no cache, no failure
            self._write(data)

    def drop(self, endpoint: str, credentials: Credentials) -> None:
        data = self._read()
        if data.pop(self.key(endpoint, credentials), None) is not None:
            with contextlib.suppress(OSError):
                self._write(data)


__all__ = ["TOKENS_FILE", "TokenCache"]
