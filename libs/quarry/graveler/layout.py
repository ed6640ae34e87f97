"""The storage layout: every KV partition, key and stored-record codec (docs/architecture.md §2).

This module is the only place that knows how Quarry's state is laid out in the KV store
(in the manner of lakeFS's pkg/graveler/model.go). Everything else asks it for a key, a
prefix or a decoded record; nobody builds a key or parses a stored value by hand.

  quarry                   repos/<repo>              → RepositoryRecord
                           format-version            → ASCII int (runtime/format_version.py)
                           installation-id           → ASCII id
                           deleted-instances/<id>    → repository name
                           creating/<id>             → JSON {repository, namespace, started}
                           requests/<id>             → RequestRecord (graveler/requests.py)
  repo/<repo>/<instance>   branches/<b>              → Branch (the CAS point of a branch)
                           tags/<t>                  → Tag
                           commits/<id>              → Commit (immutable, content-addressed)
                           settings/gc_rules         → GarbageCollectionRules
                           settings/branch_protection → BranchProtectionRules
                           mergehints/<metarange>    → "source\\nbase\\nonto" (text)
                           imports/<id>              → JSON ImportRecord (graveler/imports.py)
                           requests/<id>             → RequestRecord
  staging/<token>          <path>                    → StagedValue (entry or tombstone)
  staging/<token>.<i>      <path>                    → the same, for a token with N > 1 shards
                                                       (`<base>.s<N>`): shard i = a stable
                                                       hash of the path mod N (kv/partitions.py)
  cleanup                  <partition>               → CleanupRecord
                           parked/<key>[@<unique>]   → a corrupt cleanup item, set aside

Records are stored as quarry.storage.v1 messages (protos/quarry/storage/v1/records.proto), with
the field numbers of the quarry.v1 messages they were first written as; see "record codecs".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, TypeVar, cast

from google.protobuf.message import DecodeError, Message

from quarry import errors
from quarry.convert import entry_to_proto
from quarry.graveler import records
from quarry.graveler.model import Entry
from quarry.kv.partitions import (
    AUTH_PARTITION,
    CLEANUP_PARTITION,
    MAX_STAGING_SHARDS,
    QUARRY_PARTITION,
    REPO,
    STAGING,
    partition_class,
    repo_partition,
    staging_partition,
    staging_partition_of,
    staging_partitions,
    staging_token_shards,
)
from quarry.kv.store import MAX_KEY_BYTES
from quarry.storage.v1 import records_pb2 as stored
from quarry.v1 import branch_manager_pb2, records_pb2, types_pb2

M = TypeVar("M", bound=Message)

# ---- partitions (their names and classes live in kv/partitions.py) ---------------------------

STAGING_PARTITION_PREFIX = b"staging/"

# ---- the `quarry` partition ---------------------------------------------------------------------

REPOS_PREFIX = b"repos/"
FORMAT_VERSION_KEY = b"format-version"
INSTALLATION_ID_KEY = b"installation-id"
# Instance ids of deleted repositories (value: the name): their namespaces may be reused.
DELETED_INSTANCES_PREFIX = b"deleted-instances/"
# Repositories being created (key: instance id; value: JSON name, namespace, time), so that
# two creations of overlapping namespaces see each other before either is visible.
CREATING_PREFIX = b"creating/"
# Idempotency records (graveler/requests.py), in the partition the request changes.
REQUESTS_PREFIX = b"requests/"

# ---- a repository instance's partition ----------------------------------------------------------

BRANCHES_PREFIX = b"branches/"
TAGS_PREFIX = b"tags/"
COMMITS_PREFIX = b"commits/"
GC_RULES_KEY = b"settings/gc_rules"
BRANCH_PROTECTION_KEY = b"settings/branch_protection"
MERGE_HINTS_PREFIX = b"mergehints/"
# An import's status record: a few writes per import, never one per object.
IMPORTS_PREFIX = b"imports/"

# ---- the `cleanup` partition ----------------------------------------------------------------------

# Corrupt items of the cleanup partition are moved under this key prefix (no partition name
# starts with it, so a parked key is never taken for a partition to drop).
PARKED_PREFIX = b"parked/"


# ---- what a record stored at a key must hold (garbage that protobuf parses is refused) ----


def _suffix(key: bytes, prefix: bytes) -> str | None:
    if not key.startswith(prefix):
        return None
    try:
        return key[len(prefix) :].decode()
    except UnicodeDecodeError:
        return None


def _check_repository(record: records_pb2.RepositoryRecord, key: bytes) -> str | None:
    name = _suffix(key, REPOS_PREFIX)
    if record.repository.name != name:
        return f"its name {record.repository.name!r} does not match its key"
    if not record.instance_id or "/" in record.instance_id:
        return "it has no valid instance id"
    if not record.repository.storage_namespace or not record.repository.default_branch:
        return "it has no storage namespace or default branch"
    if not 0 <= record.repository.staging_shards <= MAX_STAGING_SHARDS:
        return f"its staging_shards {record.repository.staging_shards} is out of range"
    return None


def _check_branch(branch: types_pb2.Branch, key: bytes) -> str | None:
    if branch.name != _suffix(key, BRANCHES_PREFIX):
        return f"its name {branch.name!r} does not match its key"
    if not branch.commit_id:
        return "it has no commit id"
    if not branch.staging_token or "/" in branch.staging_token:
        return "it has no valid staging token"
    return None


def _check_tag(tag: types_pb2.Tag, key: bytes) -> str | None:
    if tag.name != _suffix(key, TAGS_PREFIX):
        return f"its name {tag.name!r} does not match its key"
    if not tag.commit_id:
        return "it has no commit id"
    return None


def _check_commit(commit: types_pb2.Commit, key: bytes) -> str | None:
    # Commits are content-addressed: the id is the key, so garbage cannot match it.
    if commit.id != _suffix(key, COMMITS_PREFIX):
        return f"its id {commit.id[:80]!r} does not match its key"
    return None


def _check_staged_value(value: types_pb2.StagedValue, key: bytes) -> str | None:
    if value.WhichOneof("value") is None:
        return "it is neither an entry nor a tombstone"
    try:
        key.decode()
    except UnicodeDecodeError:
        return "its path is not UTF-8"
    return None


def _check_cleanup(record: records_pb2.CleanupRecord, key: bytes) -> str | None:
    # The dropper deletes the partition named by the key: it must be a staging or repo
    # partition, and the record must name the same one.
    if record.partition_key.encode() != key:
        return "it names another partition than its key"
    try:
        cls = partition_class(bytes(key))
    except errors.QuarryError:
        return "its key is not a partition name"
    if cls not in (STAGING, REPO):
        return f"its key names a {cls} partition, which is never dropped"
    if record.queued_at <= 0:
        return "it has no queue time"
    return None


def _check_branch_protection(record: stored.BranchProtectionRules, key: bytes) -> str | None:
    for rule in record.rules:
        if not rule.pattern or not (rule.block_staging_write or rule.block_commit):
            return f"its rule {rule.pattern!r} has no pattern or blocks nothing"
    return None


RECORD_CHECKS: dict[type, Callable[[Any, bytes], str | None]] = {
    records_pb2.RepositoryRecord: _check_repository,
    types_pb2.Branch: _check_branch,
    types_pb2.Tag: _check_tag,
    types_pb2.Commit: _check_commit,
    types_pb2.StagedValue: _check_staged_value,
    records_pb2.CleanupRecord: _check_cleanup,
    # The stored messages (quarry.graveler.layout decodes through these).
    stored.RepositoryRecord: _check_repository,
    stored.Branch: _check_branch,
    stored.Tag: _check_tag,
    stored.Commit: _check_commit,
    stored.StagedValue: _check_staged_value,
    stored.CleanupRecord: _check_cleanup,
    stored.BranchProtectionRules: _check_branch_protection,
}


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with `prefix` (None: no bound)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def scan_start(prefix: bytes, after: str) -> bytes:
    """Where a scan of `prefix` + name resumes after the name `after` ("" = from the start)."""
    return prefix + (after.encode() + b"\x00" if after else b"")


def name_of(key: bytes, prefix: bytes) -> str:
    """The name a key under `prefix` stands for."""
    return key[len(prefix) :].decode()


# ---- key builders --------------------------------------------------------------------------------


def repository_key(name: str) -> bytes:
    return REPOS_PREFIX + name.encode()


def deleted_instance_key(instance_id: str) -> bytes:
    return DELETED_INSTANCES_PREFIX + instance_id.encode()


def creation_key(instance_id: str) -> bytes:
    return CREATING_PREFIX + instance_id.encode()


def request_key(request_id: str) -> bytes:
    return REQUESTS_PREFIX + request_id.encode()


def branch_key(name: str) -> bytes:
    return BRANCHES_PREFIX + name.encode()


def tag_key(name: str) -> bytes:
    return TAGS_PREFIX + name.encode()


def commit_key(commit_id: str) -> bytes:
    return COMMITS_PREFIX + commit_id.encode()


def merge_hint_key(metarange_id: str) -> bytes:
    return MERGE_HINTS_PREFIX + metarange_id.encode()


def import_key(import_id: str) -> bytes:
    return IMPORTS_PREFIX + import_id.encode()


def staged_key(path: str) -> bytes:
    return path.encode()


def staging_token_of(partition: bytes) -> str | None:
    """The token of a staging partition name (of a shard partition: its sharded token), None
    for any other partition."""
    if not partition.startswith(STAGING_PARTITION_PREFIX):
        return None
    token = partition[len(STAGING_PARTITION_PREFIX) :].decode("utf-8", "backslashreplace")
    base, dot, shard = token.rpartition(".")
    if dot and shard.isdigit() and staging_token_shards(base) > 1:
        return base
    return token


def staged_partition(token: str, path: str) -> bytes:
    """The partition of `token` holding the staged value of `path` (its shard's)."""
    return staging_partition_of(token, staged_key(path))


# ---- record codecs ---------------------------------------------------------------------------
#
# Records are stored as the messages of quarry.storage.v1 (protos/quarry/storage/v1), never as
# API messages. The core works with the API messages it also sends on the wire (Branch,
# Commit, Tag, GarbageCollectionRules) and with domain Entries; the converters below are the
# one place where the two meet. Field numbers are those of the quarry.v1 messages the records
# were first written as, so the stored bytes did not change (tests/unit/graveler/test_layout.py).


def _copy_time(source: Message, target: Message, name: str) -> None:
    if source.HasField(name):
        getattr(target, name).CopyFrom(getattr(source, name))


def branch_to_stored(branch: types_pb2.Branch) -> stored.Branch:
    out = stored.Branch(
        name=branch.name,
        commit_id=branch.commit_id,
        staging_token=branch.staging_token,
        sealed_tokens=list(branch.sealed_tokens),
        compacted_metarange_id=branch.compacted_metarange_id,
    )
    if branch.HasField("dirty"):
        out.dirty = branch.dirty
    _copy_time(branch, out, "compaction_start_time")
    return out


def branch_from_stored(record: stored.Branch) -> types_pb2.Branch:
    out = types_pb2.Branch(
        name=record.name,
        commit_id=record.commit_id,
        staging_token=record.staging_token,
        sealed_tokens=list(record.sealed_tokens),
        compacted_metarange_id=record.compacted_metarange_id,
    )
    if record.HasField("dirty"):
        out.dirty = record.dirty
    _copy_time(record, out, "compaction_start_time")
    return out


def commit_to_stored(commit: types_pb2.Commit) -> stored.Commit:
    out = stored.Commit(
        id=commit.id,
        parents=list(commit.parents),
        metarange_id=commit.metarange_id,
        message=commit.message,
        committer=commit.committer,
        metadata=dict(commit.metadata),
        generation=commit.generation,
    )
    _copy_time(commit, out, "creation_time")
    return out


def commit_from_stored(record: stored.Commit) -> types_pb2.Commit:
    out = types_pb2.Commit(
        id=record.id,
        parents=list(record.parents),
        metarange_id=record.metarange_id,
        message=record.message,
        committer=record.committer,
        metadata=dict(record.metadata),
        generation=record.generation,
    )
    _copy_time(record, out, "creation_time")
    return out


def tag_to_stored(tag: types_pb2.Tag) -> stored.Tag:
    return stored.Tag(name=tag.name, commit_id=tag.commit_id)


def tag_from_stored(record: stored.Tag) -> types_pb2.Tag:
    return types_pb2.Tag(name=record.name, commit_id=record.commit_id)


def gc_rules_to_stored(rules: types_pb2.GarbageCollectionRules) -> stored.GarbageCollectionRules:
    return stored.GarbageCollectionRules(
        default_retention_days=rules.default_retention_days,
        branch_retention_days=dict(rules.branch_retention_days),
    )


def gc_rules_from_stored(
    record: stored.GarbageCollectionRules,
) -> types_pb2.GarbageCollectionRules:
    return types_pb2.GarbageCollectionRules(
        default_retention_days=record.default_retention_days,
        branch_retention_days=dict(record.branch_retention_days),
    )


_STAGING_WRITE = branch_manager_pb2.BRANCH_PROTECTION_BLOCKED_ACTION_STAGING_WRITE
_COMMIT = branch_manager_pb2.BRANCH_PROTECTION_BLOCKED_ACTION_COMMIT


def branch_protection_to_stored(
    rules: list[branch_manager_pb2.BranchProtectionRule],
) -> stored.BranchProtectionRules:
    return stored.BranchProtectionRules(
        rules=[
            stored.BranchProtectionRule(
                pattern=rule.pattern,
                block_staging_write=_STAGING_WRITE in rule.blocked_actions,
                block_commit=_COMMIT in rule.blocked_actions,
            )
            for rule in rules
        ]
    )


def branch_protection_from_stored(
    record: stored.BranchProtectionRules,
) -> list[branch_manager_pb2.BranchProtectionRule]:
    out = []
    for rule in record.rules:
        actions = [_STAGING_WRITE] if rule.block_staging_write else []
        actions += [_COMMIT] if rule.block_commit else []
        out.append(
            branch_manager_pb2.BranchProtectionRule(pattern=rule.pattern, blocked_actions=actions)
        )
    return out


def encode_branch_protection(rules: list[branch_manager_pb2.BranchProtectionRule]) -> bytes:
    # Deterministic: the bytes are the checksum's input and the compare-and-swap predicate.
    return branch_protection_to_stored(rules).SerializeToString(deterministic=True)


def decode_branch_protection(
    partition: bytes, value: bytes
) -> list[branch_manager_pb2.BranchProtectionRule]:
    """The rules stored at `settings/branch_protection` (CorruptRecord if unreadable)."""
    record = records.decode_record(
        stored.BranchProtectionRules,
        partition,
        BRANCH_PROTECTION_KEY,
        value,
        RECORD_CHECKS[stored.BranchProtectionRules],
    )
    return branch_protection_from_stored(record)


def entry_to_stored(entry: Entry) -> stored.Entry:
    out = stored.Entry(
        path=entry.path,
        physical_address=entry.physical_address,
        size_bytes=entry.size_bytes,
        checksum=entry.checksum,
        content_type=entry.content_type,
    )
    if entry.metadata:
        out.metadata.update(entry.metadata)
    if entry.mtime_us:
        out.mtime.FromMicroseconds(entry.mtime_us)
    return out


def entry_from_stored(record: stored.Entry, path: str) -> Entry:
    mtime_us = record.mtime.ToMicroseconds() if record.HasField("mtime") else 0
    return Entry(
        path,
        record.physical_address,
        record.size_bytes,
        record.checksum,
        mtime_us,
        record.content_type,
        dict(record.metadata),
    )


def staged_value_from_stored(record: stored.StagedValue) -> types_pb2.StagedValue:
    if record.WhichOneof("value") == "entry":
        entry = entry_from_stored(record.entry, record.entry.path)
        return types_pb2.StagedValue(entry=entry_to_proto(entry))
    return types_pb2.StagedValue(tombstone=record.tombstone)


def repository_to_stored(repository: types_pb2.Repository) -> stored.Repository:
    out = stored.Repository(
        name=repository.name,
        storage_namespace=repository.storage_namespace,
        default_branch=repository.default_branch,
        instance_id=repository.instance_id,
        # One shard is stored as absent (0): a repository record without sharding keeps the
        # bytes it had before the field existed.
        staging_shards=repository.staging_shards if repository.staging_shards > 1 else 0,
    )
    _copy_time(repository, out, "creation_time")
    return out


# API message type → (stored message type, conversion of a decoded record to the API type).
_STORED: dict[type, tuple[type, Callable[[Any], Any]]] = {
    types_pb2.Branch: (stored.Branch, branch_from_stored),
    types_pb2.Commit: (stored.Commit, commit_from_stored),
    types_pb2.Tag: (stored.Tag, tag_from_stored),
    types_pb2.GarbageCollectionRules: (stored.GarbageCollectionRules, gc_rules_from_stored),
    types_pb2.StagedValue: (stored.StagedValue, staged_value_from_stored),
}


def decode(message_type: type[M], partition: bytes, key: bytes, value: bytes) -> M:
    """The record stored at partition/key as `message_type` (an API message: Branch, Commit,
    Tag, GarbageCollectionRules, StagedValue; or a quarry.storage.v1 message). CorruptRecord
    if unreadable or inconsistent with its key."""
    found = _STORED.get(message_type)
    if found is None:
        return records.decode_record(
            message_type, partition, key, value, RECORD_CHECKS.get(message_type)
        )
    stored_type, to_api = found
    return cast(
        M,
        to_api(
            records.decode_record(
                stored_type, partition, key, value, RECORD_CHECKS.get(stored_type)
            )
        ),
    )


def decode_or_skip(message_type: type[M], partition: bytes, key: bytes, value: bytes) -> M | None:
    """decode, but None (skipped and counted) for a corrupt record in a listing scope."""
    try:
        return decode(message_type, partition, key, value)
    except records.CorruptRecord as exc:
        records.skip(exc)
        return None


def encode_branch(branch: types_pb2.Branch) -> bytes:
    # Deterministic: the bytes are the compare-and-swap predicate of the next update.
    return branch_to_stored(branch).SerializeToString(deterministic=True)


def decode_branch(partition: bytes, name: str, value: bytes) -> types_pb2.Branch:
    return decode(types_pb2.Branch, partition, branch_key(name), value)


def encode_tag(tag: types_pb2.Tag) -> bytes:
    return tag_to_stored(tag).SerializeToString()


def encode_commit(commit: types_pb2.Commit) -> bytes:
    return commit_to_stored(commit).SerializeToString(deterministic=True)


def encode_gc_rules(rules: types_pb2.GarbageCollectionRules) -> bytes:
    return gc_rules_to_stored(rules).SerializeToString()


def encode_staged(entry: Entry | None) -> bytes:
    """A staged value: the entry, or a tombstone for None."""
    if entry is None:
        return stored.StagedValue(tombstone=True).SerializeToString()
    return stored.StagedValue(entry=entry_to_stored(entry)).SerializeToString(deterministic=True)


def decode_staged_value(partition: bytes, key: bytes, value: bytes) -> stored.StagedValue:
    """A staged value as stored (CorruptRecord if unreadable)."""
    return records.decode_record(
        stored.StagedValue, partition, key, value, RECORD_CHECKS[stored.StagedValue]
    )


def staged_or_skip(partition: bytes, key: bytes, value: bytes) -> stored.StagedValue | None:
    """decode_staged_value, but None (skipped and counted) in a listing scope."""
    return records.decode_or_skip(
        stored.StagedValue, partition, key, value, RECORD_CHECKS[stored.StagedValue]
    )


def staged_entry(path: str, value: stored.StagedValue) -> Entry | None:
    """The domain value of a decoded staged value (None: a tombstone)."""
    if value.WhichOneof("value") == "entry":
        return entry_from_stored(value.entry, path)
    return None


def is_staged_entry(value: stored.StagedValue) -> bool:
    """True for an entry, False for a tombstone."""
    return value.WhichOneof("value") == "entry"


def decode_staged(token: str, path: str, data: bytes) -> Entry | None:
    """The staged value of `path` under `token` (CorruptRecord if unreadable)."""
    value = decode_staged_value(staged_partition(token, path), staged_key(path), data)
    return staged_entry(path, value)


def encode_merge_hint(source: str, base: str, onto: str) -> bytes:
    return f"{source}\n{base}\n{onto}".encode()


def decode_merge_hint(data: bytes) -> tuple[str, str, str] | None:
    """(source, base, onto) of a merge hint; None for garbage (an unusable hint)."""
    parts = data.decode("utf-8", "replace").split("\n")
    if len(parts) != 3:
        return None
    return parts[0], parts[1], parts[2]


def encode_repository(repository: types_pb2.Repository, instance_id: str) -> bytes:
    return stored.RepositoryRecord(
        repository=repository_to_stored(repository), instance_id=instance_id
    ).SerializeToString()


def decode_repository(key: bytes, value: bytes) -> stored.RepositoryRecord:
    return records.decode_record(
        stored.RepositoryRecord,
        QUARRY_PARTITION,
        key,
        value,
        RECORD_CHECKS[stored.RepositoryRecord],
    )


def encode_deleted_instance(repository: str) -> bytes:
    return repository.encode()


def encode_creation(repository: str, storage_namespace: str, started: float) -> bytes:
    doc = {"repository": repository, "started": started, "storage_namespace": storage_namespace}
    return json.dumps(doc).encode()


def decode_creation(value: bytes) -> tuple[str, str, float] | None:
    """(repository, storage namespace, started) of a creation record; None if it is not one
    of ours (it cannot name a namespace)."""
    try:
        doc = json.loads(value)
        return str(doc["repository"]), str(doc["storage_namespace"]), float(doc["started"])
    except (ValueError, KeyError, TypeError):
        return None


def encode_request(record: stored.RequestRecord) -> bytes:
    # Deterministic: the bytes are the predicate of the claim's next update.
    return record.SerializeToString(deterministic=True)


def decode_request(value: bytes) -> stored.RequestRecord | None:
    """A request record; None if the bytes do not parse (kept for a person to look at)."""
    try:
        return stored.RequestRecord.FromString(value)
    except DecodeError:
        return None


def encode_cleanup(
    partition: bytes,
    queued_at: int,
    repository_partition: bytes = b"",
    branch: str = "",
    token: str = "",
) -> bytes:
    """A cleanup record; with `branch` (and its repository partition and the `token`), one
    queued before the branch change that retires the token (CleanupRecord)."""
    return stored.CleanupRecord(
        partition_key=partition.decode(),
        queued_at=queued_at,
        repository_partition=repository_partition.decode(),
        branch=branch,
        token=token,
    ).SerializeToString()


def decode_cleanup(key: bytes, value: bytes) -> stored.CleanupRecord:
    return records.decode_record(
        stored.CleanupRecord, CLEANUP_PARTITION, key, value, RECORD_CHECKS[stored.CleanupRecord]
    )


def parked_key(key: bytes, unique: str = "") -> bytes:
    """`parked/<key>[@unique]`; a key too long for that is replaced by its SHA-256."""
    suffix = b"@" + unique.encode() if unique else b""
    parked = PARKED_PREFIX + key + suffix
    if len(parked) > MAX_KEY_BYTES:
        digest = hashlib.sha256(key).hexdigest().encode()
        parked = PARKED_PREFIX + b"sha256:" + digest + suffix
    return parked


__all__ = [
    "AUTH_PARTITION",
    "BRANCHES_PREFIX",
    "CLEANUP_PARTITION",
    "COMMITS_PREFIX",
    "CREATING_PREFIX",
    "DELETED_INSTANCES_PREFIX",
    "FORMAT_VERSION_KEY",
    "GC_RULES_KEY",
    "INSTALLATION_ID_KEY",
    "MERGE_HINTS_PREFIX",
    "PARKED_PREFIX",
    "QUARRY_PARTITION",
    "REPOS_PREFIX",
    "REQUESTS_PREFIX",
    "TAGS_PREFIX",
    "branch_key",
    "commit_key",
    "decode",
    "prefix_end",
    "repo_partition",
    "repository_key",
    "staged_partition",
    "staging_partition",
    "staging_partition_of",
    "staging_partitions",
    "staging_token_shards",
    "tag_key",
]
