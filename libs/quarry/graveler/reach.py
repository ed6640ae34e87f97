"""Where a staged entry's physical address, or an import's source, may point.

An entry is read wherever its address points, by anyone who may read the entry (the S3
gateway, `quarry cat`, Spark). So where an address may point is decided here, once, for
every caller of PutObject(s) and StartImport, before anything is staged or listed.

Safety rules:
  * An entry never points into another repository's storage namespace, and an import
    source never overlaps one or the target's own `_quarry/` area: the other repository's
    GC does not know of the entry and may delete the object under it, and a reader of this
    repository would read objects of one it may not read.
  * Nothing ever points at Quarry's own files (quarry.blob.confine.QuarryFiles: what lies
    directly in QUARRY_HOME, the signing key, the admin's credentials, the KV file; the
    range cache; the key files the settings name), and no import source holds one:
    reading the signing key is forging any token.
  * A local file outside the repository's namespace is reachable only below a directory the
    operator allowed (QUARRY_IMPORT_LOCAL_PREFIXES; none by default, as lakeFS's
    `allowed_external_prefixes`): otherwise anyone who may stage an address could read
    every file the server's account can (keys, other users' data).
  * A local address is judged by its real path: a symbolic link inside a namespace (or
    inside an allowed directory) never reaches out of it. A link planted after staging is
    caught where a service reads for its callers (quarry.blob.confine, the same rules on
    the file it opened).

`fs:ImportFromStorage` (quarry.auth.checks) decides, on top of these, which users may
stage an address outside the repository's namespace at all, and where.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from quarry import errors
from quarry.blob.confine import (
    AddressNotAllowed,
    QuarryFiles,
    inside,
    local_prefixes,
)
from quarry.blob.layout import address_location
from quarry.blob.namespace import namespace_location, namespaces_overlap
from quarry.blob.sources import Source, parse_source
from quarry.graveler import errors as gerrors
from quarry.graveler.model import Entry
from quarry.graveler.refs import RefManager, Repository

PREFIXES_SETTING = "QUARRY_IMPORT_LOCAL_PREFIXES"
_PAGE = 100


@functools.lru_cache(maxsize=4096)
def _namespace_root(storage_namespace: str) -> tuple[str, str]:
    # namespace_location resolves a local namespace's real path (a syscall per segment);
    # a repository's recorded namespace is already canonical, so its root never changes.
    return namespace_location(storage_namespace)


@dataclass(frozen=True)
class Reach:
    """The operator's part of the rules: the allowed local directories (real paths ending
    in "/") and Quarry's own files."""

    local_prefixes: tuple[str, ...] = ()
    own: QuarryFiles = QuarryFiles()

    @classmethod
    def of(cls, settings: Any) -> Reach:
        """From QUARRY_IMPORT_LOCAL_PREFIXES (checked absolute by Settings) and the places
        of Quarry's own files."""
        return cls(local_prefixes(settings.import_local_prefixes), QuarryFiles.of(settings))


class AddressRules:
    """The module's rules over one KV store's repositories."""

    def __init__(self, refs: RefManager, reach: Reach | None = None) -> None:
        self.refs = refs
        self.reach = reach or Reach()

    # ---- staged entries -------------------------------------------------------------------

    def check_entries(self, repo: Repository, entries: Iterable[Entry]) -> None:
        """AddressNotAllowed for the first entry whose address breaks a rule."""
        others: list[Repository] | None = None
        pairs = ((entry.path, entry.physical_address) for entry in entries)
        for one in reached(repo.storage_namespace, pairs):
            path, address, kind, where = one.path, one.address, one.kind, one.where
            if one.inside:
                if one.named != where:
                    # Garbage collection keeps an object when an address NAMES it
                    # (quarry.blob.layout.referenced_keys): one that reaches it through a
                    # link (from outside, or from another key of the namespace) would let
                    # GC delete what the entry reads.
                    raise AddressNotAllowed(
                        f"{path!r}: address {address!r} reaches the repository's storage "
                        f"namespace through a link: stage it as {where!r}",
                        metadata={"path": path, "address": address},
                    )
                continue
            if kind == "local":
                self._check_not_own(where, address)
            if others is None:
                others = self._other_repositories(repo)
            for other in others:
                other_kind, other_root = _namespace_root(other.storage_namespace)
                if other_kind == kind and inside(where, other_root):
                    raise AddressNotAllowed(
                        f"{path!r}: address {address!r} lies in the storage namespace "
                        f"of repository {other.name!r}; an entry never points into another "
                        "repository's objects (copy them instead)",
                        metadata={"path": path, "repository": other.name},
                    )
            if kind == "local":
                self._check_local_prefix(where, address)

    # ---- import sources -------------------------------------------------------------------

    def check_source(self, repo: Repository, source: Source) -> None:
        """The rules for a whole directory or prefix an import lists."""
        location = source.location
        own = repo.storage_namespace.rstrip("/") + "/_quarry"
        if namespaces_overlap(location, own):
            raise gerrors.InvalidImportSource(
                f"import source {source.uri!r} overlaps {own}, Quarry's own files of "
                f"repository {repo.name!r}",
                metadata={"uri": source.uri, "repository": repo.name},
            )
        for other in self._other_repositories(repo):
            if namespaces_overlap(location, other.storage_namespace):
                raise gerrors.InvalidImportSource(
                    f"import source {source.uri!r} overlaps the storage namespace of "
                    f"repository {other.name!r}",
                    metadata={"uri": source.uri, "repository": other.name},
                )
        if source.kind != "local":
            return
        where = _resolved(source.root, source.uri)
        kind, root = _namespace_root(repo.storage_namespace)
        if kind != "local" or not inside(where, root):
            # Outside the repository's own namespace (inside it, only `_quarry/` is refused).
            if self.reach.own.overlaps(where):
                raise AddressNotAllowed(
                    f"import source {source.uri!r} holds or lies among Quarry's own files "
                    "(its home's keys, credentials and KV file, its cache): never entries",
                    metadata={"uri": source.uri},
                )
            self._check_local_prefix(where, source.uri)

    # ---- the parts ------------------------------------------------------------------------

    def check_namespace(self, storage_namespace: str) -> None:
        """A new repository's namespace never holds Quarry's own files (they would be
        objects inside the namespace)."""
        kind, root = namespace_location(storage_namespace)
        if kind == "local" and self.reach.own.overlaps(root):
            raise AddressNotAllowed(
                f"storage namespace {storage_namespace!r} holds or lies among Quarry's own "
                "files (its home's keys, credentials and KV file, its cache): use a "
                "directory of its own",
                metadata={"storage_namespace": storage_namespace},
            )

    def _check_not_own(self, real: str, address: str) -> None:
        if self.reach.own.holds(real):
            raise AddressNotAllowed(
                f"address {address!r} is one of Quarry's own files (its home's keys, "
                "credentials and KV file, its cache): never an entry",
                metadata={"address": address},
            )

    def _check_local_prefix(self, real: str, address: str) -> None:
        if not any(inside(real, prefix) for prefix in self.reach.local_prefixes):
            allowed = ", ".join(p.rstrip("/") for p in self.reach.local_prefixes) or "none"
            raise AddressNotAllowed(
                f"{address!r} is a local path outside the repository's storage namespace "
                f"and outside the directories this server allows ({PREFIXES_SETTING}: "
                f"{allowed})",
                metadata={"address": address, "setting": PREFIXES_SETTING},
            )

    def _other_repositories(self, repo: Repository) -> list[Repository]:
        found: list[Repository] = []
        after = ""
        while True:
            page = self.refs.list_repositories(after=after, limit=_PAGE)
            found.extend(r for r in page if r.name != repo.name)
            if len(page) < _PAGE:
                return found
            after = page[-1].name


class Reached(NamedTuple):
    """Where one entry's address leads: `kind` and `where` as a reader opens it (a local
    file by its real path), and `named`, the place its text names (the same unless a link
    lies on the way)."""

    path: str
    address: str
    kind: str
    where: str
    inside: bool
    named: str


def reached(storage_namespace: str, pairs: Iterable[tuple[str, str]]) -> Iterator[Reached]:
    """Reached for each (path, address) of `pairs` a reader opens (not an empty or opaque
    address). Costs a string compare per S3 address, an lstat per local one (and its
    directory's real path once per call). InvalidPhysicalAddress (quarry.blob.layout) for
    an address with a `..`, `.` or empty segment."""
    kind, root = _namespace_root(storage_namespace)
    real_dirs: dict[str, str] = {}
    for path, address in pairs:
        location = address_location(address) if address else None
        if location is None:
            continue  # no address, or one no reader opens (an opaque string)
        where = location.where
        if location.kind == "local":
            try:
                where = _real_file(where, real_dirs, root if kind == "local" else "")
            except OSError:  # a link the server may not read (/proc/1/root/...)
                where = _resolved(where, address)
        inside_root = location.kind == kind and inside(where, root)
        yield Reached(path, address, location.kind, where, inside_root, location.where)


def outside_namespace(
    storage_namespace: str, pairs: Iterable[tuple[str, str]]
) -> Iterator[tuple[str, str, str, str]]:
    """(path, address, kind, where) for each (path, address) of `pairs` whose address a
    reader opens outside the namespace: a local address by its real path (a link inside the
    namespace pointing out is outside), an S3 one by its text (reached)."""
    for one in reached(storage_namespace, pairs):
        if not one.inside:
            yield one.path, one.address, one.kind, one.where


def _resolved(path: str, given: str) -> str:
    """os.path.realpath, or AddressNotAllowed when the path cannot be resolved (a link the
    server may not follow, such as /proc/1/root): never judged by its text."""
    try:
        return os.path.realpath(path, strict=False)
    except OSError:
        raise AddressNotAllowed(
            f"{given!r} cannot be resolved to a real path here: not reachable",
            metadata={"address": given},
        ) from None


def _real_file(where: str, real_dirs: dict[str, str], root: str = "") -> str:
    """The real path of the local file `where` names: its directory's real path (resolved
    once per directory per call), and the file itself resolved when it is a link. `root`:
    a real directory (the namespace's, recorded real): below it only the segments under
    it are looked at (an lstat each, not a walk of the whole path: the hot path)."""
    try:
        if stat.S_ISLNK(os.lstat(where).st_mode):
            return os.path.realpath(where)
    except OSError:
        pass  # not there (yet): its directory decides
    directory, _, name = where.rpartition("/")
    real = real_dirs.get(directory)
    if real is None:
        real = real_dirs[directory] = _real_directory(directory or "/", root)
    return real.rstrip("/") + "/" + name


def _real_directory(directory: str, root: str) -> str:
    if not (root and inside(directory, root)):
        return os.path.realpath(directory)
    path = root.rstrip("/")
    for segment in directory[len(root) :].split("/"):
        if not segment:
            continue
        path = f"{path}/{segment}"
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                return os.path.realpath(directory)  # a link below the root: resolve all
        except OSError:
            break  # not there (yet): nothing below it is a link either
    return directory


# ---- the place an address points at, for fs:ImportFromStorage -------------------------------


def place(kind: str, where: str) -> str:
    """The one spelling of a place (outside_namespace's kind and where) a policy's
    `arn:quarry:fs:::storage/<place>` names: a local file by its real path (`/data/x`, links
    and every file-URL notation resolved), an S3 object as `s3://bucket/key` (s3a, s3n and
    the scheme's letter case folded). Matching the text as written let `file:/x`,
    `FILE:///x`, `%70rivate` or a link walk past a Deny on the place."""
    return where if kind == "local" else f"s3://{where}"


def place_of_source(uri: str) -> str:
    """place() of an import source (a directory or an S3 prefix); the text as given when it
    is not one (StartImport refuses it)."""
    try:
        source = parse_source(uri)
        if source.kind == "local":
            return os.path.realpath(source.root)
    except (errors.QuarryError, OSError):
        return uri
    return source.location
