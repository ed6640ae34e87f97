"""Domain exceptions ⇄ google.rpc.Status.

Server side: `ErrorInterceptor` turns a QuarryError raised by a servicer into a status with
an ErrorInfo (reason, domain quarry.dev, metadata), optional RetryInfo and the exception's
typed details. Anything else becomes INTERNAL with an opaque incident id; the traceback is
logged, never sent.

Client side: `from_rpc_error` rebuilds the most specific QuarryError subclass from the
ErrorInfo reason, so remote stores and clients raise the same exceptions as local ones;
every client call runs inside `domain_errors`, the context manager that does so.

Message size limits: gRPC itself fails an oversized message with a bare RESOURCE_EXHAUSTED
("... message larger than max ..."). The interceptor refuses a response over the server's
send limit itself, with ErrorInfo MESSAGE_TOO_LARGE; a request over the server's receive
limit (refused by gRPC before any handler runs) or a response over the client's own
receive limit is rebuilt client-side as MessageTooLarge. Either way it carries no
RetryInfo, so clients do not retry it: only throttling (RetryInfo) is.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from quarry import errors
from quarry.runtime.channels import MAX_MESSAGE_BYTES
from quarry.runtime.handlers import WrappedHandlers, wrap_behavior
from quarry.runtime.tls import connection_error

log = logging.getLogger(__name__)

# How gRPC words its own size refusals ("Sent message larger than max (N vs. M)",
# "Received message larger than max (N vs. M)").
_GRPC_SIZE_REFUSAL = "message larger than max"


# A status travels in the trailers, which gRPC caps at 16 KB: a message or metadata value
# quoting a huge input (a 70 KB name) would turn the answer into RESOURCE_EXHAUSTED without
# its ErrorInfo. Quoted text is cut to these lengths.
MAX_MESSAGE_CHARS = 2000
MAX_METADATA_VALUE_CHARS = 500
# A status's packed details at most (the typed ones past it are dropped, and counted).
MAX_STATUS_DETAIL_BYTES = 3000


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def grpc_code(code: errors.Code) -> grpc.StatusCode:
    """gRPC's status code for a domain error's (the same name)."""
    return grpc.StatusCode[code.name]


def to_status(exc: errors.QuarryError) -> status_pb2.Status:
    metadata = {
        key: _cut(value, MAX_METADATA_VALUE_CHARS) for key, value in (exc.metadata or {}).items()
    }
    info = error_details_pb2.ErrorInfo(
        reason=exc.reason, domain=errors.ERROR_DOMAIN, metadata=metadata
    )
    details = [info]
    if exc.retry_delay is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(exc.retry_delay * 1e9))
        details.append(error_details_pb2.RetryInfo(retry_delay=delay))
    packed = []
    for message in details:
        any_msg = any_pb2.Any()
        any_msg.Pack(message)
        packed.append(any_msg)
    # Typed details (a merge's conflicts, ...) only while the status stays within
    # MAX_STATUS_DETAIL_BYTES: it travels in the trailer, which clients read under gRPC's
    # 8 KiB metadata limit — past it, the whole answer became RESOURCE_EXHAUSTED.
    size = sum(p.ByteSize() for p in packed)
    dropped = 0
    for message in exc.details:
        any_msg = any_pb2.Any()
        any_msg.Pack(message)
        if size + any_msg.ByteSize() > MAX_STATUS_DETAIL_BYTES:
            dropped += 1
            continue
        size += any_msg.ByteSize()
        packed.append(any_msg)
    if dropped:
        info.metadata["details_dropped"] = str(dropped)
        packed[0].Pack(info)
    return status_pb2.Status(
        code=grpc_code(exc.code).value[0],
        message=_cut(exc.message, MAX_MESSAGE_CHARS),
        details=packed,
    )


def _internal_status(exc: BaseException) -> status_pb2.Status:
    incident = uuid.uuid4().hex[:12]
    log.error("internal error, incident %s", incident, exc_info=exc)
    return to_status(errors.Internal(f"internal error (incident {incident})"))


def _abort(context: grpc.ServicerContext, exc: BaseException) -> None:
    if _cancelled_by_client(exc, context):
        # Not an incident: the client went away (cancelled, or its deadline passed) and gRPC
        # ended the call; reading its stream then raises. Nobody receives this status.
        log.info(
            "call cancelled (the client went away, or the server is stopping): %s",
            type(exc).__name__,
        )
        exc = errors.Cancelled("the call was cancelled")
    status = to_status(exc) if isinstance(exc, errors.QuarryError) else _internal_status(exc)
    grpc_status = rpc_status.to_status(status)
    # The code and message set first: OpenTelemetry's server span takes the call's status
    # from set_code/set_details (abort_with_status alone left failed calls' spans "OK").
    context.set_code(grpc_status.code)
    context.set_details(grpc_status.details)
    context.abort_with_status(grpc_status)


class ErrorInterceptor(grpc.ServerInterceptor):
    """Maps exceptions from every handler kind (unary and streaming) to rich statuses."""

    def __init__(self, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        # The server's send limit: a larger response is refused here, with an ErrorInfo.
        self._max_message_bytes = max_message_bytes
        self._wrapped = WrappedHandlers()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return self._wrapped.of(handler, lambda h: self._wrap(h, self._max_message_bytes))

    @staticmethod
    def _wrap(handler: Any, limit: int) -> Any:  # a grpc RpcMethodHandler (a namedtuple)
        wrapped = wrap_behavior(
            handler,
            lambda behavior: _wrap_unary(behavior, limit),
            lambda behavior: _wrap_stream(behavior, limit),
        )
        parse = getattr(handler, "request_deserializer", None)
        if parse is None:
            return wrapped
        return wrapped._replace(request_deserializer=_tolerant(parse))


class UndecodableRequest(errors.InvalidArgument):
    """The request bytes are not the method's message (garbage, invalid UTF-8 in a string
    field): the caller's mistake, not an internal error."""

    reason = "UNDECODABLE_REQUEST"


class _Undecodable:
    """What a request that could not be parsed becomes, so the wrapper (not gRPC, which
    answers INTERNAL for a deserializer's exception) refuses it with INVALID_ARGUMENT."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _tolerant(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:
            return _Undecodable(exc)

    return deserialize


def _decoded(request_or_iterator: Any) -> Any:
    """The request, or (client streams) an iterator of them; UndecodableRequest for one
    that could not be parsed (for a stream: when that message is reached)."""
    if isinstance(request_or_iterator, _Undecodable):
        raise _undecodable(request_or_iterator)
    if hasattr(request_or_iterator, "__next__"):  # a client stream's request iterator
        return _decoded_stream(request_or_iterator)
    return request_or_iterator


def _decoded_stream(requests: Iterator[Any]) -> Iterator[Any]:
    for request in requests:
        if isinstance(request, _Undecodable):
            raise _undecodable(request)
        yield request


def _undecodable(request: _Undecodable) -> UndecodableRequest:
    return UndecodableRequest(
        "the request cannot be decoded as the method's message (bytes that are not one, or "
        "a string field that is not valid UTF-8); send a valid serialized request"
    )


def _checked_size(response: Any, limit: int) -> Any:
    """The response, or MessageTooLarge (with ErrorInfo) where gRPC would refuse to send it
    with a bare status. Paged responses are cut far below this (quarry.paging)."""
    byte_size = getattr(response, "ByteSize", None)
    if byte_size is not None:
        size = byte_size()
        if size > limit:
            raise errors.MessageTooLarge(
                f"the response is {size} bytes, over the {limit}-byte message limit; ask "
                f"for a smaller page or batch",
                metadata={"size_bytes": str(size), "limit_bytes": str(limit)},
            )
    return response


def _cancelled_by_client(exc: BaseException, context: grpc.ServicerContext) -> bool:
    """The call failed because its client ended it: gRPC's request iterator (or a
    downstream call cancelled with it) raised an RpcError, or the deadline check
    (quarry.runtime.deadlines) turned that into Cancelled, and the call is no longer active."""
    return isinstance(exc, grpc.RpcError | errors.Cancelled) and not context.is_active()


def _is_abort(exc: BaseException, context: grpc.ServicerContext) -> bool:
    # context.abort() raises a bare Exception after setting the code; let it through.
    code = context.code()  # type: ignore[attr-defined]  # (grpc has it; the stubs lack it)
    return type(exc) is Exception and code not in (None, grpc.StatusCode.OK)


def _wrap_unary(behavior: Callable, limit: int) -> Callable:
    @functools.wraps(behavior)
    def wrapper(request_or_iterator: Any, context: grpc.ServicerContext) -> Any:
        try:
            return _checked_size(behavior(_decoded(request_or_iterator), context), limit)
        except Exception as exc:  # every error must become a status
            if _is_abort(exc, context):
                raise
            _abort(context, exc)

    return wrapper


def _wrap_stream(behavior: Callable, limit: int) -> Callable:
    @functools.wraps(behavior)
    def wrapper(request_or_iterator: Any, context: grpc.ServicerContext) -> Iterator:
        try:
            for response in behavior(_decoded(request_or_iterator), context):
                yield _checked_size(response, limit)
        except Exception as exc:
            if _is_abort(exc, context):
                raise
            _abort(context, exc)

    return wrapper


# ---- client side ------------------------------------------------------------------------


def _all_error_classes() -> dict[str, type[errors.QuarryError]]:
    found: dict[str, type[errors.QuarryError]] = {}
    stack = [errors.QuarryError]
    while stack:
        cls = stack.pop()
        # The most derived class wins for a reason shared with its base.
        found[cls.reason] = cls
        stack.extend(cls.__subclasses__())
    return found


def error_info(
    error: grpc.RpcError,
) -> tuple[error_details_pb2.ErrorInfo | None, list[any_pb2.Any]]:
    status = rpc_status.from_call(error) if hasattr(error, "trailing_metadata") else None
    if status is None:
        return None, []
    info = None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
    return info, list(status.details)


def from_rpc_error(error: grpc.RpcError) -> errors.QuarryError:
    """The QuarryError a remote call failed with (by ErrorInfo reason, else by code)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    message = error.details() if hasattr(error, "details") else str(error)
    try:
        info, details = error_info(error)
    except Exception:  # malformed trailers from a non-Quarry peer
        info, details = None, []
    cls: type[errors.QuarryError] = errors.error_class_for(code)
    metadata: dict[str, str] = {}
    if (
        info is None
        and code == grpc.StatusCode.RESOURCE_EXHAUSTED
        and _GRPC_SIZE_REFUSAL in (message or "").lower()
    ):
        # gRPC's own refusal of an oversized message: permanent, not throttling.
        cls = errors.MessageTooLarge
    if info is None and code == grpc.StatusCode.UNAVAILABLE:
        # gRPC's own report of a connection that failed to set up: name TLS when it is
        # about TLS (a wrong CA, plaintext against TLS, a missing client certificate).
        connection = connection_error(message or "")
        if connection is not None:
            return connection
    if info is not None and info.domain == errors.ERROR_DOMAIN:
        candidate = _all_error_classes().get(info.reason)
        if candidate is not None and candidate.code == code:
            cls = candidate
        metadata = dict(info.metadata)
    retry_delay = None
    typed = []
    for detail in details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retry_delay = retry.retry_delay.ToNanoseconds() / 1e9
        elif not detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            typed.append(detail)
    exc = cls(message or "", metadata=metadata, details=typed, retry_delay=retry_delay)
    if info is not None and cls.reason != info.reason:
        # Keep the wire reason even when no local class has it.
        exc.reason = info.reason
    return exc


class domain_errors:  # lower case: used like a function, `with domain_errors(): ...`
    """The one place client code turns a failed call into a domain error: a grpc.RpcError
    raised inside the block leaves it as the QuarryError it carries (from_rpc_error).

        with domain_errors():
            response = stub.GetItem(request, timeout=timeout)

    `source_error`: for a request stream fed by the caller's own iterable, a function
    returning the exception that iterable raised (gRPC reports such a call only as
    cancelled); when it returns one, that exception is raised instead."""

    __slots__ = ("_source_error",)

    def __init__(self, source_error: Callable[[], BaseException | None] | None = None) -> None:
        self._source_error = source_error

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, _traceback: object
    ) -> None:
        if not isinstance(exc, grpc.RpcError):
            return
        cause = self._source_error() if self._source_error is not None else None
        raise (cause if cause is not None else from_rpc_error(exc)) from None


# RESOURCE_EXHAUSTED is retried only with a RetryInfo (throttling): see is_retryable.
RETRYABLE_CODES = frozenset(
    {grpc.StatusCode.ABORTED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED}
)


def is_retryable(exc: errors.QuarryError, codes: frozenset = RETRYABLE_CODES) -> bool:
    """Whether a failed call may succeed when repeated: ABORTED and UNAVAILABLE (except a
    failed TLS handshake, marked `permanent`: the same certificates fail the same way);
    RESOURCE_EXHAUSTED only when the server said when to come back (RetryInfo, i.e.
    throttling). A RESOURCE_EXHAUSTED without it (a message over a size limit, a quota)
    fails the same way every time."""
    if exc.code not in codes or getattr(exc, "permanent", False):
        return False
    if exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return exc.retry_delay is not None
    return True


__all__ = [
    "ErrorInterceptor",
    "to_status",
    "from_rpc_error",
    "domain_errors",
    "error_info",
    "RETRYABLE_CODES",
    "is_retryable",
]
