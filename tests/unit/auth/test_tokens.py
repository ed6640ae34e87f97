"""Bearer tokens: every bad token is UNAUTHENTICATED with its own reason."""

from __future__ import annotations

import base64
import json

import jwt
import pytest

from quarry.auth import errors as auth_errors
from quarry.auth.tokens import TokenAuthority

KEY = b"k" * 32


class Clock:
    def __init__(self, now: float = 1_700_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def refused(authority: TokenAuthority, token, reason: str) -> None:
    with pytest.raises(auth_errors.Unauthenticated) as caught:
        authority.verify(token)
    assert caught.value.reason == reason, caught.value.message
    assert caught.value.code.name == "UNAUTHENTICATED"


def test_user_and_service_tokens_verify():
    clock = Clock()
    authority = TokenAuthority(KEY, clock=clock)
    token, expires_at = authority.issue_user_token("alice", lifetime=60, access_key_id="AKIAQX")
    principal = authority.verify(token)
    assert (principal.kind, principal.id, principal.access_key_id) == ("user", "alice", "AKIAQX")
    assert expires_at == clock.now + 60
    service = authority.verify(authority.issue_service_token("committer")[0])
    assert service.is_service and service.id == "committer"


def test_missing_and_malformed():
    authority = TokenAuthority(KEY)
    refused(authority, None, "TOKEN_MISSING")
    refused(authority, "", "TOKEN_MISSING")
    refused(authority, "not a jwt", "TOKEN_MALFORMED")
    refused(authority, "a.b.c", "TOKEN_MALFORMED")


def test_expired():
    clock = Clock()
    authority = TokenAuthority(KEY, clock=clock)
    token, _ = authority.issue_user_token("alice", lifetime=10)
    clock.now += 9
    authority.verify(token)
    clock.now += 1
    refused(authority, token, "TOKEN_EXPIRED")


def test_wrong_signature():
    token, _ = TokenAuthority(b"x" * 32).issue_user_token("alice")
    refused(TokenAuthority(KEY), token, "TOKEN_INVALID_SIGNATURE")
    # A tampered payload with the original signature.
    good, _ = TokenAuthority(KEY).issue_user_token("alice")
    header, _payload, signature = good.split(".")
    forged = ".".join(
        [
            header,
            b64({"sub": "admin", "typ": "user", "iss": "quarry", "iat": 1, "exp": 2**40}),
            signature,
        ]
    )
    refused(TokenAuthority(KEY), forged, "TOKEN_INVALID_SIGNATURE")


def test_alg_none_and_other_algorithms():
    claims = {"sub": "admin", "typ": "user", "iss": "quarry", "iat": 1, "exp": 2**40}
    authority = TokenAuthority(KEY)
    none_token = f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64(claims)}."
    refused(authority, none_token, "TOKEN_ALGORITHM")
    for variant in ("None", "NONE", "nOnE"):
        refused(authority, f"{b64({'alg': variant})}.{b64(claims)}.", "TOKEN_ALGORITHM")
    refused(authority, jwt.encode(claims, KEY * 2, algorithm="HS512"), "TOKEN_ALGORITHM")
    refused(authority, f"{b64({'alg': 'RS256'})}.{b64(claims)}.c2ln", "TOKEN_ALGORITHM")
    refused(authority, f"{b64({'typ': 'JWT'})}.{b64(claims)}.c2ln", "TOKEN_ALGORITHM")


def test_unknown_type_and_missing_claims():
    clock = Clock()
    authority = TokenAuthority(KEY, clock=clock)
    now = int(clock.now)
    base = {"sub": "alice", "iss": "quarry", "iat": now, "exp": now + 600}
    refused(
        authority, jwt.encode({**base, "typ": "root"}, KEY, algorithm="HS256"), "TOKEN_TYPE_UNKNOWN"
    )
    refused(authority, jwt.encode(base, KEY, algorithm="HS256"), "TOKEN_TYPE_UNKNOWN")
    no_exp = {k: v for k, v in base.items() if k != "exp"}
    refused(
        authority, jwt.encode({**no_exp, "typ": "user"}, KEY, algorithm="HS256"), "TOKEN_MALFORMED"
    )
    refused(
        authority,
        jwt.encode({**base, "typ": "user", "iss": "lakefs"}, KEY, algorithm="HS256"),
        "TOKEN_MALFORMED",
    )


def test_short_signing_keys_are_refused():
    with pytest.raises(ValueError):
        TokenAuthority(b"short")


def _signed(claims: dict) -> str:
    """A token signed with the real key (as a holder of a leaked key would mint one)."""
    return jwt.encode({"iss": "quarry", "sub": "mallory", "typ": "user", **claims}, KEY, "HS256")


def test_a_token_issued_in_the_future_is_refused():
    clock = Clock()
    authority = TokenAuthority(KEY, clock=clock)
    now = int(clock.now)
    refused(authority, _signed({"iat": now + 3600, "exp": now + 7200}), "TOKEN_NOT_YET_VALID")
    # Within the clock skew between processes: accepted.
    assert authority.verify(_signed({"iat": now + 30, "exp": now + 600})).id == "mallory"


def test_a_token_living_longer_than_the_maximum_is_refused():
    from quarry.auth.tokens import MAX_LIFETIME_SECONDS

    clock = Clock()
    authority = TokenAuthority(KEY, clock=clock)
    now = int(clock.now)
    ten_years = 10 * 365 * 86400
    refused(authority, _signed({"iat": now, "exp": now + ten_years}), "TOKEN_LIFETIME_EXCEEDED")
    refused(
        authority,
        _signed({"iat": now - 10, "exp": now + MAX_LIFETIME_SECONDS}),
        "TOKEN_LIFETIME_EXCEEDED",
    )
    refused(authority, _signed({"iat": "soon", "exp": now + 60}), "TOKEN_MALFORMED")
    assert authority.verify(_signed({"iat": now, "exp": now + MAX_LIFETIME_SECONDS})).id
    # Nor is such a token ever issued.
    with pytest.raises(ValueError):
        authority.issue_user_token("alice", lifetime=MAX_LIFETIME_SECONDS + 1)


def test_the_token_lifetime_setting_is_bounded():
    from quarry import errors
    from quarry.config import load_settings

    with pytest.raises(errors.InvalidArgument):
        load_settings(env={}, auth_token_lifetime_seconds=86_401)
