"""Namespace ownership (docs/architecture.md §2, "Storage namespaces are owned").

A repository's namespace holds `_quarry/repository.json`, the ownership marker: which
repository (name, instance id) of which installation (the KV store's installation id)
owns it, in which storage format, since when. Creation writes it before the repository
becomes visible; GC deletes nothing unless it names the repository being collected.

build_marker / parse_marker / read_marker / write_marker are also what a rebuild (export /
import) uses to give repositories made before markers existed theirs.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import asdict, dataclass

from quarry import FORMAT_VERSION, errors
from quarry.blob.base import BlobStore, ObjectNotFound
from quarry.blob.layout import MARKER_KEY

# An emptiness check lists at most this many keys (besides the marker).
SCAN_LIMIT = 1000


class NamespaceNotEmpty(errors.FailedPrecondition):
    reason = "NAMESPACE_NOT_EMPTY"


class NamespaceInUse(errors.FailedPrecondition):
    reason = "NAMESPACE_IN_USE"


class NamespaceNotOwned(errors.FailedPrecondition):
    """The namespace's marker is missing or names another repository: Quarry must not
    delete anything there."""

    reason = "NAMESPACE_NOT_OWNED"


class InvalidMarker(ValueError):
    """Bytes that are not an ownership marker."""


@dataclass(frozen=True)
class OwnershipMarker:
    repository: str
    instance_id: str
    installation_id: str
    format_version: int = FORMAT_VERSION
    created: str = ""  # ISO 8601, UTC

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), indent=2, sort_keys=True) + "\n").encode()

    def owns(self, repository: str, instance_id: str) -> bool:
        return self.repository == repository and self.instance_id == instance_id


def build_marker(
    repository: str, instance_id: str, installation_id: str, created: _dt.datetime | None = None
) -> OwnershipMarker:
    created = created or _dt.datetime.now(_dt.UTC)
    return OwnershipMarker(
        repository=repository,
        instance_id=instance_id,
        installation_id=installation_id,
        format_version=FORMAT_VERSION,
        created=created.astimezone(_dt.UTC).isoformat(),
    )


def parse_marker(data: bytes) -> OwnershipMarker:
    """InvalidMarker when the bytes are not a marker Quarry wrote."""
    try:
        doc = json.loads(data.decode())
        marker = OwnershipMarker(
            repository=doc["repository"],
            instance_id=doc["instance_id"],
            installation_id=doc["installation_id"],
            format_version=int(doc["format_version"]),
            created=str(doc.get("created", "")),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidMarker(f"not an ownership marker: {exc}") from None
    if not all(
        isinstance(v, str) and v
        for v in (marker.repository, marker.instance_id, marker.installation_id)
    ):
        raise InvalidMarker("not an ownership marker: empty or non-text names")
    return marker


def read_marker(store: BlobStore) -> bytes | None:
    """The marker's bytes, None when there is none."""
    try:
        return store.get(MARKER_KEY)
    except ObjectNotFound:
        return None


def write_marker(store: BlobStore, marker: OwnershipMarker) -> bool:
    """Write the marker unless one is there already (never overwrites); True if written."""
    return store.put(MARKER_KEY, marker.to_bytes(), if_absent=True)


@dataclass(frozen=True)
class NamespaceClaim:
    claimed: bool
    existing_marker: bytes | None  # the marker found, when not claimed
    keys: tuple[str, ...] = ()  # up to SCAN_LIMIT other keys found
    keys_truncated: bool = False


def claim_namespace(
    store: BlobStore, marker: bytes, replace: bytes | None = None, limit: int = SCAN_LIMIT
) -> NamespaceClaim:
    """Write `marker` when the namespace is empty (if absent), or, with `replace`, when the
    current marker is exactly `replace` (if equals). Whether a found marker may be replaced
    is the caller's decision (Graveler.create_repository); this only reports what is there.

    Never writes any other object, never deletes or overwrites one: a namespace that holds
    anything but a marker is left exactly as found unless `replace` names its marker."""
    keys = [k for k in store.first_keys(limit + 2) if k != MARKER_KEY]
    truncated = len(keys) > limit
    keys = keys[:limit]
    found = read_marker(store)
    claimed = False
    if replace is None:
        if found is None and not keys:
            claimed = store.put(MARKER_KEY, marker, if_absent=True)
            if not claimed:
                found = read_marker(store)
    elif found == replace:
        claimed = store.put_if_equals(MARKER_KEY, marker, replace)
        if not claimed:
            found = read_marker(store)
    return NamespaceClaim(claimed, None if claimed else found, tuple(keys), truncated)
