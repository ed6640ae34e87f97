"""`quarry put --from`: copy local files into a repository's storage namespace and build the
entries that stage them.

Each file is written once, under `data/<uuid>` in the namespace (never overwritten: a new
key per upload, so a re-upload never changes bytes a committed entry points to), streamed
in pieces (BlobStore.put_stream: a file of any size, never held in memory). Its entry
carries the SHA-256 and size of the bytes as they were written, the file's mtime and a
guessed content type. Bytes uploaded for entries that are then not staged (staging failed,
or the file changed while it was read) stay in the namespace, unreferenced.
"""

from __future__ import annotations

import mimetypes
import os
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

from quarry.blob import BlobStore, object_address
from quarry.blob.layout import DATA_PREFIX as DATA_PREFIX
from quarry.blob.layout import UPLOAD_KEY as UPLOAD_KEY
from quarry.blob.layout import new_upload_key
from quarry.cli.base import CliError
from quarry.client import make_entry
from quarry.v1 import types_pb2

# upload_one writes `data/<uuid4 hex>` (quarry.blob.layout.new_upload_key): the shape GC
# recognizes as upload data Quarry wrote (UPLOAD_KEY, quarry.blob.layout.classify).
UPLOAD_WORKERS = 8


@dataclass(frozen=True)
class Planned:
    local: Path
    path: str  # the object path in the repository


def plan(source: Path, dest: str, skipped: list[str] | None = None) -> list[Planned]:
    """What to upload where. A file goes to `dest` itself, or to `dest<name>` when `dest`
    is empty or ends with '/'. A directory's files go under `dest/` keeping their relative
    paths (`dest` empty: at the root); what in it is not a regular file (a broken link, a
    pipe, a socket) is not uploaded and, with `skipped`, named there with why."""
    if source.is_dir():
        base = dest.strip("/")
        base = base + "/" if base else ""
        found = []
        for dirpath, dirnames, filenames in os.walk(source):
            dirnames.sort()
            for name in sorted(filenames):
                local = Path(dirpath) / name
                if not local.is_file():
                    if skipped is not None:
                        why = "a broken link" if local.is_symlink() else "not a regular file"
                        skipped.append(f"{local.relative_to(source).as_posix()} ({why})")
                    continue
                rel = local.relative_to(source).as_posix()
                found.append(Planned(local, base + rel))
        found.sort(key=lambda p: p.path)
        return found
    if not source.exists():
        raise FileNotFoundError(2, "No such file or directory", str(source))
    if not source.is_file():
        raise IsADirectoryError(21, "Not a regular file", str(source))
    if not dest or dest.endswith("/"):
        return [Planned(source, dest.lstrip("/") + source.name)]
    return [Planned(source, dest)]


def upload_one(
    store: BlobStore,
    storage_namespace: str,
    item: Planned,
    content_type: str = "",
    metadata: Mapping[str, str] | None = None,
) -> types_pb2.Entry:
    """Stream the file into a new key and build its entry from what was written.

    Safety: never return an entry whose bytes differ from what it records. Size and
    SHA-256 come from the stream itself (never a separate read of the file), and a file
    that changed while it was read (its size or mtime on the open file differ after the
    upload from before, or the bytes read are not its size) is refused with
    LOCAL_FILE_CHANGED: its upload is left unreferenced and no entry is made for it."""
    key = new_upload_key()
    with open(item.local, "rb") as source:
        before = os.fstat(source.fileno())
        written = store.put_stream(key, source)
        after = os.fstat(source.fileno())
    if (before.st_size, before.st_mtime_ns) != (
        after.st_size,
        after.st_mtime_ns,
    ) or written.size != after.st_size:
        raise CliError(
            "LOCAL_FILE_CHANGED",
            f"{item.local} changed while it was uploaded ({before.st_size} bytes before, "
            f"{after.st_size} after, {written.size} read): nothing staged for it; retry "
            "once it is no longer being written",
            code="ABORTED",
        )
    guessed = content_type or mimetypes.guess_type(item.local.name)[0] or "application/octet-stream"
    return make_entry(
        item.path,
        physical_address=object_address(storage_namespace, key),
        size_bytes=written.size,
        checksum=written.sha256,
        mtime=after.st_mtime,
        content_type=guessed,
        metadata=metadata,
    )


def upload_all(
    store: BlobStore,
    storage_namespace: str,
    items: list[Planned],
    content_type: str = "",
    metadata: Mapping[str, str] | None = None,
    on_done: Callable[[types_pb2.Entry], None] | None = None,
) -> Iterator[types_pb2.Entry]:
    """Upload in parallel (UPLOAD_WORKERS at most); yields entries in `items` order."""
    if len(items) == 1:
        entry = upload_one(store, storage_namespace, items[0], content_type, metadata)
        if on_done:
            on_done(entry)
        yield entry
        return
    with futures.ThreadPoolExecutor(max_workers=max(1, min(UPLOAD_WORKERS, len(items)))) as pool:
        pending = [
            pool.submit(upload_one, store, storage_namespace, item, content_type, metadata)
            for item in items
        ]
        try:
            for future in pending:
                entry = future.result()
                if on_done:
                    on_done(entry)
                yield entry
        finally:
            for future in pending:
                future.cancel()


# Answers that mean the server refused the staging call and staged nothing: the uploaded
# bytes are nobody's. Any other failure (UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, ...)
# may have staged them: they stay, and GC removes them if no entry names them.
REFUSALS = frozenset(
    {
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
        "FAILED_PRECONDITION",
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "OUT_OF_RANGE",
    }
)


def remove_refused(
    store: BlobStore,
    storage_namespace: str,
    entries: list[types_pb2.Entry],
    refusal: str,
    staged: Collection[str] = (),
) -> int:
    """Delete the bytes this command uploaded for `entries` after the server refused to
    stage them (a Viewer's denied put left 2,001 files in the lake). Safety rule: only
    after a refusal (REFUSALS), only keys of the upload shape (`data/<uuid hex>`, new keys
    this command chose) inside the namespace, and never an address in `staged` (what the
    branch names after the refusal: a stream refused after some of its batches were
    staged): never an object anyone else wrote or an entry names, and never one a failure
    with an unknown outcome may have staged. Returns the count."""
    if refusal not in REFUSALS:
        return 0
    root = storage_namespace.rstrip("/") + "/"
    removed = 0
    for entry in entries:
        key = entry.physical_address[len(root) :]
        if entry.physical_address in staged:
            continue
        if entry.physical_address.startswith(root) and UPLOAD_KEY.fullmatch(key):
            store.delete(key)
            removed += 1
    return removed
