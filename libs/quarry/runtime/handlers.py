"""One way to wrap a gRPC method handler's behaviour, for the server interceptors that do
(errors, deadlines, readiness, per-RPC metrics, authentication)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


def wrap_behavior(handler: Any, unary: Wrap, streaming: Wrap) -> Any:
    """`handler` (a grpc RpcMethodHandler, a namedtuple in grpc's implementation) with its
    behaviour wrapped: by `unary` for methods answering one message (unary-unary and
    stream-unary), by `streaming` for methods answering a stream."""
    for kind, wrap in (
        ("unary_unary", unary),
        ("stream_unary", unary),
        ("unary_stream", streaming),
        ("stream_stream", streaming),
    ):
        behavior = getattr(handler, kind)
        if behavior:
            return handler._replace(**{kind: wrap(behavior)})
    return handler


class WrappedHandlers:
    """The wrapped handlers of one interceptor, by the handler they wrap: a handler is
    wrapped once per method, not once per call (gRPC hands the same handler each time)."""

    def __init__(self) -> None:
        self._by_handler: dict[int, tuple[Any, Any]] = {}

    def of(self, handler: Any, wrap: Callable[[Any], Any]) -> Any:
        cached = self._by_handler.get(id(handler))
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = wrap(handler)
        self._by_handler[id(handler)] = (handler, wrapped)
        return wrapped
