"""Listing an import's source in key order (docs/import.md): a local directory
(`/abs/dir`, `file:///abs/dir`) or `s3://bucket/prefix`.

The listing is streamed, never held whole: S3's list_objects_v2 returns keys sorted by
their UTF-8 bytes already; a local directory is walked depth first with each directory's
names sorted as the keys they start (a subdirectory `d` as `d/`), which is the same order
(Python compares str by code point, and UTF-8 preserves code point order). `os.walk` order
is not key order: `a-b` sorts before `a/x`, though the walk visits `a/` first.

What an object records (nothing is read or hashed: hashing a million files is the copy the
import exists to avoid; action files alone are, see with_action_file_checksums):
  * S3: its address `s3://bucket/key`, size, ETag (quotes dropped) as the checksum, and its
    LastModified time.
  * A local file: its absolute path as the address, size and mtime; no checksum (reads
    check the size only, see quarry.blob.copy_object).

Left out, and counted as skipped: keys whose address would not read back as the same object
(`a//b`, `.` or `..` segments, also percent-encoded, control characters, `?`/`#` in an S3
key), Quarry's own temporary files, and symbolic links (a link could lead anywhere, a
repository's namespace included; the import never follows one).

A source that changes while it is listed (docs/import.md): a directory is read one
directory at a time in key order, S3 one page at a time. An object added where the listing
has not read yet is imported, one added where it has read is not; an object removed before
its directory (page) was read is not imported, one removed after it was listed is (its entry
then points at nothing). Each object is recorded with the size and time seen then; a later
change of its bytes is caught on read as a size mismatch (or by its S3 ETag).
"""

from __future__ import annotations

import hashlib
import os
import stat as stat_module
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from quarry.blob.base import InvalidStorageNamespace
from quarry.blob.layout import bad_segment
from quarry.blob.local import TEMP_PREFIX
from quarry.blob.namespace import CONTROL_CHARACTERS, parse_storage_namespace

if TYPE_CHECKING:
    from quarry.config import Settings


class SourceObject(NamedTuple):
    """One listed object (a tuple: made once per object, the cheapest immutable record)."""

    key: str  # relative to the source's root, "/"-separated
    address: str
    size: int
    checksum: str
    mtime_us: int


@dataclass(frozen=True)
class Source:
    """A parsed source: `kind` "local" (root = /abs/dir) or "s3" (root = bucket, prefix)."""

    uri: str
    kind: str
    root: str
    prefix: str

    @property
    def location(self) -> str:
        """The normalized form: /abs/dir or s3://bucket/prefix."""
        if self.kind == "local":
            return self.root
        return f"s3://{self.root}/{self.prefix}".rstrip("/")


def parse_source(uri: str) -> Source:
    """InvalidStorageNamespace for anything that is not /abs/dir, file:///abs/dir or
    s3://bucket[/prefix] (a bucket root is allowed: unlike a repository, an import reads)."""
    kind, where, prefix = parse_storage_namespace(uri)
    return Source(uri, kind, where, prefix)


def _addressable(key: str) -> bool:
    """Whether an object's address ending in `key` reads back as that object: no control
    character, no empty, `.` or `..` segment — also once percent-decoded, as every reader
    checks an address (quarry.blob.layout.check_physical_address)."""
    if not key or CONTROL_CHARACTERS.search(key):
        return False
    if not all(part not in ("", ".", "..") for part in key.split("/")):
        return False
    return "%" not in key or bad_segment(key) is None


def _addressable_name(name: str) -> bool:
    """_addressable for one name a directory listing returned (never "", "." or ".." and
    without "/"): the walk checks each name once, not each key's whole path again."""
    if CONTROL_CHARACTERS.search(name) is not None:
        return False
    return "%" not in name or bad_segment(name) is None


class Subdirectory(NamedTuple):
    """A directory met by read_directory, to be read in its turn."""

    path: str
    key: str  # its key prefix, ending in "/"
    addressable: bool  # whether every directory name on the way, its own included, is


def read_directory(
    directory: str, rel: str, addressable: bool = True
) -> tuple[list[SourceObject | Subdirectory], int]:
    """One directory of a local source, in key order: its files as SourceObjects and its
    subdirectories as Subdirectory, and how many of its names were left out (see the
    module's docstring). `rel` is its key prefix ("" or ending in "/"); `addressable`:
    whether every directory name on the way here was (a key under one that is not is
    skipped, as a whole key would be). One stat per regular file (its size and mtime; the
    kinds come from the directory entries), none per directory. The sequential Listing
    and the import's listing processes (quarry.blob.chunks) read directories only this way."""
    try:
        with os.scandir(directory) as scan:
            found = list(scan)
    except FileNotFoundError:
        return [], 0  # removed while listed: its keys were not there when the walk got here
    skipped = 0
    named: list[tuple[str, os.DirEntry[str]]] = []
    for item in found:
        if item.is_symlink():
            skipped += 1
            continue
        try:
            is_dir = item.is_dir(follow_symlinks=False)
        except OSError:
            continue
        named.append((item.name + "/" if is_dir else item.name, item))
    named.sort(key=lambda pair: pair[0])
    items: list[SourceObject | Subdirectory] = []
    for name, item in named:
        key = rel + name
        if name[-1] == "/":
            items.append(Subdirectory(item.path, key, addressable and _addressable_name(item.name)))
            continue
        if not addressable or name.startswith(TEMP_PREFIX) or not _addressable_name(name):
            skipped += 1
            continue
        try:
            info = item.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed while listed
        if not stat_module.S_ISREG(info.st_mode):
            skipped += 1  # a socket, a FIFO, a device: not an object
            continue
        items.append(SourceObject(key, item.path, info.st_size, "", info.st_mtime_ns // 1000))
    return items, skipped


def with_action_file_checksums(
    objects: list[SourceObject], prefix: str, settings: Any = None
) -> list[SourceObject]:
    """`objects` (to be imported under the destination `prefix`) with each one that lands
    on an action file's path (quarry.actions.files) read, and recorded with the size and
    SHA-256 of the bytes read. Safety rule: the hooks gating a branch are the files as
    imported — an in-place edit of the source, even of the same size, is then refused when
    they are read (quarry.actions.runs.Actions.read_action_file), never run. Action files
    are few and small: the rest of the listing is not read. A file over the action-file
    limit, or one that cannot be read now, is left as listed (it fails when read)."""
    from quarry.actions.files import MAX_ACTION_FILE_BYTES, PREFIXES, is_action_path

    inside = prefix.startswith(PREFIXES)  # the destination is an action directory itself
    starts = tuple(d[len(prefix) :] for d in PREFIXES if d.startswith(prefix))
    if not inside and not starts:
        return objects  # e.g. an import into tables/: no key can land on an action file
    out = []
    for obj in objects:
        if (inside or obj.key.startswith(starts)) and is_action_path(prefix + obj.key):
            data = _read_at_most(obj.address, MAX_ACTION_FILE_BYTES + 1, settings)
            if data is not None and len(data) <= MAX_ACTION_FILE_BYTES:
                obj = obj._replace(size=len(data), checksum=hashlib.sha256(data).hexdigest())
        out.append(obj)
    return out


def _read_at_most(address: str, limit: int, settings: Any) -> bytes | None:
    from quarry import errors
    from quarry.blob import open_object

    try:
        with open_object(address, settings) as reader:
            return bytes(reader.read(limit))
    except (OSError, errors.QuarryError):
        return None


class Listing:
    """Iterate it for the source's objects in key order; `skipped` counts what was left out."""

    def __init__(self, source: Source, settings: Settings | None = None) -> None:
        self.source = source
        self.settings = settings
        self.skipped = 0

    def __iter__(self) -> Iterator[SourceObject]:
        if self.source.kind == "local":
            return self._local()
        return self._s3()

    def check(self) -> None:
        """Raise now what reading the source would raise at its start, so a caller hears it
        at once: InvalidStorageNamespace when a local source is not a directory; for S3,
        what a first listing request answers (one request: STORAGE_UNREACHABLE naming the
        cause, e.g. no credentials or no such bucket)."""
        if self.source.kind == "local":
            self.local_root()
            return
        from botocore.exceptions import BotoCoreError, ClientError

        from quarry.blob.s3 import _unavailable

        prefix = self.source.prefix + "/" if self.source.prefix else ""
        try:
            self._client().list_objects_v2(Bucket=self.source.root, Prefix=prefix, MaxKeys=1)
        except (ClientError, BotoCoreError) as exc:
            raise _unavailable(exc, location=self.source.location) from exc

    def _client(self) -> Any:
        from quarry.blob.s3 import shared_client

        endpoint = getattr(self.settings, "s3_endpoint_url", "") or None
        region = getattr(self.settings, "s3_region", "") or "us-east-1"
        return shared_client(endpoint, region)

    # ---- local directories ------------------------------------------------------------

    def local_root(self) -> str:
        """A local source's directory (InvalidStorageNamespace if it is not one)."""
        root = self.source.root
        if not os.path.isdir(root):
            raise InvalidStorageNamespace(f"import source {self.source.uri!r} is not a directory")
        return root

    def _local(self) -> Iterator[SourceObject]:
        yield from self._walk(self.local_root(), "")

    def _walk(self, directory: str, rel: str, addressable: bool = True) -> Iterator[SourceObject]:
        """Depth first, each directory read (read_directory) when the walk reaches it."""
        items, skipped = read_directory(directory, rel, addressable)
        self.skipped += skipped
        for item in items:
            if type(item) is Subdirectory:
                yield from self._walk(item.path, item.key, item.addressable)
            else:
                yield item  # type: ignore[misc]

    # ---- S3 ---------------------------------------------------------------------------

    def _s3(self) -> Iterator[SourceObject]:
        from botocore.exceptions import BotoCoreError, ClientError

        from quarry.blob.s3 import _unavailable

        client = self._client()
        bucket = self.source.root
        prefix = self.source.prefix + "/" if self.source.prefix else ""
        paginator = client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
                for item in page.get("Contents", ()):
                    full = item["Key"]
                    key = full[len(prefix) :]
                    if "?" in full or "#" in full or not _addressable(key):
                        self.skipped += 1
                        continue
                    yield SourceObject(
                        key,
                        f"s3://{bucket}/{full}",
                        int(item["Size"]),
                        str(item.get("ETag", "")).strip('"'),
                        int(item["LastModified"].timestamp() * 1_000_000),
                    )
        except (ClientError, BotoCoreError) as exc:
            raise _unavailable(exc, location=self.source.location) from exc


__all__ = ["Listing", "Source", "SourceObject", "Subdirectory", "parse_source", "read_directory"]
