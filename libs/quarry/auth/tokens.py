"""Bearer tokens: JWT, HS256 only, signed with the suite's signing key.

Claims: `sub` (user id or service name), `typ` ("user" or "service"), `iat`, `exp`, `iss`
("quarry") and, for a token issued by Login, `akid` (the access key it was issued against,
so deleting that credential revokes the token).

Safety rule: `verify` never accepts a token it did not sign with the key under HS256: no
`alg: none`, no other algorithm (the header is checked before PyJWT is asked), no expired
token, no token without an expiry, no unknown token type, no token issued in the future
(`iat` past the clock skew) and none living longer than MAX_LIFETIME_SECONDS (`exp - iat`),
so a token minted with a stolen key and a far expiry is refused anyway. Each refusal has its
own reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import jwt

from quarry.auth import errors as auth_errors
from quarry.config import MAX_TOKEN_LIFETIME_SECONDS

ALGORITHM = "HS256"
ISSUER = "quarry"
USER = "user"
SERVICE = "service"
TOKEN_TYPES = (USER, SERVICE)
DEFAULT_LIFETIME_SECONDS = 3600
MAX_LIFETIME_SECONDS = MAX_TOKEN_LIFETIME_SECONDS
# How far in the future a token's `iat` may be: the clocks of the suite's processes differ.
CLOCK_SKEW_SECONDS = 60
MIN_KEY_BYTES = 32  # RFC 7518 §3.2: an HS256 key at least as long as the hash


@dataclass(frozen=True)
class Principal:
    """Who is calling: a user (by id) or one of the suite's services (by name)."""

    kind: str  # USER or SERVICE
    id: str
    access_key_id: str = ""
    expires_at: float = 0.0
    # The Quarry service that relays this user's call, proven by its own token
    # (quarry.auth.interceptor.RELAY_HEADER): the S3 gateway or the console staging bytes it
    # wrote itself. Never set from anything a user's token says.
    relayed_by: str = ""

    @property
    def is_service(self) -> bool:
        return self.kind == SERVICE

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}"


class TokenAuthority:
    """Issues and verifies the suite's tokens with one signing key."""

    def __init__(self, signing_key: bytes | str, clock: Callable[[], float] = time.time):
        key = signing_key.encode() if isinstance(signing_key, str) else bytes(signing_key)
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"the signing key must be at least {MIN_KEY_BYTES} bytes")
        self._key = key
        self._clock = clock

    def now(self) -> float:
        """The clock tokens' issue and expiry times are read against (tests may move it)."""
        return self._clock()

    def issue_user_token(
        self, user_id: str, lifetime: float = DEFAULT_LIFETIME_SECONDS, access_key_id: str = ""
    ) -> tuple[str, float]:
        """(token, expires_at in epoch seconds)."""
        extra = {"akid": access_key_id} if access_key_id else {}
        return self._issue(USER, user_id, lifetime, extra)

    def issue_service_token(
        self, service_name: str, lifetime: float = DEFAULT_LIFETIME_SECONDS
    ) -> tuple[str, float]:
        return self._issue(SERVICE, service_name, lifetime, {})

    def _issue(
        self, kind: str, subject: str, lifetime: float, extra: dict[str, str]
    ) -> tuple[str, float]:
        if not subject:
            raise ValueError("a token needs a subject")
        if not 0 < lifetime <= MAX_LIFETIME_SECONDS:
            raise ValueError(f"a token lives 0..{MAX_LIFETIME_SECONDS} seconds, not {lifetime}")
        now = self._clock()
        expires_at = now + lifetime
        claims = {
            "iss": ISSUER,
            "sub": subject,
            "typ": kind,
            "iat": int(now),
            "exp": int(expires_at),
            **extra,
        }
        return jwt.encode(claims, self._key, algorithm=ALGORITHM), float(int(expires_at))

    def verify(self, token: str | None) -> Principal:
        """The principal of a valid token; an Unauthenticated subclass naming why not."""
        if not token:
            raise auth_errors.TokenMissing(
                "no bearer token: send `authorization: Bearer <token>` (Auth/Login issues one)"
            )
        try:
            header = jwt.get_unverified_header(token)
        except jwt.DecodeError:
            raise auth_errors.TokenMalformed("the bearer token is not a JWT") from None
        algorithm = header.get("alg")
        if algorithm != ALGORITHM:
            raise auth_errors.TokenAlgorithm(
                f"token algorithm {str(algorithm)[:20]!r} refused; only {ALGORITHM} is accepted",
                metadata={"algorithm": str(algorithm)[:20]},
            )
        try:
            # Expiry is checked below against our clock (PyJWT would read the wall clock).
            claims = jwt.decode(
                token,
                self._key,
                algorithms=[ALGORITHM],
                issuer=ISSUER,
                options={
                    "require": ["exp", "iat", "sub", "iss"],
                    "verify_exp": False,
                    "verify_iat": False,
                },
            )
        except jwt.InvalidSignatureError:
            raise auth_errors.TokenInvalidSignature(
                "the bearer token's signature does not verify"
            ) from None
        except jwt.InvalidAlgorithmError:
            raise auth_errors.TokenAlgorithm(f"only {ALGORITHM} tokens are accepted") from None
        except jwt.PyJWTError as exc:
            raise auth_errors.TokenMalformed(f"the bearer token is malformed: {exc}") from None
        expires_at, issued_at = claims["exp"], claims["iat"]
        if not isinstance(expires_at, int | float) or not isinstance(issued_at, int | float):
            raise auth_errors.TokenMalformed("the bearer token's exp or iat is not a number")
        now = self._clock()
        if expires_at <= now:
            raise auth_errors.TokenExpired("the bearer token has expired; log in again")
        if issued_at > now + CLOCK_SKEW_SECONDS:
            raise auth_errors.TokenNotYetValid(
                "the bearer token is issued in the future; check the clocks, log in again"
            )
        if expires_at - issued_at > MAX_LIFETIME_SECONDS:
            raise auth_errors.TokenLifetimeExceeded(
                f"the bearer token lives {int(expires_at - issued_at)} s, longer than the "
                f"{MAX_LIFETIME_SECONDS} s any Quarry token may; log in again"
            )
        kind = claims.get("typ")
        if kind not in TOKEN_TYPES:
            raise auth_errors.TokenTypeUnknown(
                f"token type {str(kind)[:20]!r} is not one of {', '.join(TOKEN_TYPES)}",
                metadata={"type": str(kind)[:20]},
            )
        subject = claims["sub"]
        access_key_id = claims.get("akid", "")
        if not isinstance(subject, str) or not subject or not isinstance(access_key_id, str):
            raise auth_errors.TokenMalformed("the bearer token's subject is malformed")
        return Principal(kind, subject, access_key_id, float(expires_at))
