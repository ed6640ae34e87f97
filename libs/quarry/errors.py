"""Domain exceptions. Each carries the gRPC status code and an UPPER_SNAKE_CASE reason.

The server-side error interceptor (quarry.runtime.errors) turns any QuarryError into a
google.rpc.Status with an ErrorInfo (domain `quarry.dev`) plus the typed details the
exception provides; clients (quarry.kv.remote, quarry.client) turn them back.
Domain code raises these and never imports grpc status handling itself.
"""

from __future__ import annotations

import grpc

ERROR_DOMAIN = "quarry.dev"


class QuarryError(Exception):
    """Base of every error that reaches a client as a gRPC status."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
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
    code = grpc.StatusCode.INVALID_ARGUMENT
    reason = "INVALID_ARGUMENT"


class NotFound(QuarryError):
    code = grpc.StatusCode.NOT_FOUND
    reason = "NOT_FOUND"


class AlreadyExists(QuarryError):
    code = grpc.StatusCode.ALREADY_EXISTS
    reason = "ALREADY_EXISTS"


class FailedPrecondition(QuarryError):
    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "FAILED_PRECONDITION"


class Aborted(QuarryError):
    """Lost a race; safe to retry."""

    code = grpc.StatusCode.ABORTED
    reason = "ABORTED"


class ResourceExhausted(QuarryError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "RESOURCE_EXHAUSTED"


class MessageTooLarge(ResourceExhausted):
    """A request or response over a gRPC message size limit: permanent for that message
    (a smaller page_size or batch is needed), so never retried. gRPC itself reports these
    without an ErrorInfo; quarry.runtime.errors gives them this reason on both sides."""

    reason = "MESSAGE_TOO_LARGE"


class Unavailable(QuarryError):
    code = grpc.StatusCode.UNAVAILABLE
    reason = "UNAVAILABLE"


class DataLoss(QuarryError):
    """Stored data cannot be read back (a corrupt record or file)."""

    code = grpc.StatusCode.DATA_LOSS
    reason = "DATA_LOSS"


class Internal(QuarryError):
    code = grpc.StatusCode.INTERNAL
    reason = "INTERNAL"


class Unauthenticated(QuarryError):
    """No valid identity: a missing, malformed, expired or forged token, or a bad login."""

    code = grpc.StatusCode.UNAUTHENTICATED
    reason = "UNAUTHENTICATED"


class PermissionDenied(QuarryError):
    """A known principal that may not do this (metadata names the action and resource)."""

    code = grpc.StatusCode.PERMISSION_DENIED
    reason = "PERMISSION_DENIED"


def error_class_for(code: grpc.StatusCode) -> type[QuarryError]:
    """The generic QuarryError subclass for a status code (used when rebuilding remote errors)."""
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
    code = grpc.StatusCode.DEADLINE_EXCEEDED
    reason = "DEADLINE_EXCEEDED"


class Cancelled(QuarryError):
    code = grpc.StatusCode.CANCELLED
    reason = "CANCELLED"


class Unimplemented(QuarryError):
    """A contract RPC whose capability is not built yet."""

    code = grpc.StatusCode.UNIMPLEMENTED
    reason = "NOT_IMPLEMENTED"
