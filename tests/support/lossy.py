"""A client-side fault: the server handles a call to completion, but its answer never reaches
the caller, who sees UNAVAILABLE — what a connection reset after the server answered looks
like. Used to show that retries with a request id get the first result instead of running
the call again."""

from __future__ import annotations

import threading

import grpc


class LostAnswer(grpc.RpcError):
    """The status a caller sees when the answer was lost on the way back."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection reset after the server answered (injected)"

    def trailing_metadata(self):
        return ()

    def initial_metadata(self):
        return ()

    # grpc hands an RpcError raised by an inner client interceptor to the outer ones as the
    # call's outcome (a grpc.Call and grpc.Future): behave like a failed call.
    def result(self, timeout=None):
        raise self

    def exception(self, timeout=None):
        return self

    def traceback(self, timeout=None):
        return None

    def done(self):
        return True

    def running(self):
        return False

    def cancelled(self):
        return False

    def cancel(self):
        return False

    def is_active(self):
        return False

    def time_remaining(self):
        return None

    def add_done_callback(self, fn):
        fn(self)

    def add_callback(self, callback):
        return False


class DropAnswers(grpc.UnaryUnaryClientInterceptor):
    """Drops the answers of the first `count` successful calls of `method` (a full method
    name such as "/quarry.v1.Committer/Merge"); records every request of it it passes on."""

    def __init__(self, method: str, count: int = 1):
        self.method = method
        self.count = count
        self.dropped = 0
        self.requests: list = []
        self._lock = threading.Lock()

    def intercept_unary_unary(self, continuation, client_call_details, request):
        outcome = continuation(client_call_details, request)
        if client_call_details.method != self.method:
            return outcome
        with self._lock:
            self.requests.append(request)
        if outcome.exception() is None:  # waits for the server's answer
            with self._lock:
                if self.dropped < self.count:
                    self.dropped += 1
                    raise LostAnswer()
        return outcome


def lossy_channel(target: str, interceptor: DropAnswers) -> grpc.Channel:
    return grpc.intercept_channel(grpc.insecure_channel(target), interceptor)


class RecordRequests(grpc.UnaryUnaryClientInterceptor, grpc.StreamUnaryClientInterceptor):
    """Records (method, request) of every unary and client-streaming call it passes on."""

    def __init__(self):
        self.calls: list[tuple[str, object]] = []
        self._lock = threading.Lock()

    def _record(self, method: str, request) -> None:
        with self._lock:
            self.calls.append((method.rsplit("/", 1)[-1], request))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        self._record(client_call_details.method, request)
        return continuation(client_call_details, request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        method = client_call_details.method

        def recorded():
            for request in request_iterator:
                self._record(method, request)
                yield request

        return continuation(client_call_details, recorded())
