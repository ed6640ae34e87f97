"""S3's error answers: the code, HTTP status and message S3 clients branch on, rendered as
S3's XML error document with the request id (xmlserde.error_document), and the mapping
from Quarry's domain errors (gRPC codes and ErrorInfo reasons) to them.

Safety rule: a user's mistake is never answered as InternalError, and no answer carries a
stack trace; an unexpected failure is InternalError with only the request id (the log has
the rest)."""

from __future__ import annotations

import logging

from quarry import errors

log = logging.getLogger(__name__)


class S3Error(Exception):
    """An S3 error answer."""

    def __init__(self, code: str, message: str, status: int, resource: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.resource = resource


def access_denied(message: str = "Access Denied") -> S3Error:
    return S3Error("AccessDenied", message, 403)


def no_such_bucket(bucket: str) -> S3Error:
    return S3Error("NoSuchBucket", "The specified bucket does not exist", 404, bucket)


def no_such_key(key: str) -> S3Error:
    return S3Error("NoSuchKey", "The specified key does not exist.", 404, key)


def invalid_argument(message: str) -> S3Error:
    return S3Error("InvalidArgument", message, 400)


def not_implemented(what: str) -> S3Error:
    return S3Error("NotImplemented", f"{what} is not implemented by the Quarry S3 gateway", 501)


def method_not_allowed(message: str) -> S3Error:
    return S3Error("MethodNotAllowed", message, 405)


def signature_mismatch() -> S3Error:
    return S3Error(
        "SignatureDoesNotMatch",
        "The request signature we calculated does not match the signature you provided. "
        "Check your key and signing method.",
        403,
    )


# Quarry reasons with an S3 code of their own (the rest go by gRPC code below).
_BY_REASON = {
    "REPOSITORY_NOT_FOUND": ("NoSuchBucket", 404),
    "OBJECT_NOT_FOUND": ("NoSuchKey", 404),
    "ENTRY_NOT_FOUND": ("NoSuchKey", 404),
    "STORAGE_OBJECT_NOT_FOUND": ("NoSuchKey", 404),
    "BRANCH_NOT_FOUND": ("NoSuchKey", 404),
    "REF_NOT_FOUND": ("NoSuchKey", 404),
    "TAG_NOT_FOUND": ("NoSuchKey", 404),
    "COMMIT_NOT_FOUND": ("NoSuchKey", 404),
    "BRANCH_PROTECTED": ("AccessDenied", 403),
    "PROTECTED_BRANCH": ("AccessDenied", 403),
    "NOT_A_BRANCH": ("MethodNotAllowed", 405),
    "OBJECT_EXISTS": ("PreconditionFailed", 412),
    "CHECKSUM_CONDITION_FAILED": ("PreconditionFailed", 412),
    "INVALID_PAGE_TOKEN": ("InvalidArgument", 400),
    # The server's own object store failed (disk full, read-only, S3 refused us): not the
    # client's mistake, and retryable, as S3 answers for its backend's trouble.
    "STORAGE_UNREACHABLE": ("ServiceUnavailable", 503),
    # The stored bytes are not the entry's object (DATA_LOSS): the server's data is damaged.
    "OBJECT_CHANGED": ("InternalError", 500),
    "CHECKSUM_MISMATCH": ("InternalError", 500),
}
# Reasons whose message describes the server's own storage (local paths, bucket names):
# logged by the gateway, never sent to an S3 client.
_SERVER_SIDE = frozenset({"STORAGE_UNREACHABLE", "OBJECT_CHANGED", "CHECKSUM_MISMATCH"})
_DAMAGED = frozenset({"OBJECT_CHANGED", "CHECKSUM_MISMATCH"})

_BY_CODE = {
    "NOT_FOUND": ("NoSuchKey", 404),
    "PERMISSION_DENIED": ("AccessDenied", 403),
    "UNAUTHENTICATED": ("AccessDenied", 403),
    "INVALID_ARGUMENT": ("InvalidArgument", 400),
    "FAILED_PRECONDITION": ("InvalidRequest", 400),
    "ALREADY_EXISTS": ("PreconditionFailed", 412),
    "ABORTED": ("OperationAborted", 409),
    "RESOURCE_EXHAUSTED": ("SlowDown", 503),
    "UNAVAILABLE": ("ServiceUnavailable", 503),
    "DEADLINE_EXCEEDED": ("ServiceUnavailable", 503),
    "OUT_OF_RANGE": ("InvalidArgument", 400),
}


def from_quarry(exc: errors.QuarryError, resource: str = "") -> S3Error:
    """The S3 answer to a Quarry domain error (a rebuilt gRPC status)."""
    reason = getattr(exc, "reason", "") or ""
    code_name = exc.code.name if exc.code is not None else "INTERNAL"
    found = _BY_REASON.get(reason) or _BY_CODE.get(code_name)
    if found is None:
        return S3Error("InternalError", "We encountered an internal error. Please try again.", 500)
    code, status = found
    if reason in _SERVER_SIDE:
        log.warning("s3: %s: %s", reason, exc.message)  # the operator's, not the client's
        if reason in _DAMAGED:
            return S3Error(
                code,
                f"{reason}: the stored bytes are not this object's; retrying will not help "
                "(an operator must restore them)",
                status,
                resource,
            )
        return S3Error(code, f"{reason}: the object store failed; try again", status, resource)
    return S3Error(code, f"{reason or code_name}: {exc.message}", status, resource)
