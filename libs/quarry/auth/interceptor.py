"""The gRPC server interceptor that authenticates and authorizes every call of quarry.v1 by
the declaration table, and writes the audit log.

Authentication: `authorization: Bearer <token>` metadata (TokenAuthority.verify), then the
principal is checked to still exist (Authorizer.check_principal). Authorization: the rule of
the method (declarations.RULES). Health, reflection (outside quarry.v1) and the OPEN rules
(ServerInfo, Auth/Login) need no token. The principal of the call is available to the
servicer through `current_principal()`.

Audit: one structured line (JSON) on the `quarry.audit` logger per MUTATING call, whatever
its outcome (but not a service's successful internal calls, e.g. KV writes): principal, method, action, resource, outcome (ok / failed / denied /
unauthenticated), status code, request id and the client's address (`peer`). The principal
is whoever the token proves, also when the call is refused afterwards (a revoked key, a
deleted user, a denied action); "anonymous" only when no token proved anyone. A servicer
adds what only it knows with `annotate_audit` (Setup: the admin it created).

Install inside the ErrorInterceptor (which turns the refusals into statuses with an
ErrorInfo) and after the readiness gate: interceptors=[..., ErrorInterceptor, ReadinessGate,
AuthInterceptor].

Safety rule: a quarry.v1 method without a declaration, or a handler kind not wrapped here,
is refused, never served unauthenticated; a client stream is authorized message by message
BEFORE the servicer sees each message.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from quarry import errors
from quarry.auth import errors as auth_errors
from quarry.auth.authorizer import Authorizer
from quarry.auth.declarations import RULES, Access, Rule, is_quarry_method
from quarry.auth.tokens import SERVICE, Principal, TokenAuthority
from quarry.runtime.channels import RELAY_HEADER
from quarry.runtime.handlers import WrappedHandlers

AUDIT_LOGGER = "quarry.audit"
audit_log = logging.getLogger(AUDIT_LOGGER)

AUTHORIZATION_HEADER = "authorization"
REQUEST_ID_HEADER = "x-request-id"
_BEARER = "bearer "
# Tokens whose signature and claims verified, kept by their exact text (a client sends the
# same token on every call for its lifetime). Bounded: cleared when it would grow past this.
VERIFIED_TOKENS_MAX = 1024

_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "quarry_principal", default=None
)
_audit: contextvars.ContextVar[_Audit | None] = contextvars.ContextVar("quarry_audit", default=None)


def current_principal() -> Principal | None:
    """The authenticated principal of the call being served (None on open methods)."""
    return _principal.get()


def annotate_audit(**fields: str) -> None:
    """Add fields to the audit line of the call being served (nothing outside a call)."""
    audit = _audit.get()
    if audit is not None:
        audit.extra = {**(audit.extra or {}), **fields}


def bearer_token(metadata: Any) -> str | None:
    """The token of `authorization: Bearer <token>`; None when absent; TokenMalformed for
    another scheme."""
    for key, value in metadata or ():
        if key.lower() != AUTHORIZATION_HEADER:
            continue
        text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        if not text.lower().startswith(_BEARER):
            raise auth_errors.TokenMalformed("the authorization header must be `Bearer <token>`")
        return text[len(_BEARER) :].strip()
    return None


@dataclass(slots=True)
class _Audit:
    """What one mutating call's audit line says; filled in as the call proceeds (a slotted
    object: one is made on every call)."""

    method: str
    rule: Rule
    request_id: str = ""
    principal: str = ""
    resource: str = ""
    outcome: str = "failed"
    code: str = grpc.StatusCode.UNKNOWN.name
    peer: str = ""
    extra: dict[str, str] | None = None

    def refused(self, exc: BaseException) -> None:
        if isinstance(exc, auth_errors.Unauthenticated):
            self.outcome = "unauthenticated"
        elif isinstance(exc, auth_errors.PermissionDenied):
            self.outcome = "denied"
            self.resource = exc.metadata.get("resource", self.resource)
        else:
            self.outcome = "failed"
        self.code = (
            exc.code.name if isinstance(exc, errors.QuarryError) else grpc.StatusCode.UNKNOWN.name
        )

    def write(self) -> None:
        if not (self.rule.mutating or (self.rule.audit_refusals and self.outcome == "denied")):
            return
        if (
            self.rule.access is Access.SERVICE_ONLY
            and self.outcome == "ok"
            and self.principal.startswith(f"{SERVICE}:")
        ):
            # A service's own internal call (a KV write, a range write) made while serving
            # a user call that the public service audits already: no line per KV write.
            # Refusals of internal calls are still audited.
            return
        # A call that named no request id gets one here, only when a line is written (a
        # read's audit object is never written: no random id drawn for it).
        self.request_id = self.request_id or uuid.uuid4().hex
        line = {
            "principal": self.principal or "anonymous",
            "method": self.method,
            "action": self.rule.action or self.rule.access.value,
            "resource": self.resource,
            "outcome": self.outcome,
            "code": self.code,
            "request_id": self.request_id,
            "peer": self.peer,
            **(self.extra or {}),
        }
        audit_log.info(json.dumps(line, separators=(",", ":"), sort_keys=True))


class AuthInterceptor(grpc.ServerInterceptor):
    def __init__(
        self, tokens: TokenAuthority, authorizer: Authorizer, rules: dict[str, Rule] = RULES
    ):
        self._tokens = tokens
        self._authorizer = authorizer
        self._rules = rules
        # Wrapped handlers by the handler they wrap: built once per method, not per call.
        self._wrapped = WrappedHandlers()
        # Verifying a JWT (HMAC, base64, JSON) is the largest share of auth's cost per call;
        # a token's signature and claims verify the same way every time, only its expiry
        # changes, so a verified token is remembered and its expiry checked on every call
        # against the authority's own clock (a test's moved clock included).
        self._verified: dict[str, Principal] = {}
        self._verified_lock = threading.Lock()

    def intercept_service(
        self, continuation: Callable[[Any], Any], handler_call_details: Any
    ) -> Any:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not is_quarry_method(method):
            return handler  # health, reflection: always open
        return self._wrapped.of(handler, lambda h: self._wrap(h, method, self._rules.get(method)))

    # ---- the checks -------------------------------------------------------------------

    def _authenticate(self, metadata: Any, audit: _Audit) -> Principal:
        principal = self._verify(bearer_token(metadata))
        # Named before the principal is checked: a refused call by a revoked key or a
        # deleted user is audited as who the token proves, not as "anonymous".
        audit.principal = str(principal)
        self._authorizer.check_principal(principal)
        relay = _metadata_value(metadata, RELAY_HEADER)
        if relay is None:
            return principal
        try:
            relayer = self._verify(relay.removeprefix("Bearer ").strip())
        except errors.QuarryError as exc:  # the relay's token, not the caller's own
            raise type(exc)(
                f"{RELAY_HEADER}: {exc.message}", metadata={**exc.metadata, "header": RELAY_HEADER}
            ) from None
        if not relayer.is_service or principal.is_service:
            # Safety rule: only a service relays, and only a user's call.
            raise auth_errors.ServicePrincipalRequired(
                f"{RELAY_HEADER} must carry a Quarry service's token, on a user's call",
                metadata={"principal": str(principal), "relayed_by": str(relayer)},
            )
        audit.principal = f"{principal} via {relayer}"
        return dataclasses.replace(principal, relayed_by=relayer.id)

    def _verify(self, token: str | None) -> Principal:
        """TokenAuthority.verify, remembered per token (see __init__).

        Safety rule: never accepts a token that TokenAuthority.verify did not accept, nor
        one past its expiry: only verified tokens are remembered, a remembered one whose
        expiry has passed is verified again (which refuses it), and whether
        its user or access key still exists is checked on every call (check_principal)."""
        if not token:
            return self._tokens.verify(token)
        principal = self._verified.get(token)
        if principal is not None and principal.expires_at > self._tokens.now():
            return principal
        principal = self._tokens.verify(token)
        with self._verified_lock:
            if len(self._verified) >= VERIFIED_TOKENS_MAX:
                self._verified.clear()
            self._verified[token] = principal
        return principal

    def _admit(
        self,
        rule: Rule,
        principal: Principal | None,
        request: Any,
        audit: _Audit,
        first: Any = None,
    ) -> None:
        """Authorize one request (or one message of a client stream)."""
        if rule.access in (Access.OPEN, Access.AUTHENTICATED):
            return
        if principal is None:
            raise auth_errors.TokenMissing("this method needs a bearer token")
        if rule.access is Access.SERVICE_ONLY:
            if not principal.is_service:
                raise auth_errors.ServicePrincipalRequired(
                    f"{audit.method} is internal: only Quarry's own services may call it",
                    metadata={"principal": str(principal), "method": audit.method},
                )
            return
        if rule.resources is None:
            raise auth_errors.PermissionDenied(f"{audit.method} declares no resources")
        if principal.is_service and not rule.mutating:
            # A service skips policy evaluation (the authorizer's rule), and the resources
            # would only name a mutating call's audit line: a service's KV read (the hot
            # path of every user read) does not build them.
            self._authorizer.authorize(principal, rule.action, ())
            return
        resources = (
            rule.resources(request, first) if rule.client_stream else rule.resources(request)
        )
        audit.resource = audit.resource or resources[0]
        self._authorizer.authorize(principal, rule.action, resources)
        for action, more in rule.also:
            also = more(request, first) if rule.client_stream else more(request)
            self._authorizer.authorize(principal, action, also)

    def _begin(
        self, rule: Rule | None, method: str, context: grpc.ServicerContext, audit: _Audit
    ) -> tuple[Rule, Principal | None]:
        metadata = context.invocation_metadata()
        if audit.rule.mutating:  # the request id and peer only ever appear in an audit line
            audit.request_id = _metadata_value(metadata, REQUEST_ID_HEADER) or ""
            audit.peer = context.peer() or ""
        if rule is None:
            raise auth_errors.PermissionDenied(
                f"{method} has no access declaration; refused", metadata={"method": method}
            )
        if rule.access is Access.OPEN:
            return rule, None
        return rule, self._authenticate(metadata, audit)

    # ---- wrapping ---------------------------------------------------------------------

    def _wrap(self, handler: Any, method: str, rule: Rule | None) -> Any:
        undeclared = Rule(Access.SERVICE_ONLY, mutating=True)
        audit_rule = rule or undeclared
        interceptor = self

        def unary_request(behavior: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(behavior)
            def wrapper(request: Any, context: grpc.ServicerContext) -> Any:
                audit = _Audit(method, audit_rule)
                try:
                    checked, principal = interceptor._begin(rule, method, context, audit)
                    if audit_rule.mutating:
                        audit.request_id = getattr(request, "request_id", "") or audit.request_id
                    interceptor._admit(checked, principal, request, audit)
                    token = _principal.set(principal)
                    audit_token = _audit.set(audit)
                    try:
                        response = behavior(request, context)
                    finally:
                        _audit.reset(audit_token)
                        _principal.reset(token)
                except BaseException as exc:
                    audit.refused(exc)
                    raise
                else:
                    audit.outcome, audit.code = "ok", grpc.StatusCode.OK.name
                    return response
                finally:
                    audit.write()

            return wrapper

        def unary_request_stream(behavior: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(behavior)
            def wrapper(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                audit = _Audit(method, audit_rule)
                try:
                    checked, principal = interceptor._begin(rule, method, context, audit)
                    interceptor._admit(checked, principal, request, audit)
                    token = _principal.set(principal)
                    try:
                        yield from behavior(request, context)
                    finally:
                        _principal.reset(token)
                except BaseException as exc:
                    audit.refused(exc)
                    raise
                else:
                    audit.outcome, audit.code = "ok", grpc.StatusCode.OK.name
                finally:
                    audit.write()

            return wrapper

        def checked_messages(
            checked: Rule, principal: Principal | None, requests: Any, audit: _Audit
        ) -> Iterator[Any]:
            first = None
            for message in requests:
                if first is None:
                    first = message
                audit.request_id = audit.request_id or getattr(message, "request_id", "")
                interceptor._admit(checked, principal, message, audit, first)
                yield message

        def stream_request(behavior: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(behavior)
            def wrapper(requests: Any, context: grpc.ServicerContext) -> Any:
                audit = _Audit(method, audit_rule)
                try:
                    checked, principal = interceptor._begin(rule, method, context, audit)
                    token = _principal.set(principal)
                    try:
                        response = behavior(
                            checked_messages(checked, principal, requests, audit), context
                        )
                    finally:
                        _principal.reset(token)
                except BaseException as exc:
                    audit.refused(exc)
                    raise
                else:
                    audit.outcome, audit.code = "ok", grpc.StatusCode.OK.name
                    return response
                finally:
                    audit.write()

            return wrapper

        if handler.unary_unary:
            return handler._replace(unary_unary=unary_request(handler.unary_unary))
        if handler.unary_stream:
            return handler._replace(unary_stream=unary_request_stream(handler.unary_stream))
        if handler.stream_unary:
            return handler._replace(stream_unary=stream_request(handler.stream_unary))
        if handler.stream_stream:
            return handler._replace(stream_stream=refuse(handler.stream_stream))
        return handler


def refuse(behavior: Callable[..., Any]) -> Callable[..., Any]:
    """No quarry.v1 RPC is a bidirectional stream; one added later is refused until this
    interceptor learns to check it."""

    @functools.wraps(behavior)
    def wrapper(requests: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        raise auth_errors.PermissionDenied("bidirectional streams are not authorized yet")
        yield  # a generator, like the handler it replaces

    return wrapper


def _metadata_value(metadata: Any, name: str) -> str | None:
    for key, value in metadata or ():
        if key.lower() == name:
            return value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return None
