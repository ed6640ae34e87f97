"""The gateway's signature check (quarry.s3gateway.verifier): after Auth verified one
signature, the same credential's next signatures of the scope are checked with the scoped key
Auth derived, without an Auth call, for at most the TTL; a revoked credential stops working
within it; a wrong signature is never accepted from the cache. The clock is injected: time is
moved, never slept past. The e2e twin (a real gateway, a credential deleted through Auth) is
tests/e2e/test_s3_gateway.py::test_a_deleted_credential_stops_working_within_the_cache_ttl."""

from __future__ import annotations

import grpc
import pytest

from quarry.auth.sigv4_secrets import Scope, sign, signatures_match, signing_key
from quarry.s3gateway import sigv4
from quarry.s3gateway.errors import S3Error
from quarry.s3gateway.verifier import SignatureVerifier
from quarry.v1 import auth_pb2

KEY_ID = "AKIAQTESTKEY00000001"
SECRET = "s3cr3t/with+odd=chars0123456789abcdefgh"
SCOPE = Scope("20261127", "us-east-1", "s3")
TTL = 10.0


class _Refused(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAUTHENTICATED

    def details(self):
        return "the request signature does not match"

    def trailing_metadata(self):
        return ()


class FakeAuth:
    """Auth/VerifySignature over one credential that can be revoked."""

    def __init__(self) -> None:
        self.revoked = False
        self.calls = 0

    def VerifySignature(self, request, timeout=None):
        self.calls += 1
        scope = Scope(request.date, request.region, request.service)
        signed = [(s.string_to_sign, s.signature) for s in request.signed]
        if (
            self.revoked
            or request.access_key_id != KEY_ID
            or not signatures_match(SECRET, scope, signed)
        ):
            raise _Refused()
        key = signing_key(SECRET, scope.date, scope.region, scope.service)
        return auth_pb2.VerifySignatureResponse(
            token=f"token-{self.calls}",
            user_id="alice",
            signing_key=key if request.want_signing_key else b"",
        )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _signature(scope: Scope = SCOPE) -> sigv4.Signature:
    return sigv4.Signature(
        access_key_id=KEY_ID,
        date=scope.date,
        region=scope.region,
        service=scope.service,
        signed_headers=("host",),
        signature="",
        amz_date=scope.date + "T120000Z",
        payload_hash="UNSIGNED-PAYLOAD",
        presigned=False,
        expires=0,
    )


def _signed(text: str, scope: Scope = SCOPE, secret: str = SECRET) -> list[tuple[str, str]]:
    string_to_sign = f"AWS4-HMAC-SHA256\n{scope.date}T120000Z\n{scope.line()}\n{text}"
    key = signing_key(secret, scope.date, scope.region, scope.service)
    return [(string_to_sign, sign(key, string_to_sign))]


@pytest.fixture
def setup():
    auth, clock = FakeAuth(), Clock()
    return auth, clock, SignatureVerifier(auth, TTL, clock=clock)


def test_signatures_after_the_first_are_checked_without_auth(setup):
    auth, _clock, verifier = setup
    first = verifier.verify(_signature(), _signed("request-1"))
    for n in range(2, 6):
        assert verifier.verify(_signature(), _signed(f"request-{n}")) == first
    assert auth.calls == 1


def test_a_revoked_credential_stops_working_within_the_ttl(setup):
    """Safety: an entry is used for at most TTL seconds after Auth's verification, whatever
    the hits meanwhile; then Auth decides again, and refuses the revoked credential."""
    auth, clock, verifier = setup
    verifier.verify(_signature(), _signed("before"))
    auth.revoked = True
    clock.now += TTL / 2
    verifier.verify(_signature(), _signed("within the ttl"))  # the bounded staleness
    clock.now += TTL / 2  # exactly TTL after the verification: hits did not extend it
    with pytest.raises(S3Error) as refused:
        verifier.verify(_signature(), _signed("after"))
    assert refused.value.code == "SignatureDoesNotMatch"
    assert auth.calls == 2


def test_a_wrong_signature_is_never_accepted_from_the_cache(setup):
    auth, _clock, verifier = setup
    verifier.verify(_signature(), _signed("good"))
    with pytest.raises(S3Error) as refused:
        verifier.verify(_signature(), _signed("forged", secret=SECRET + "x"))
    assert refused.value.code == "SignatureDoesNotMatch"
    assert auth.calls == 2  # the mismatch went to Auth, which refused it


def test_a_cached_key_is_only_used_for_its_own_scope(setup):
    auth, _clock, verifier = setup
    verifier.verify(_signature(), _signed("day one"))
    other_day = Scope("20261128", "us-east-1", "s3")
    verifier.verify(_signature(other_day), _signed("day two", other_day))
    assert auth.calls == 2
    # A string naming another scope than the signature's is refused even with the right key.
    with pytest.raises(S3Error):
        verifier.verify(_signature(), _signed("scope mixed", other_day))


def test_ttl_zero_asks_auth_every_time():
    auth = FakeAuth()
    verifier = SignatureVerifier(auth, 0, clock=Clock())
    for n in range(3):
        verifier.verify(_signature(), _signed(f"r{n}"))
    assert auth.calls == 3
