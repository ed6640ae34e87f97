"""Errors of the committed layer (each a QuarryError with a gRPC code and a reason)."""

from __future__ import annotations

from quarry import errors

# One class per ErrorInfo reason across the library, so clients rebuild a definite class.
from quarry.graveler.errors import InvalidPath  # noqa: F401


class MetaRangeNotFound(errors.NotFound):
    reason = "METARANGE_NOT_FOUND"


class RangeNotFound(errors.DataLoss):
    """A metarange points to a range file that is missing: the namespace is damaged.
    DATA_LOSS, not NOT_FOUND: committed data the history promises is gone (a client must
    never read it as "no such object" and carry on)."""

    reason = "RANGE_NOT_FOUND"


class InvalidMetaRangeId(errors.InvalidArgument):
    reason = "INVALID_METARANGE_ID"


class UnsortedInput(errors.InvalidArgument):
    """Changes or entries not strictly ascending by path (this includes duplicates)."""

    reason = "UNSORTED_INPUT"


class DuplicatePath(UnsortedInput):
    reason = "DUPLICATE_PATH"


class RangeCorrupt(errors.DataLoss):
    """A range or metarange file that cannot be read back: the namespace is damaged."""

    reason = "RANGE_CORRUPT"


# UNIMPLEMENTED / NOT_IMPLEMENTED: an RPC of the contract whose capability is not built yet.
# One class per reason: the library-wide one.
NotImplementedYet = errors.Unimplemented


class InvalidStream(errors.InvalidArgument):
    """A streaming request without its header first, or with a second header."""

    reason = "INVALID_STREAM"
