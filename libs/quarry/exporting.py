"""`quarry store export` / `quarry store import`: rebuild a KV store across storage format versions.

The export file is JSON lines, one object per line, keys and values base64:

    {"quarry_export": 1, "format_version": "1", "created": "...", "quarry_version": "..."}
    {"type": "item", "partition": <quarry>, "key": <installation-id>, "value": ...}
    {"type": "repository", "name": "demo", "value": <RepositoryRecord>}
    {"type": "item", "partition": <repo/demo/<instance>>, "key": ..., "value": ...}
    {"type": "item", "partition": <staging/<token>>, "key": ..., "value": ...}
    ...
    {"type": "end", "repositories": N, "items": M}

First the installation's identity (`quarry` partition: `installation-id` and the
`deleted-instances/<instance>` records), so storage namespaces of deleted repositories stay
reusable after a rebuild (the ownership markers in them name this installation), and its
users, credentials, groups and policies (the `auth` partition, as stored: password hashes,
and S3 secrets sealed under the signing key, which the target installation must share for
them to verify; the file is written private). Import writes those only into a store that
has no identities of its own, and says how many it left out otherwise. Then, for
every repository: its RepositoryRecord (`quarry` partition, `repos/<name>`), every key
of its repo partition (branches/, tags/, commits/, mergehints/) and every staging partition
its branches reference (the staging token and the sealed tokens), so uncommitted changes
survive. The closing `end` line lets import detect a truncated file.

Ranges and metaranges are NOT exported: they are immutable objects in each repository's
storage namespace (local directory or S3), referenced by id from commits and branches. Nor
is the `cleanup` queue (partitions already retired).

Export reads the backend directly and does NOT check the store's format version (that is
the point: it runs against a store this build would refuse to serve, e.g. one of storage
format 1). Run it with the services stopped, or the export may catch a branch between two
writes.

Import needs a store without repositories, writes the repo and staging partitions first and
the repository records last (only after the whole file was read and found complete, so a
failed import leaves no visible repository and can simply be re-run), then stamps this
build's FORMAT_VERSION.

Import also REBUILDS committed data written in an earlier storage format
(quarry.committed.legacy): every metarange a commit (`metarange_id`) or a branch
(`compacted_metarange_id`) refers to is read from the repository's namespace; one of an
earlier format is rewritten — its ranges with this build's identities, so with new range
ids, and itself with the same bounds and the new range ids, so with a new id — and the
record is imported with the new id. Each distinct range and metarange is converted once.
Commit ids are kept: they name the history users refer to (logs, tags, scripts), and
nothing re-derives a commit id from its content after the commit was made; so after a
rebuild a commit id no longer hashes its (new) metarange id, while range and metarange ids
are recomputed. Merge hints (`mergehints/<metarange id>`) of a rebuilt repository name old
metarange ids and are dropped (a merge without a hint merges from scratch). Staged values
(StagedValue) hold entries without identities and are copied as they are. The old files
stay in the namespaces, untouched, for the old build; nothing refers to them in the
imported store, and GC collects them like any other unreferenced range or metarange.
Whether a file needs rewriting is decided by its own format tag, not by the export header.
A rebuilt repository's namespace also gets the ownership marker earlier formats did not
write (`_quarry/repository.json`, never overwriting one), before the repository becomes
visible, so GC and namespace checks treat it as owned.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO, TypeVar

from google.protobuf.message import Message

import quarry
from quarry import FORMAT_VERSION, errors
from quarry.blob import BlobStore
from quarry.graveler import layout, records
from quarry.graveler.layout import (
    BRANCHES_PREFIX,
    COMMITS_PREFIX,
    DELETED_INSTANCES_PREFIX,
    INSTALLATION_ID_KEY,
    MERGE_HINTS_PREFIX,
    QUARRY_PARTITION,
    REPOS_PREFIX,
    prefix_end,
    staging_partitions,
)
from quarry.graveler.refs import Repository
from quarry.kv import store as kv
from quarry.kv.partitions import AUTH_PARTITION, REPO, STAGING, partition_class
from quarry.runtime import format_version
from quarry.v1 import types_pb2

if TYPE_CHECKING:
    from quarry.committed.legacy import CommittedRewriter

M = TypeVar("M", bound=Message)

EXPORT_VERSION = 1
BATCH_SIZE = 100
PROGRESS_EVERY = 10_000

Progress = Callable[[int], None]


class CorruptExport(errors.InvalidArgument):
    reason = "CORRUPT_EXPORT"


def _newer(found_format: object) -> bool:
    try:
        return int(str(found_format)) > FORMAT_VERSION
    except ValueError:
        return False  # no or an unreadable stamp: an old export, rebuilt


class StoreNotEmpty(errors.FailedPrecondition):
    reason = "STORE_NOT_EMPTY"


@dataclass(frozen=True)
class Summary:
    repositories: int
    items: int
    format_version: str | None
    # Import only: committed data rewritten in this build's format, merge hints dropped.
    ranges_rewritten: int = 0
    metaranges_rewritten: int = 0
    merge_hints_dropped: int = 0
    # Import only: identity records (users, credentials, groups, policies) not imported
    # because the target store has identities of its own.
    identities_skipped: int = 0
    # Export only: records that could not be read, and what of them is not in the file.
    unreadable: list[str] = field(default_factory=list)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _line(obj: dict) -> str:
    return json.dumps(obj, separators=(",", ":")) + "\n"


def read_format_stamp(store: kv.Store) -> str | None:
    try:
        return store.get(QUARRY_PARTITION, layout.FORMAT_VERSION_KEY).value.decode(errors="replace")
    except kv.KeyNotFound:
        return None


def _repositories(store: kv.Store) -> Iterator[tuple[str, bytes]]:
    for item in store.scan(QUARRY_PARTITION, REPOS_PREFIX, prefix_end(REPOS_PREFIX)):
        yield layout.name_of(item.key, REPOS_PREFIX), item.value


def _is_installation_key(key: bytes) -> bool:
    return key == INSTALLATION_ID_KEY or key.startswith(DELETED_INSTANCES_PREFIX)


def _installation_items(store: kv.Store) -> Iterator[kv.KeyValue]:
    """The `quarry` partition items that carry the installation's identity across a rebuild."""
    try:  # noqa: SIM105 — a generator: the yield must stay inside the try
        yield kv.KeyValue(
            INSTALLATION_ID_KEY, store.get(QUARRY_PARTITION, INSTALLATION_ID_KEY).value
        )
    except kv.KeyNotFound:
        pass  # written by a build from before installation ids
    yield from store.scan(
        QUARRY_PARTITION, DELETED_INSTANCES_PREFIX, prefix_end(DELETED_INSTANCES_PREFIX)
    )


# ---- export -----------------------------------------------------------------------------


def export_store(store: kv.Store, out: TextIO, progress: Progress | None = None) -> Summary:
    """Write every repository of `store` to `out` (see the module docstring)."""
    stamp = read_format_stamp(store)
    created = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    out.write(
        _line(
            {
                "quarry_export": EXPORT_VERSION,
                "format_version": stamp,
                "created": created,
                "quarry_version": quarry.__version__,
            }
        )
    )
    repositories = items = 0
    installation = [(QUARRY_PARTITION, kv_item) for kv_item in _installation_items(store)]
    identities = [(AUTH_PARTITION, kv_item) for kv_item in store.scan(AUTH_PARTITION)]
    for partition, kv_item in installation + identities:
        out.write(
            _line(
                {
                    "type": "item",
                    "partition": _b64(partition),
                    "key": _b64(kv_item.key),
                    "value": _b64(kv_item.value),
                }
            )
        )
        items += 1

    def emit(partition: bytes) -> list[kv.KeyValue]:
        nonlocal items
        written = []
        for kv_item in store.scan(partition):
            out.write(
                _line(
                    {
                        "type": "item",
                        "partition": _b64(partition),
                        "key": _b64(kv_item.key),
                        "value": _b64(kv_item.value),
                    }
                )
            )
            items += 1
            if progress and items % PROGRESS_EVERY == 0:
                progress(items)
            if kv_item.key.startswith(BRANCHES_PREFIX):
                written.append(kv_item)
        return written

    # A damaged record fails only what needs it (README: Corrupt records): the rest of the
    # store is exported, and what the damage keeps out is reported (the CLI exits 1).
    unreadable: list[str] = []
    for name, record in _repositories(store):
        try:
            repo = Repository.from_record(record, layout.repository_key(name))
        except records.CorruptRecord as exc:
            unreadable.append(
                f"repository record {name!r} ({QUARRY_PARTITION.decode()}/"
                f"{layout.repository_key(name).decode()}) cannot be read ({exc}): the "
                "repository is not in the export"
            )
            continue
        out.write(_line({"type": "repository", "name": name, "value": _b64(record)}))
        repositories += 1
        tokens: dict[str, None] = {}
        for branch_item in emit(repo.partition):
            try:
                branch = layout.decode(
                    types_pb2.Branch, repo.partition, branch_item.key, branch_item.value
                )
            except records.CorruptRecord as exc:
                unreadable.append(
                    f"repository {name!r}: branch record {records.show(repo.partition)}/"
                    f"{branch_item.key.decode(errors='backslashreplace')} cannot be read "
                    f"({exc}): it is exported as it is, its staged changes are not"
                )
                continue
            for token in (branch.staging_token, *branch.sealed_tokens):
                if token:
                    tokens.setdefault(token, None)
        for token in tokens:
            for partition in staging_partitions(token):
                emit(partition)
    out.write(_line({"type": "end", "repositories": repositories, "items": items}))
    return Summary(repositories, items, stamp, unreadable=unreadable)


# ---- import -----------------------------------------------------------------------------


def _decode(obj: dict, field: str, where: str) -> bytes:
    value = obj.get(field)
    if not isinstance(value, str):
        raise CorruptExport(f"{where}: field {field!r} is missing")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise CorruptExport(f"{where}: field {field!r} is not base64") from None


def _records(lines: TextIO) -> Iterator[tuple[int, dict]]:
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except ValueError:
            raise CorruptExport(f"line {number} is not JSON") from None
        if not isinstance(obj, dict):
            raise CorruptExport(f"line {number} is not a JSON object")
        yield number, obj


def check_importable(store: kv.Store) -> None:
    """Refuse a store that already holds a repository or another format version."""
    for name, _ in _repositories(store):
        raise StoreNotEmpty(
            f"the target KV store already holds repository {name!r}; import needs an empty store"
        )
    stamp = read_format_stamp(store)
    if stamp is not None and stamp != str(FORMAT_VERSION):
        raise format_version.FormatVersionMismatch(
            f"the target KV store is stamped with storage format version {stamp!r}, not "
            f"{FORMAT_VERSION}; import needs an empty store"
        )


def import_store(
    store: kv.Store,
    lines: TextIO,
    progress: Progress | None = None,
    open_namespace: Callable[[str], BlobStore] | None = None,
) -> Summary:
    """Write an export file into an empty `store`, rebuilding committed data of an earlier
    storage format in the repositories' namespaces (opened with `open_namespace`, default
    quarry.blob.open_blob_store), and stamp this build's format version."""
    rebuilders: dict[bytes, _Rebuilder] = {}  # repo partition -> its records' rebuilder
    try:
        return _import(store, lines, progress, open_namespace, rebuilders)
    finally:
        for rebuilder in rebuilders.values():
            rebuilder.close()


def _import(
    store: kv.Store,
    lines: TextIO,
    progress: Progress | None,
    open_namespace: Callable[[str], BlobStore] | None,
    rebuilders: dict[bytes, _Rebuilder],
) -> Summary:
    check_importable(store)
    numbered = _records(lines)  # not `records`: that is the records module (CorruptRecord)
    found_format = _header(numbered).get("format_version")
    # An export of a store stamped with this build's version holds no older committed data:
    # its records are imported as they are, without reading the namespaces. Any other
    # (an older stamp, or none) has every referenced metarange checked by its format tag.
    rebuild = found_format != str(FORMAT_VERSION)
    if _newer(found_format):
        raise format_version.FormatVersionMismatch(
            f"the export was made from storage format {found_format}, newer than this "
            f"build's {FORMAT_VERSION}: import it with the build that wrote it (a store is "
            "never taken back to an older format)",
            metadata={"found": str(found_format), "expected": str(FORMAT_VERSION)},
        )

    repositories: dict[str, bytes] = {}
    batch: list[tuple[bytes, bytes, bytes]] = []
    items = 0
    # Users, credentials, groups and policies come along only into a store without any of
    # its own (an admin made by `quarry setup` or the chart's bootstrap stays the only one:
    # never two identity sets merged, never one overwritten).
    keep_identities = not kv.has_items(store, AUTH_PARTITION)
    identities_skipped = 0
    end: dict | None = None
    for number, obj in numbered:
        where = f"line {number}"
        if end is not None:
            raise CorruptExport(f"{where}: data after the end line")
        kind = obj.get("type")
        if kind == "repository":
            name, value, repo = _repository_line(obj, where, repositories)
            repositories[name] = value
            rebuilders[repo.partition] = _Rebuilder(repo, open_namespace, rebuild)
        elif kind == "item":
            partition, key, kept = _item_line(obj, where, rebuilders)
            items += 1
            if partition == AUTH_PARTITION and not keep_identities:
                kept = None
                identities_skipped += 1
            if kept is not None:
                batch.append((partition, key, kept))
            if len(batch) >= BATCH_SIZE:
                store.batch_set(batch)
                batch = []
            if progress and items % PROGRESS_EVERY == 0:
                progress(items)
        elif kind == "end":
            end = obj
        else:
            raise CorruptExport(f"{where}: unknown record type {kind!r}")
    _check_end(end, len(repositories), items)
    for rebuilder in rebuilders.values():
        batch.extend(rebuilder.merge_hints_to_keep())
    if batch:
        store.batch_set(batch)
    if rebuild:
        installation_id = format_version.ensure_installation_id(store)
        for rebuilder in rebuilders.values():
            rebuilder.write_ownership_marker(installation_id)
    # Repository records last: until here no imported repository is visible.
    for name, value in repositories.items():
        try:
            store.set_if(QUARRY_PARTITION, layout.repository_key(name), value, kv.ABSENT)
        except kv.PredicateFailed:
            raise StoreNotEmpty(
                f"repository {name!r} appeared in the target store during the import"
            ) from None
    _stamp(store)
    stats = [r.rewriter.stats for r in rebuilders.values() if r.rewriter is not None]
    return Summary(
        len(repositories),
        items,
        None if found_format is None else str(found_format),
        ranges_rewritten=sum(s.ranges_rewritten for s in stats),
        metaranges_rewritten=sum(s.metaranges_rewritten for s in stats),
        merge_hints_dropped=sum(r.merge_hints_dropped for r in rebuilders.values()),
        identities_skipped=identities_skipped,
    )


def _header(numbered: Iterator[tuple[int, dict]]) -> dict:
    """The export's header line, checked."""
    try:
        _, header = next(numbered)
    except StopIteration:
        raise CorruptExport("the file is empty, not a quarry store export") from None
    if header.get("quarry_export") != EXPORT_VERSION:
        raise CorruptExport(
            f"not a quarry store export file of version {EXPORT_VERSION} "
            f"(header {json.dumps(header)[:80]})"
        )
    return header


def _repository_line(
    obj: dict, where: str, repositories: dict[str, bytes]
) -> tuple[str, bytes, Repository]:
    """A repository line: its name, record and repository (not one seen before)."""
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise CorruptExport(f"{where}: repository without a name")
    value = _decode(obj, "value", where)
    try:
        repo = Repository.from_record(value, layout.repository_key(name))
    except records.CorruptRecord:
        raise CorruptExport(f"{where}: repository record cannot be read") from None
    if repo.name != name or name in repositories:
        raise CorruptExport(f"{where}: repository {name!r} is inconsistent or duplicated")
    return name, value, repo


def _item_line(
    obj: dict, where: str, rebuilders: dict[bytes, _Rebuilder]
) -> tuple[bytes, bytes, bytes | None]:
    """An item line: (partition, key, the value to import; None: held back for now). Only
    staging, a repository seen before, or the installation's own keys."""
    partition = _decode(obj, "partition", where)
    key = _decode(obj, "key", where)
    value = _decode(obj, "value", where)
    try:
        cls = partition_class(partition)
    except errors.QuarryError:
        cls = None
    if not (
        cls == STAGING
        or (cls == REPO and partition in rebuilders)
        or (partition == QUARRY_PARTITION and _is_installation_key(key))
        or partition == AUTH_PARTITION
    ):
        raise CorruptExport(f"{where}: unexpected partition {partition[:80]!r}")
    # A repository's record as this build stores it.
    return partition, key, rebuilders[partition].item(key, value, where) if cls == REPO else value


def _check_end(end: dict | None, repositories: int, items: int) -> None:
    """The end line is there and counts what the file held (else it was cut or edited)."""
    if end is None:
        raise CorruptExport("the file has no end line (truncated?)")
    if end.get("repositories") != repositories or end.get("items") != items:
        raise CorruptExport(
            f"the end line announces {end.get('repositories')} repositories "
            f"and {end.get('items')} items, the file holds "
            f"{repositories} and {items}"
        )


class _Rebuilder:
    """One imported repository's records, converted to this build's storage format: the
    one place an import changes a record (see the module docstring). Today: metarange ids
    of an earlier format replaced by their rebuilt ones, stale merge hints dropped."""

    def __init__(
        self, repo: Repository, open_namespace: Callable[[str], BlobStore] | None, rebuild: bool
    ):
        self._repo = repo
        self._rebuild = rebuild
        self._open = open_namespace
        self._store: BlobStore | None = None
        self.rewriter: CommittedRewriter | None = None
        self._hints: list[tuple[bytes, bytes, bytes]] = []
        self.merge_hints_dropped = 0

    def _namespace_store(self) -> BlobStore:
        if self._store is None:
            from quarry.blob import open_blob_store

            self._store = (self._open or open_blob_store)(self._repo.storage_namespace)
        return self._store

    def _metarange(self, metarange_id: str) -> str:
        if self.rewriter is None:
            from quarry.committed.legacy import CommittedRewriter

            self.rewriter = CommittedRewriter(self._namespace_store(), self._repo.storage_namespace)
        return self.rewriter.metarange(metarange_id)

    def item(self, key: bytes, value: bytes, where: str) -> bytes | None:
        """The value to import for this repo-partition item (None: held back for now)."""
        if not self._rebuild:
            return value
        if key.startswith(MERGE_HINTS_PREFIX):
            self._hints.append((self._repo.partition, key, value))
            return None
        if key.startswith(COMMITS_PREFIX):
            record = _parse(types_pb2.Commit, self._repo.partition, key, value, where)
            new_id = self._metarange(record.metarange_id)
            if new_id != record.metarange_id:
                record.metarange_id = new_id
                value = layout.encode_commit(record)
        elif key.startswith(BRANCHES_PREFIX):
            branch = _parse(types_pb2.Branch, self._repo.partition, key, value, where)
            if branch.compacted_metarange_id:
                new_id = self._metarange(branch.compacted_metarange_id)
                if new_id != branch.compacted_metarange_id:
                    branch.compacted_metarange_id = new_id
                    value = layout.encode_branch(branch)
        return value

    def write_ownership_marker(self, installation_id: str) -> None:
        """The marker an earlier format did not write; one already there is left alone."""
        from quarry.blob.ownership import build_marker, write_marker

        write_marker(
            self._namespace_store(),
            build_marker(self._repo.name, self._repo.instance_id, installation_id),
        )

    def merge_hints_to_keep(self) -> list[tuple[bytes, bytes, bytes]]:
        """A hint names a merge result by metarange id: stale once the repository's
        committed data was rewritten (every id changed), so dropped, never translated."""
        if self.rewriter is not None and self.rewriter.rewrote_anything:
            self.merge_hints_dropped = len(self._hints)
            return []
        return self._hints

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


def _parse(message_type: type[M], partition: bytes, key: bytes, value: bytes, where: str) -> M:
    try:
        return layout.decode(message_type, partition, key, value)
    except records.CorruptRecord:
        shown = f"{records.show(partition)}/{key.decode(errors='backslashreplace')}"
        raise CorruptExport(
            f"{where}: {message_type.__name__} record {shown} cannot be read (a damaged "
            "record of the exported store: repair or remove it there, and export again)",
            metadata={"partition": records.show(partition), "key": key.decode(errors="replace")},
        ) from None


def _stamp(store: kv.Store) -> None:
    try:
        store.set_if(
            QUARRY_PARTITION, layout.FORMAT_VERSION_KEY, str(FORMAT_VERSION).encode(), kv.ABSENT
        )
    except kv.PredicateFailed:
        stamp = read_format_stamp(store)
        if stamp != str(FORMAT_VERSION):
            raise format_version.FormatVersionMismatch(
                f"the target KV store was stamped with storage format version {stamp!r} "
                f"during the import; this build writes {FORMAT_VERSION}"
            ) from None
