"""Where a server reading an object for a user may open a local file: quarry.graveler.reach's
rules again, at read time, on the file actually opened.

Staging checks where an address points when it is staged. A file can be replaced by a
symbolic link afterwards (by anyone who may write into the directory), and a plain open()
follows it: so a service that reads for its callers (the s3-gateway, the console) checks the
real path of the file it opened (the kernel's name for the open descriptor, not the path it
asked for). Allowed: inside the repository's own storage namespace, or below a directory of
QUARRY_IMPORT_LOCAL_PREFIXES; never one of Quarry's own files (QuarryFiles). Anything else
is refused before a byte is read.

(A client reading with its own file-system permissions, `quarry cat` or Spark, reads what
its user could read anyway: no confinement there.)
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

from quarry import errors


class AddressNotAllowed(errors.PermissionDenied):
    """An address or import source where this server lets no entry point or read
    (quarry.graveler.reach when staging, Confinement when reading)."""

    reason = "ADDRESS_NOT_ALLOWED"


def as_dir(path: str) -> str:
    return path.rstrip("/") + "/"


def inside(path: str, root: str) -> bool:
    """`path` is `root` (ending in "/") or below it."""
    return as_dir(path).startswith(root)


@functools.lru_cache(maxsize=4096)
def real_dir(path: str) -> str:
    """The real path of a directory that does not move (a namespace, a configured prefix,
    Quarry's home), ending in "/"; cached: resolving costs a syscall per segment."""
    return as_dir(os.path.realpath(path))


@dataclass(frozen=True)
class QuarryFiles:
    """Quarry's own files, never an entry's object: everything directly in QUARRY_HOME (the
    signing key, the admin's credentials, the KV file, the token cache), the range cache,
    and the key files the settings name wherever they are. Directories below the home
    (`lake/` holds `quarry up`'s demo namespaces) are the user's."""

    home: str = ""  # real, ending in "/" ("": none: tests of the rules alone)
    dirs: tuple[str, ...] = ()  # real, ending in "/"
    files: frozenset[str] = frozenset()  # real paths

    @classmethod
    def of(cls, settings: Any) -> QuarryFiles:
        named = (
            settings.auth_signing_key_file,
            settings.console_session_key_file,
            settings.tls_key_file,
        )
        # By the raw settings: effective_cache_dir resolves a path (syscalls) on every call.
        return _quarry_files(settings.home, settings.cache_dir, named)

    def holds(self, real: str) -> bool:
        """Whether the file at the real path `real` is one of Quarry's own."""
        if not self.home:
            return False
        return (
            real.rpartition("/")[0] + "/" == self.home
            or any(inside(real, d) for d in self.dirs)
            or real in self.files
        )

    def overlaps(self, directory: str) -> bool:
        """Whether the directory at the real path `directory` (an import source) holds or
        lies among Quarry's own files."""
        if not self.home:
            return False
        return (
            inside(self.home, as_dir(directory))
            or any(inside(directory, d) or inside(d, as_dir(directory)) for d in self.dirs)
            or any(inside(f, as_dir(directory)) for f in self.files)
        )


@dataclass(frozen=True)
class Confinement:
    """The real roots one repository's reads may open local files under."""

    namespace: str  # the repository's namespace directory, real, ending in "/" ("": in S3)
    prefixes: tuple[str, ...]  # QUARRY_IMPORT_LOCAL_PREFIXES, real, ending in "/"
    own: QuarryFiles

    @classmethod
    def of(cls, namespace_dir: str, settings: Any) -> Confinement:
        """`namespace_dir`: the repository's local namespace directory, "" for one in S3.
        Built once per namespace and settings (a read is the hot path)."""
        return _confinement(namespace_dir, settings.import_local_prefixes, QuarryFiles.of(settings))

    def allows(self, real: str) -> bool:
        if self.own.holds(real):
            return False
        if self.namespace and inside(real, self.namespace):
            return True
        return any(inside(real, prefix) for prefix in self.prefixes)

    def check(self, real: str, address: str) -> None:
        if not self.allows(real):
            raise AddressNotAllowed(
                f"{address!r} leads outside where this repository may read (a link to "
                "another place?): not read",
                metadata={"address": address},
            )


@functools.lru_cache(maxsize=64)
def _quarry_files(home: str, cache_dir: str, named: tuple[str, ...]) -> QuarryFiles:
    """`cache_dir` as configured ("": QUARRY_HOME/cache, as Settings.effective_cache_dir)."""
    cache = cache_dir or os.path.join(home, "cache")
    return QuarryFiles(
        real_dir(home), (real_dir(cache),), frozenset(os.path.realpath(f) for f in named if f)
    )


@functools.lru_cache(maxsize=4096)
def _confinement(namespace_dir: str, prefixes: str, own: QuarryFiles) -> Confinement:
    return Confinement(
        real_dir(namespace_dir) if namespace_dir else "", local_prefixes(prefixes), own
    )


@functools.lru_cache(maxsize=64)
def local_prefixes(text: str) -> tuple[str, ...]:
    """QUARRY_IMPORT_LOCAL_PREFIXES (comma-separated absolute directories), as real paths
    ending in "/"."""
    return tuple(real_dir(p.strip()) for p in text.split(",") if p.strip())


def opened_path(fileno: int) -> str:
    """The real path of an open file, as the kernel names it (Linux /proc): what was opened,
    whatever links the path went through."""
    return os.readlink(f"/proc/self/fd/{fileno}")
