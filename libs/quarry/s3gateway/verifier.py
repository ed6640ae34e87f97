"""The gateway's check of SigV4 signatures: Auth/VerifySignature, and for a short while after
it a check of the same credential's further signatures here, with the key Auth derived for
their scope (one day, one region, "s3"), so a request does not cost an Auth call.

The secret never leaves the Auth service: what is kept here is the scope's derived signing
key (SigV4's HMAC chain of the secret over date/region/service; it cannot be turned back into
the secret and signs nothing outside its scope), the bearer token Auth issued for the
credential's user, and that user's id.

Safety rules:
- An entry is used for at most `ttl_seconds` after Auth verified a signature with it, counted
  from that verification; a hit never extends it. A credential revoked at Auth (deleted, or
  its user deleted) therefore stops working at the gateway within `ttl_seconds`, and the token
  reused meanwhile was issued for REQUEST_TOKEN_SECONDS, longer than any entry lives.
- A signature that does not match the cached key is never accepted here: it goes to Auth,
  which decides (a credential re-created with the same id and a new secret works at once).
- A key is only used for its own scope: the cache is keyed by (access key id, date, region,
  service), and every string to sign must name that scope.
- `ttl_seconds` 0 turns the cache off (every request asks Auth).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from quarry.auth.sigv4_secrets import Scope, sign
from quarry.lru import TTLCache
from quarry.runtime.errors import from_rpc_error
from quarry.s3gateway import sigv4
from quarry.s3gateway.errors import from_quarry, signature_mismatch
from quarry.v1 import auth_pb2

# The token the Auth service issues lives this long: enough for a long upload's staging call
# after the cache entry it came with expired, short enough that nothing keeps a usable
# credential around.
REQUEST_TOKEN_SECONDS = 900
# Auth caps a token's lifetime; an entry must never outlive its token.
_MAX_TTL_SECONDS = REQUEST_TOKEN_SECONDS / 4


@dataclass(frozen=True)
class Verified:
    """Who signed: the user, and the bearer token to call Quarry with as them."""

    user_id: str
    token: str


@dataclass(frozen=True)
class _Entry:
    signing_key: bytes
    verified: Verified


def _matches(key: bytes, scope: Scope, signed: Sequence[tuple[str, str]]) -> bool:
    """Every (string to sign, signature) signed with `key` and naming `scope` (no early
    exit: each signature is computed and compared)."""
    ok = bool(signed)
    for string_to_sign, signature in signed:
        lines = string_to_sign.split("\n")
        if len(lines) < 4 or lines[2] != scope.line():
            ok = False
        ok = hmac.compare_digest(sign(key, string_to_sign), signature.lower()) and ok
    return ok


class SignatureVerifier:
    def __init__(
        self,
        auth: Any,  # quarry.v1 AuthStub with the gateway's service token
        ttl_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        max_items: int = 10_000,
    ) -> None:
        self._auth = auth
        self._ttl = min(max(0.0, float(ttl_seconds)), _MAX_TTL_SECONDS)
        self._cache = TTLCache(self._ttl, max_items=max_items, clock=clock)
        self.auth_calls = 0  # VerifySignature calls made (tests, metrics)

    def verify(self, signature: sigv4.Signature, signed: Sequence[tuple[str, str]]) -> Verified:
        """Who signed every (string to sign, signature) of `signed` with `signature`'s
        credential and scope; SignatureDoesNotMatch otherwise."""
        scope = Scope(signature.date, signature.region, signature.service)
        cache_key = (signature.access_key_id, scope.date, scope.region, scope.service)
        if self._ttl > 0:
            entry = self._cache.get(cache_key)
            if entry is not None and _matches(entry.signing_key, scope, signed):
                return entry.verified
        reply = self._ask_auth(signature, signed)
        verified = Verified(user_id=reply.user_id, token=reply.token)
        if self._ttl > 0 and reply.signing_key:
            self._cache.put(cache_key, _Entry(reply.signing_key, verified))
        return verified

    def _ask_auth(self, signature: sigv4.Signature, signed: Sequence[tuple[str, str]]) -> Any:
        request = auth_pb2.VerifySignatureRequest(
            access_key_id=signature.access_key_id,
            date=signature.date,
            region=signature.region,
            service=signature.service,
            signed=[auth_pb2.SignedString(string_to_sign=t, signature=s) for t, s in signed],
            token_lifetime_seconds=REQUEST_TOKEN_SECONDS,
            want_signing_key=self._ttl > 0,
        )
        self.auth_calls += 1
        try:
            return self._auth.VerifySignature(request, timeout=10)
        except grpc.RpcError as error:
            exc = from_rpc_error(error)
            if exc.code == grpc.StatusCode.UNAUTHENTICATED:
                raise signature_mismatch() from None
            raise from_quarry(exc) from None
