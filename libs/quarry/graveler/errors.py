"""Errors of the versioning core, each with its gRPC code and ErrorInfo reason."""

from typing import Any

from quarry import errors
from quarry.blob.base import (
    InvalidStorageNamespace,  # noqa: F401 — one class per reason
    StorageUnreachable,  # noqa: F401
)
from quarry.blob.ownership import (
    NamespaceNotEmpty,  # noqa: F401
)


class InvalidName(errors.InvalidArgument):
    reason = "INVALID_NAME"


class InvalidPath(errors.InvalidArgument):
    reason = "INVALID_PATH"


class InvalidEntry(errors.InvalidArgument):
    reason = "INVALID_ENTRY"


class ReservedMetadataKey(errors.InvalidArgument):
    """A commit's metadata key that Quarry itself writes (quarry.merge.*, quarry.revert,
    quarry.cherry-pick, quarry.import): a caller may not set it."""

    reason = "RESERVED_METADATA_KEY"


class InvalidRef(errors.InvalidArgument):
    reason = "INVALID_REF"


class InvalidPageToken(errors.InvalidArgument):
    reason = "INVALID_PAGE_TOKEN"


class RepositoryNotFound(errors.NotFound):
    reason = "REPOSITORY_NOT_FOUND"


class BranchNotFound(errors.NotFound):
    reason = "BRANCH_NOT_FOUND"


class TagNotFound(errors.NotFound):
    reason = "TAG_NOT_FOUND"


class CommitNotFound(errors.NotFound):
    reason = "COMMIT_NOT_FOUND"


class RefNotFound(errors.NotFound):
    reason = "REF_NOT_FOUND"


class ObjectNotFound(errors.NotFound):
    reason = "OBJECT_NOT_FOUND"


class RepositoryExists(errors.AlreadyExists):
    reason = "REPOSITORY_EXISTS"


class BranchExists(errors.AlreadyExists):
    reason = "BRANCH_EXISTS"


class TagExists(errors.AlreadyExists):
    reason = "TAG_EXISTS"


class GarbageCollectionRulesNotFound(errors.NotFound):
    reason = "GC_RULES_NOT_FOUND"


class ObjectExists(errors.AlreadyExists):
    reason = "OBJECT_EXISTS"


class ChecksumConditionFailed(errors.FailedPrecondition):
    """A put conditioned on the object's current checksum found another."""

    reason = "CHECKSUM_CONDITION_FAILED"


class AmbiguousRef(errors.InvalidArgument):
    reason = "AMBIGUOUS_REF"


class NoChanges(errors.FailedPrecondition):
    reason = "NO_CHANGES"


def already_merged(exc: errors.QuarryError) -> bool:
    """Whether a merge was refused because the source is already in the destination's
    history (NO_CHANGES naming the source), as opposed to other NO_CHANGES refusals."""
    return exc.reason == NoChanges.reason and "source" in exc.metadata


class DirtyBranch(errors.FailedPrecondition):
    reason = "DIRTY_BRANCH"


class ProtectedBranch(errors.FailedPrecondition):
    reason = "PROTECTED_BRANCH"


class BranchProtected(errors.FailedPrecondition):
    """A staging write or commit on a branch a branch protection rule blocks it on."""

    reason = "BRANCH_PROTECTED"


class ProtectionRulesChanged(errors.FailedPrecondition):
    """SetBranchProtectionRules with an if_checksum that is no longer the stored rules'."""

    reason = "PRECONDITION_FAILED"


class NotABranch(errors.FailedPrecondition):
    reason = "NOT_A_BRANCH"


class BranchContended(errors.Aborted):
    """Lost the branch record's compare-and-swap on every bounded retry."""

    reason = "BRANCH_CONTENDED"


class RepositoryContended(errors.Aborted):
    """Lost the repository record's compare-and-swap on every bounded retry."""

    reason = "REPOSITORY_CONTENDED"


class MergeConflict(errors.FailedPrecondition):
    """Details: a quarry.v1.MergeConflicts listing the conflicting paths."""

    reason = "MERGE_CONFLICT"


class DestinationMoved(errors.FailedPrecondition):
    """A merge conditioned on the destination's HEAD (destination_head_id) found another."""

    reason = "DESTINATION_MOVED"


class HeadMoved(errors.Aborted):
    """A merge lost the race for the destination HEAD on every retry. Details: a
    quarry.v1.MergeRetryHint whose hint_metarange_id resumes the work."""

    reason = "HEAD_MOVED"


class NoMergeBase(errors.FailedPrecondition):
    reason = "NO_MERGE_BASE"


class InvalidParent(errors.InvalidArgument):
    reason = "INVALID_PARENT"


class InvalidImportSource(errors.InvalidArgument):
    reason = "INVALID_IMPORT_SOURCE"


class ImportNotFound(errors.NotFound):
    reason = "IMPORT_NOT_FOUND"


# Keys stored in the KV that are not partition names (at most 2 KB) may be anything; keep
# messages and metadata readable.
_MAX_SHOWN = 200


class CorruptRecord(errors.DataLoss):
    """A stored record cannot be read back. Metadata: partition, key, record (type)."""

    reason = "CORRUPT_RECORD"

    def __init__(
        self,
        message: str = "",
        *,
        partition: bytes = b"",
        key: bytes = b"",
        record: str = "",
        metadata: dict[str, str] | None = None,
        **kwargs: Any,
    ):
        shown = {"partition": show(partition), "key": show(key), "record": record}
        super().__init__(message, metadata={**shown, **(metadata or {})}, **kwargs)
        self.partition = partition
        self.key = key
        self.record = record


def show(raw: bytes) -> str:
    """A partition name or key as text for messages, metadata and reports."""
    text = bytes(raw).decode("utf-8", "backslashreplace")
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "..."
