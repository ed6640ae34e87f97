"""Which bucket, ref and object path a request names.

Path-style: /BUCKET/REF/PATH. Virtual-host style, when a domain is configured: the Host
REPO.DOMAIN names the bucket and the whole path is REF/PATH. Bucket = repository; the key's
first segment is the ref (a branch, tag, commit id or ref expression), the rest the object's
path in it. A key with no path after the ref names the ref only (listing it)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote


@dataclass(frozen=True)
class Target:
    bucket: str = ""
    key: str = ""

    @property
    def ref(self) -> str:
        return self.key.partition("/")[0]

    @property
    def path(self) -> str:
        return self.key.partition("/")[2]


def resolve(raw_path: str, host: str, domain: str) -> Target:
    path = unquote(raw_path)
    hostname = host.rpartition(":")[0] if ":" in host and not host.endswith("]") else host
    hostname = hostname.lower()
    if domain and hostname.endswith("." + domain.lower()):
        bucket = hostname[: -len(domain) - 1]
        return Target(bucket, path.lstrip("/"))
    trimmed = path.lstrip("/")
    bucket, _, key = trimmed.partition("/")
    return Target(bucket, key)


def split_key(key: str) -> tuple[str, str]:
    """(ref, path) of a key "REF/PATH"."""
    ref, _, path = key.partition("/")
    return ref, path
