"""Auth/VerifySignature's scoped signing key (what the s3-gateway checks a credential's next
signatures with, quarry.s3gateway.verifier), over real gRPC as the s3-gateway service.

Safety rules tried here: the key is returned only when asked and only after every signature
matched (a wrong signature gets UNAUTHENTICATED and no key); it is the key of the request's
scope alone (another day's signature does not verify with it); it is not the secret."""

from __future__ import annotations

import grpc
import pytest

from quarry.auth.sigv4_secrets import Scope, sign, signing_key
from quarry.v1 import auth_pb2, auth_pb2_grpc
from support.auth import service_channel
from support.suite import suite_fixture

suite = suite_fixture()
SCOPE = Scope("20261127", "us-east-1", "s3")


def _string_to_sign(text: str, scope: Scope = SCOPE) -> str:
    return f"AWS4-HMAC-SHA256\n{scope.date}T120000Z\n{scope.line()}\n{text}"


@pytest.fixture(scope="module")
def made(suite):
    with suite.client() as client:
        return client.create_credentials("admin")


@pytest.fixture(scope="module")
def auth(suite):
    channel = service_channel(suite.targets["branch-manager"], "s3-gateway")
    yield auth_pb2_grpc.AuthStub(channel)
    channel.close()


def _verify(auth, made, signature: str, want_key: bool, text: str = "request"):
    return auth.VerifySignature(
        auth_pb2.VerifySignatureRequest(
            access_key_id=made.credentials.access_key_id,
            date=SCOPE.date,
            region=SCOPE.region,
            service=SCOPE.service,
            signed=[
                auth_pb2.SignedString(string_to_sign=_string_to_sign(text), signature=signature)
            ],
            want_signing_key=want_key,
        ),
        timeout=10,
    )


def test_the_scoped_key_is_returned_only_when_asked_and_signs_only_its_scope(auth, made):
    secret = made.secret_access_key
    key = signing_key(secret, SCOPE.date, SCOPE.region, SCOPE.service)
    good = sign(key, _string_to_sign("request"))
    assert _verify(auth, made, good, want_key=False).signing_key == b""
    answer = _verify(auth, made, good, want_key=True)
    assert answer.signing_key == key and answer.user_id == "admin"
    assert secret.encode() not in answer.SerializeToString()
    next_day = Scope("20261128", SCOPE.region, SCOPE.service)
    other = _string_to_sign("request", next_day)
    assert sign(answer.signing_key, other) != sign(
        signing_key(secret, next_day.date, next_day.region, next_day.service), other
    )


def test_a_wrong_signature_gets_no_key(auth, made):
    key = signing_key(made.secret_access_key + "x", SCOPE.date, SCOPE.region, SCOPE.service)
    with pytest.raises(grpc.RpcError) as refused:
        _verify(auth, made, sign(key, _string_to_sign("request")), want_key=True)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
