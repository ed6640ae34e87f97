"""The server side of quarry.runtime.deadlines: the interceptor that records each incoming
call's deadline and cancellation while its handler runs (the only part that knows gRPC)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from quarry.runtime.deadlines import IncomingCall, serving
from quarry.runtime.handlers import WrappedHandlers, wrap_behavior


def incoming_call(method: str, context: grpc.ServicerContext) -> IncomingCall:
    remaining = context.time_remaining()
    # gRPC reports "no deadline" as None or as a huge number, depending on the version.
    deadline = None if remaining is None or remaining > 10**8 else time.monotonic() + remaining
    return IncomingCall(method, deadline, context.is_active)


def _requests(call: IncomingCall, requests: Iterator[Any]) -> Iterator[Any]:
    """A request stream that, once its call expired or was cancelled, ends with that
    (DeadlineExceeded / Cancelled) rather than gRPC's bare RpcError."""
    while True:
        try:
            request = next(requests)
        except StopIteration:
            return
        except grpc.RpcError:
            call.check()
            raise
        yield request


class DeadlineInterceptor(grpc.ServerInterceptor):
    """Records each incoming call (quarry.runtime.deadlines) while its handler runs."""

    def __init__(self) -> None:
        self._wrapped = WrappedHandlers()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return self._wrapped.of(handler, lambda h: self._wrap(h, handler_call_details.method))

    @staticmethod
    def _wrap(handler: Any, method: str) -> Any:
        streamed = bool(getattr(handler, "request_streaming", False))

        def unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(request: Any, context: grpc.ServicerContext) -> Any:
                call = incoming_call(method, context)
                with serving(call):
                    return behavior(_requests(call, request) if streamed else request, context)

            return wrapper

        def streaming(behavior: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
            def wrapper(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                call = incoming_call(method, context)
                with serving(call):
                    yield from behavior(_requests(call, request) if streamed else request, context)

            return wrapper

        return wrap_behavior(handler, unary, streaming)
