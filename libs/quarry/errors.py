"""Domain exceptions. Each carries a status code (Code: gRPC's codes by name and number,
without gRPC) and an UPPER_SNAKE_CASE reason.

The server-side error interceptor (quarry.runtime.errors) turns any QuarryError into a
google.rpc.Status with an ErrorInfo (domain `quarry.dev`) plus the typed details the
exception provides; clients (quarry.kv.remote, quarry.client) turn them back.
Domain code raises these and never imports gRPC: the core stays importable (and testable)
without it, and gRPC stays at the edge (quarry.runtime maps Code to grpc.StatusCode).
"""

from __future__ import annotations

import enum

ERROR_DOMAIN = "quarry.dev"


class Code(enum.Enum):
    """A status code: the names and numbers of gRPC's (and google.rpc.Code's).

    A member equals grpc.StatusCode's member of the same name (and hashes alike), so code
    that compares an error's code with gRPC's, or looks it up in a set of them, keeps
    working; quarry.runtime.errors converts explicitly on the wire."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Code):
            return self is other
        if isinstance(other, enum.Enum) and type(other).__name__ == "StatusCode":
            return self.name == other.name  # grpc.StatusCode
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)  # as every Enum member's (grpc.StatusCode's too)


class QuarryError(Exception):
    """Base of every error that reaches a client as a gRPC status."""

    code: Code = Code.INTERNAL
    reason: str = "INTERNAL"

    def __init__(
        self,
        message: str = "",
        *,
        metadata: dict[str, str] | None = None,
        details: list | None = None,
        retry_delay: float | None = None,
    ):
        super().__init__(message or self.reason)
        self.message = message or self.reason
        # Extra ErrorInfo metadata (string → string), shown to the client.
        self.metadata = dict(metadata or {})
        # Extra typed protobuf messages packed into google.rpc.Status.details.
        self.details = list(details or [])
        # When set, a google.rpc.RetryInfo with this delay (seconds) is attached.
        self.retry_delay = retry_delay

    def __str__(self) -> str:
        return self.message


class InvalidArgument(QuarryError):
    code = Code.INVALID_ARGUMENT
    reason = "INVALID_ARGUMENT"


class NotFound(QuarryError):
    code = Code.NOT_FOUND
    reason = "NOT_FOUND"


class AlreadyExists(QuarryError):
    code = Code.ALREADY_EXISTS
    reason = "ALREADY_EXISTS"


class FailedPrecondition(QuarryError):
    code = Code.FAILED_PRECONDITION
    reason = "FAILED_PRECONDITION"


class Aborted(QuarryError):
    """Lost a race; safe to retry."""

    code = Code.ABORTED
    reason = "ABORTED"


class ResourceExhausted(QuarryError):
    code = Code.RESOURCE_EXHAUSTED
    reason = "RESOURCE_EXHAUSTED"


class MessageTooLarge(ResourceExhausted):
    """A request or response over a gRPC message size limit: permanent for that message
    (a smaller page_size or batch is needed), so never retried. gRPC itself reports these
    without an ErrorInfo; quarry.runtime.errors gives them this reason on both sides."""

    reason = "MESSAGE_TOO_LARGE"


class Unavailable(QuarryError):
    code = Code.UNAVAILABLE
    reason = "UNAVAILABLE"


class DataLoss(QuarryError):
    """Stored data cannot be read back (a corrupt record or file)."""

    code = Code.DATA_LOSS
    reason = "DATA_LOSS"


class Internal(QuarryError):
    code = Code.INTERNAL
    reason = "INTERNAL"


class Unauthenticated(QuarryError):
    """No valid identity: a missing, malformed, expired or forged token, or a bad login."""

    code = Code.UNAUTHENTICATED
    reason = "UNAUTHENTICATED"


class PermissionDenied(QuarryError):
    """A known principal that may not do this (metadata names the action and resource)."""

    code = Code.PERMISSION_DENIED
    reason = "PERMISSION_DENIED"


def error_class_for(code: Code | enum.Enum) -> type[QuarryError]:
    """The generic QuarryError subclass for a status code (a Code, or gRPC's of the same
    name: used when rebuilding remote errors)."""
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        Aborted,
        ResourceExhausted,
        Unavailable,
        Unimplemented,
        DeadlineExceeded,
        Cancelled,
        DataLoss,
        Unauthenticated,
        PermissionDenied,
    ):
        if cls.code == code:
            return cls
    return Internal


class DeadlineExceeded(QuarryError):
    code = Code.DEADLINE_EXCEEDED
    reason = "DEADLINE_EXCEEDED"


class Cancelled(QuarryError):
    code = Code.CANCELLED
    reason = "CANCELLED"


class Unimplemented(QuarryError):
    """A contract RPC whose capability is not built yet."""

    code = Code.UNIMPLEMENTED
    reason = "NOT_IMPLEMENTED"
