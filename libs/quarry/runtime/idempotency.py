"""The one way a servicer makes a mutating RPC idempotent by request_id (AIP-155).

    class CommitterServicer(...):
        def __init__(self, graveler, requests: RequestLog): self._requests = requests

        @idempotent(pb.CommitResponse)
        def Commit(self, request, context): ...

A call without `request_id` runs exactly as before (no KV operation added). With one, it runs
through the servicer's RequestLog (`self._requests`, quarry.graveler.requests): at most once
per id, a repeat answered with the first successful response.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import message as pb_message

from quarry.graveler.requests import RequestLog, check_request_id, fingerprint

M = TypeVar("M", bound=pb_message.Message)

# `repository=INSTALLATION`: the call's records live in the `quarry` partition.
INSTALLATION = None


def idempotent(
    response_type: type[M], *, repository: str | None = "repository", ignore: tuple[str, ...] = ()
) -> Callable:
    """Decorate a unary servicer method whose request has a `request_id` field.

    `repository`: the request field naming the repository whose partition keeps the record,
    or INSTALLATION. `ignore`: request fields left out of the fingerprint (hints that do
    not change what the call does, e.g. a merge's hint_metarange_id, which the client
    updates between its retries)."""

    def decorate(method: Callable) -> Callable:
        @functools.wraps(method)
        def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
            if not request.request_id:
                return method(self, request, context)
            name = getattr(request, repository) if repository is not None else None
            return run_once(
                self._requests,
                request,
                name,
                lambda: method(self, request, context),
                response_type,
                ignore,
            )

        return wrapper

    return decorate


def run_once(
    requests: RequestLog,
    request: Any,  # a request message with a request_id field
    repository: str | None,
    call: Callable[[], M],
    response_type: type[M],
    ignore: tuple[str, ...] = (),
) -> M:
    """`call()` at most once for `request.request_id` (which must be set)."""
    request_id = check_request_id(request.request_id)
    partition = requests.partition_for(repository)
    return requests.run(
        partition,
        request_id,
        fingerprint(request, ignore),
        call,
        lambda response: response.SerializeToString(deterministic=True),
        response_type.FromString,
    )
