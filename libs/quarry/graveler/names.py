"""Validation of names, paths and entries. Each rule is stated in its error message."""

from __future__ import annotations

import re

from quarry.blob.layout import check_physical_address
from quarry.graveler import errors as gerrors
from quarry.graveler.model import Entry

REPOSITORY_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{2,62}$")
REPOSITORY_RULE = (
    "3-63 characters: lower-case letters, digits and '-', starting with a letter or digit"
)
# Branches and tags: like lakeFS, word characters and '-', starting with a word character;
# no '/', '~', '^', '@' or ':' so they never clash with ref syntax.
REF_NAME = re.compile(r"^\w[-\w.]{0,254}$", re.ASCII)
REF_RULE = (
    "1-255 characters: letters, digits, '_', '-' and '.', starting with a letter, digit or '_'"
)
# Object paths become KV keys in staging partitions: at most 1,024 bytes (DynamoDB's sort
# key limit), UTF-8, no NUL.
MAX_PATH_BYTES = 1024
MAX_METADATA_BYTES = 8 * 1024
MAX_METADATA_PAIRS = 256
MAX_MESSAGE_BYTES = 64 * 1024
MAX_FIELD_BYTES = 2048


def check_repository_name(name: str) -> str:
    if not isinstance(name, str) or not REPOSITORY_NAME.match(name):
        raise gerrors.InvalidName(
            f"invalid repository name {name!r}: {REPOSITORY_RULE}", metadata={"kind": "repository"}
        )
    return name


def check_branch_name(name: str) -> str:
    return _check_ref_name(name, "branch")


def check_tag_name(name: str) -> str:
    return _check_ref_name(name, "tag")


def _check_ref_name(name: str, kind: str) -> str:
    if not isinstance(name, str) or not REF_NAME.match(name) or name.endswith(".") or ".." in name:
        raise gerrors.InvalidName(
            f"invalid {kind} name {name!r}: {REF_RULE} (no '..', not ending in '.')",
            metadata={"kind": kind},
        )
    if name == "HEAD":
        # In a ref, HEAD names the repository's default branch (graveler.resolution).
        raise gerrors.InvalidName(
            f"invalid {kind} name {name!r}: HEAD names the repository's default branch in "
            f"a ref (to read from); to write there or name a {kind}, use the branch's own "
            "name (`quarry repo show REPO` shows it)",
            metadata={"kind": kind},
        )
    if re.fullmatch(r"[0-9a-f]{6,64}", name):
        # Would be indistinguishable from a commit id prefix in a ref.
        raise gerrors.InvalidName(
            f"invalid {kind} name {name!r}: it looks like a commit id", metadata={"kind": kind}
        )
    return name


_CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")


def check_path(path: str) -> str:
    if not isinstance(path, str) or not path:
        raise gerrors.InvalidPath("object path is required", metadata={"path": ""})
    encoded = path.encode("utf-8", "surrogatepass")
    if len(encoded) > MAX_PATH_BYTES:
        raise gerrors.InvalidPath(
            f"object path is {len(encoded)} bytes; the limit is {MAX_PATH_BYTES}",
            metadata={"path": path[:200]},
        )
    if "\x00" in path:
        raise gerrors.InvalidPath("object path may not contain NUL", metadata={"path": path})
    return path


def check_entry(entry: Entry) -> Entry:
    check_path(entry.path)
    if entry.size_bytes < 0:
        raise gerrors.InvalidEntry(
            f"{entry.path}: size_bytes may not be negative", metadata={"path": entry.path}
        )
    for field_name in ("physical_address", "checksum", "content_type"):
        value = getattr(entry, field_name)
        if len(value.encode()) > MAX_FIELD_BYTES:
            raise gerrors.InvalidEntry(
                f"{entry.path}: {field_name} is longer than {MAX_FIELD_BYTES} bytes",
                metadata={"path": entry.path},
            )
    if entry.content_type and _CONTROL_CHARACTER.search(entry.content_type):
        # It becomes an HTTP header (the S3 gateway, the console): CR/LF would split it.
        raise gerrors.InvalidEntry(
            f"{entry.path}: content_type may not contain control characters",
            metadata={"path": entry.path},
        )
    # Refused, not rewritten: `..`, `.` and empty segments (quarry.blob.layout), before
    # any check of where the address points (fs:ImportFromStorage) or any read of it.
    check_physical_address(entry.physical_address, entry.path)
    if len(entry.metadata) > MAX_METADATA_PAIRS:
        raise gerrors.InvalidEntry(
            f"{entry.path}: {len(entry.metadata)} metadata pairs; the "
            f"limit is {MAX_METADATA_PAIRS}",
            metadata={"path": entry.path},
        )
    size = sum(len(k.encode()) + len(v.encode()) for k, v in entry.metadata)
    if size > MAX_METADATA_BYTES:
        raise gerrors.InvalidEntry(
            f"{entry.path}: metadata is {size} bytes; the limit is {MAX_METADATA_BYTES}",
            metadata={"path": entry.path},
        )
    return entry


# Commit metadata keys the server writes: a caller's would pass for Quarry's own record of a
# merge, revert, cherry-pick or import. (Other quarry.* keys, e.g. quarry.spark.*, are
# clients' own.)
RESERVED_METADATA_PREFIXES = (
    "quarry.merge.",
    "quarry.revert",
    "quarry.cherry-pick",
    "quarry.import",
)


def check_commit_metadata(message: str, metadata: dict[str, str]) -> None:
    if len(message.encode()) > MAX_MESSAGE_BYTES:
        raise gerrors.InvalidEntry(f"commit message is longer than {MAX_MESSAGE_BYTES} bytes")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in metadata.items())
    if size > MAX_METADATA_BYTES:
        raise gerrors.InvalidEntry(
            f"commit metadata is {size} bytes; the limit is {MAX_METADATA_BYTES}"
        )
    reserved = sorted(k for k in metadata if k.startswith(RESERVED_METADATA_PREFIXES))
    if reserved:
        raise gerrors.ReservedMetadataKey(
            f"metadata keys {', '.join(reserved[:5])} are Quarry's own record of a merge, "
            "revert, cherry-pick or import; a caller may not set them",
            metadata={"keys": ",".join(reserved)[:400]},
        )
