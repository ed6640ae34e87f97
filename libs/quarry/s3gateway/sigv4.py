"""AWS Signature Version 4 on the gateway's side: parse the signature (Authorization header
or presigned query string), rebuild the canonical request and the string to sign exactly as
the client did, and decode `aws-chunked` bodies with their chunk signatures.

The gateway never holds a secret: it hands the strings to sign and the signatures to the
Auth service (Auth/VerifySignature), which checks them with the credential it stores
(quarry.auth.sigv4_secrets). Canonicalization follows the SigV4 specification as S3 applies
it (the path is not normalized; query parameters sorted by encoded name then value) and is
tested against botocore's own signer (tests/unit/test_s3gateway_sigv4.py).

Safety rules: a request is never treated as authenticated unless Auth/VerifySignature
accepted its signature; an `x-amz-*` header the signature does not cover is refused (it
would change what a signed request does); a signed payload hash is checked against the bytes received before
anything they carry is staged; a request dated further than the allowed skew from the
gateway's clock, or a presigned URL past its expiry, is refused before the signature is
even checked.
"""

from __future__ import annotations

import calendar
import functools
import hashlib
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from quarry.s3gateway.errors import S3Error, access_denied, invalid_argument, signature_mismatch

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
STREAMING_PAYLOAD = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
STREAMING_PAYLOAD_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
TRAILER_SIGNATURE = "x-amz-trailer-signature"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
MAX_PRESIGNED_EXPIRY_SECONDS = 7 * 24 * 3600
_CREDENTIAL = re.compile(r"^([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Signature:
    """What a request's SigV4 signature claims."""

    access_key_id: str
    date: str  # YYYYMMDD of the scope
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str
    amz_date: str  # YYYYMMDDTHHMMSSZ
    payload_hash: str  # the hex SHA-256, UNSIGNED-PAYLOAD or a STREAMING-* marker
    presigned: bool = False
    expires: int = 0

    @property
    def scope(self) -> str:
        return f"{self.date}/{self.region}/{self.service}/aws4_request"


@dataclass
class SignedRequest:
    """The parts of an HTTP request SigV4 signs."""

    method: str
    raw_path: str  # as sent, percent-encoded
    query: Sequence[tuple[str, str]]  # decoded pairs, in order
    headers: dict[str, list[str]] = field(default_factory=dict)  # lower-case names

    def header(self, name: str) -> str:
        values = self.headers.get(name)
        return values[0] if values else ""


def _encode(value: str) -> str:
    return quote(value, safe="-_.~")


def parse(request: SignedRequest) -> Signature | None:
    """The request's signature, or None when it carries none (an anonymous request).
    InvalidArgument / AuthorizationHeaderMalformed for a signature that cannot be parsed;
    NotImplemented-style refusal for SigV2."""
    query = dict(request.query)
    if "X-Amz-Signature" in query:
        return _parse_presigned(query)
    header = request.header("authorization")
    if not header:
        if "Signature" in query and "AWSAccessKeyId" in query:
            raise access_denied("AWS Signature Version 2 is not supported; sign with SigV4")
        return None
    if not header.startswith(ALGORITHM + " "):
        if header.startswith("AWS "):
            raise access_denied("AWS Signature Version 2 is not supported; sign with SigV4")
        raise S3Error("AuthorizationHeaderMalformed", "unsupported authorization scheme", 400)
    parts: dict[str, str] = {}
    for item in header[len(ALGORITHM) + 1 :].split(","):
        name, _, value = item.strip().partition("=")
        parts[name] = value
    try:
        credential, signed, signature = (
            parts["Credential"],
            parts["SignedHeaders"],
            parts["Signature"],
        )
    except KeyError:
        raise S3Error(
            "AuthorizationHeaderMalformed", "Credential, SignedHeaders and Signature needed", 400
        ) from None
    key, date, region, service = _credential(credential)
    amz_date = request.header("x-amz-date") or ""
    if not amz_date:
        raise access_denied("AWS authentication requires a valid X-Amz-Date header")
    return Signature(
        access_key_id=key,
        date=date,
        region=region,
        service=service,
        signed_headers=tuple(signed.split(";")),
        signature=signature,
        amz_date=amz_date,
        payload_hash=request.header("x-amz-content-sha256") or EMPTY_SHA256,
    )


def _credential(credential: str) -> tuple[str, str, str, str]:
    found = _CREDENTIAL.match(credential)
    if found is None:
        raise S3Error(
            "AuthorizationHeaderMalformed",
            "the Credential must be KEY/YYYYMMDD/REGION/SERVICE/aws4_request",
            400,
        )
    key, date, region, service = found.groups()
    return key, date, region, service


def _parse_presigned(query: dict[str, str]) -> Signature:
    if query.get("X-Amz-Algorithm") != ALGORITHM:
        raise S3Error(
            "AuthorizationQueryParametersError", "X-Amz-Algorithm must be " + ALGORITHM, 400
        )
    try:
        key, date, region, service = _credential(query["X-Amz-Credential"])
        expires = int(query["X-Amz-Expires"])
        return Signature(
            access_key_id=key,
            date=date,
            region=region,
            service=service,
            signed_headers=tuple(query["X-Amz-SignedHeaders"].split(";")),
            signature=query["X-Amz-Signature"],
            amz_date=query["X-Amz-Date"],
            payload_hash=UNSIGNED_PAYLOAD,
            presigned=True,
            expires=expires,
        )
    except (KeyError, ValueError):
        raise S3Error(
            "AuthorizationQueryParametersError",
            "X-Amz-Credential, X-Amz-Date, X-Amz-Expires, X-Amz-SignedHeaders and "
            "X-Amz-Signature are needed",
            400,
        ) from None


def parse_amz_date(amz_date: str) -> float:
    try:
        return _amz_seconds(amz_date)
    except ValueError:
        raise access_denied(f"X-Amz-Date {amz_date!r} is not YYYYMMDDTHHMMSSZ") from None


@functools.lru_cache(maxsize=256)
def _amz_seconds(amz_date: str) -> float:
    """X-Amz-Date as epoch seconds (ValueError if it does not parse). Cached: the clients of
    one second send the same date, and strptime is most of a signature check's own time."""
    return float(calendar.timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ")))


def check_time(signature: Signature, now: float, max_skew: float) -> None:
    """RequestTimeTooSkewed / AccessDenied (expired) before any signature is checked."""
    signed_at = parse_amz_date(signature.amz_date)
    if signature.amz_date[:8] != signature.date:
        raise signature_mismatch()
    if signature.presigned:
        if not 0 < signature.expires <= MAX_PRESIGNED_EXPIRY_SECONDS:
            raise S3Error(
                "AuthorizationQueryParametersError",
                "X-Amz-Expires must be between 1 and 604800 seconds",
                400,
            )
        if now > signed_at + signature.expires:
            raise access_denied("Request has expired")
        if signed_at - now > max_skew:
            raise S3Error(
                "RequestTimeTooSkewed",
                "The difference between the request time and the server's time is too large.",
                403,
            )
        return
    if abs(now - signed_at) > max_skew:
        raise S3Error(
            "RequestTimeTooSkewed",
            "The difference between the request time and the server's time is too large.",
            403,
        )


def check_signed_headers(request: SignedRequest, signature: Signature) -> None:
    """AccessDenied for an `x-amz-*` header the signature does not cover, as S3 answers.
    Such a header changes what a request does (`x-amz-copy-source` turns a PUT into a copy,
    `x-amz-meta-*` sets metadata), so one added after signing -- to a presigned upload URL,
    say -- would act with the signer's authority on something the signer never signed."""
    covered = set(signature.signed_headers)
    unsigned = sorted(
        name for name in request.headers if name.startswith("x-amz-") and name not in covered
    )
    if unsigned:
        raise access_denied(
            "There were headers present in the request which were not signed: "
            + ", ".join(unsigned)
        )


def canonical_query(query: Sequence[tuple[str, str]], presigned: bool) -> str:
    pairs = sorted(
        (_encode(k), _encode(v)) for k, v in query if not (presigned and k == "X-Amz-Signature")
    )
    return "&".join(f"{k}={v}" for k, v in pairs)


def canonical_uri(raw_path: str) -> str:
    # S3 does not normalize the path (no "." / ".." folding, no slash merging).
    return quote(unquote(raw_path), safe="/~")


def canonical_request(request: SignedRequest, signature: Signature) -> str:
    lines = []
    for name in signature.signed_headers:
        values = request.headers.get(name)
        if values is None:
            raise access_denied(f"signed header {name!r} is missing from the request")
        lines.append(f"{name}:{','.join(' '.join(v.split()) for v in values)}")
    return "\n".join(
        [
            request.method,
            canonical_uri(request.raw_path),
            canonical_query(request.query, signature.presigned),
            "\n".join(lines) + "\n",
            ";".join(signature.signed_headers),
            signature.payload_hash,
        ]
    )


def string_to_sign(request: SignedRequest, signature: Signature) -> str:
    digest = hashlib.sha256(canonical_request(request, signature).encode("utf-8")).hexdigest()
    return "\n".join([ALGORITHM, signature.amz_date, signature.scope, digest])


def chunk_string_to_sign(signature: Signature, previous: str, chunk_sha256: str) -> str:
    """The string each aws-chunked chunk signs: chained to the previous signature."""
    return "\n".join(
        [
            "AWS4-HMAC-SHA256-PAYLOAD",
            signature.amz_date,
            signature.scope,
            previous,
            EMPTY_SHA256,
            chunk_sha256,
        ]
    )


def is_sha256(value: str) -> bool:
    return bool(_HEX64.match(value))


def trailer_string_to_sign(signature: Signature, previous: str, trailers: dict[str, str]) -> str:
    """The string a signed trailer chunk (x-amz-trailer-signature) signs: chained to the
    final, empty chunk's signature; its trailers canonical as `name:value\n` each, by name
    (what the AWS SDKs sign)."""
    canonical = "".join(f"{name}:{trailers[name]}\n" for name in sorted(trailers))
    return "\n".join(
        [
            "AWS4-HMAC-SHA256-TRAILER",
            signature.amz_date,
            signature.scope,
            previous,
            hashlib.sha256(canonical.encode()).hexdigest(),
        ]
    )


def check_payload_hash(signature: Signature) -> None:
    value = signature.payload_hash
    if value in (
        UNSIGNED_PAYLOAD,
        STREAMING_PAYLOAD,
        STREAMING_UNSIGNED_TRAILER,
        STREAMING_PAYLOAD_TRAILER,
    ):
        return
    if not _HEX64.match(value):
        raise invalid_argument(f"x-amz-content-sha256 {value!r} is not a SHA-256 or a known mode")


# ---- aws-chunked ---------------------------------------------------------------------------

MAX_CHUNK_HEADER = 4096


class ChunkedDecoder:
    """Decodes an `aws-chunked` body read from `read(n)` (the raw request stream) into the
    payload bytes, keeping for every chunk its string to sign and claimed signature (signed
    mode) so they can all be checked at the end in one Auth call. Memory: one chunk header
    and at most `n` bytes at a time; never a whole chunk.

    Refuses (IncompleteBody / InvalidChunkSizeError) a body that ends early or is malformed."""

    def __init__(
        self,
        read: Callable[[int], bytes],
        signature: Signature | None,
        seed: str,
        signed_trailer: bool = False,
    ) -> None:
        self._read = read
        self._buffer = b""
        self._signature = signature  # None: unsigned chunks (STREAMING-UNSIGNED-PAYLOAD-TRAILER)
        # STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER: the trailers carry a signature too,
        # chained to the final chunk's (the AWS SDK for Java v2's default upload form).
        self._signed_trailer = signed_trailer and signature is not None
        self._previous = seed
        self._left = 0  # bytes left in the current chunk
        self._chunk_hash = hashlib.sha256()
        self._claimed = ""
        self._done = False
        self.signed: list[tuple[str, str]] = []
        self.trailers: dict[str, str] = {}  # lower-case name -> value, after the last chunk

    def _fill(self, n: int) -> bytes:
        while len(self._buffer) < n:
            more = self._read(max(n - len(self._buffer), 65536))
            if not more:
                raise S3Error("IncompleteBody", "the aws-chunked body ended early", 400)
            self._buffer += more
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    def _line(self) -> str:
        while b"\r\n" not in self._buffer:
            if len(self._buffer) > MAX_CHUNK_HEADER:
                raise S3Error("InvalidChunkSizeError", "an aws-chunked header is too long", 400)
            more = self._read(65536)
            if not more:
                raise S3Error("IncompleteBody", "the aws-chunked body ended early", 400)
            self._buffer += more
        line, _, self._buffer = self._buffer.partition(b"\r\n")
        return line.decode("latin-1")

    def _next_chunk(self) -> None:
        header = self._line()
        size_text, _, ext = header.partition(";")
        try:
            size = int(size_text, 16)
        except ValueError:
            raise S3Error("InvalidChunkSizeError", f"bad chunk size {size_text!r}", 400) from None
        claimed = ext.partition("chunk-signature=")[2].strip()
        if self._signature is not None and not claimed:
            raise signature_mismatch()
        self._left = size
        self._claimed = claimed
        self._chunk_hash = hashlib.sha256()
        if size == 0:
            self._finish_chunk()
            self._done = True
            # Trailers (x-amz-checksum-*), if any, then the final CRLF.
            while line := self._line_or_end():
                name, _, value = line.partition(":")
                self.trailers[name.strip().lower()] = value.strip()
            if self._signed_trailer:
                self._sign_trailers()

    def _sign_trailers(self) -> None:
        """The trailer chunk's claimed signature, kept to be checked with the chunks'
        (SignatureDoesNotMatch when it is missing: the trailers would go unsigned)."""
        assert self._signature is not None
        claimed = self.trailers.pop(TRAILER_SIGNATURE, "")
        if not claimed:
            raise signature_mismatch()
        text = trailer_string_to_sign(self._signature, self._previous, self.trailers)
        self.signed.append((text, claimed))

    def _line_or_end(self) -> str:
        try:
            return self._line()
        except S3Error:
            return ""

    def _finish_chunk(self) -> None:
        if self._signature is None:
            return
        text = chunk_string_to_sign(self._signature, self._previous, self._chunk_hash.hexdigest())
        self.signed.append((text, self._claimed))
        self._previous = self._claimed

    def read(self, n: int = 1 << 20) -> bytes:
        if self._done:
            return b""
        if self._left == 0:
            self._next_chunk()
            if self._done:
                return b""
        take = min(n, self._left)
        if len(self._buffer) >= take:
            data, self._buffer = self._buffer[:take], self._buffer[take:]
        else:
            have, self._buffer = self._buffer, b""
            data = have + self._fill_raw(take - len(have))
        self._left -= len(data)
        self._chunk_hash.update(data)
        if self._left == 0:
            self._fill(2)  # the CRLF after the chunk's data
            self._finish_chunk()
        return data

    def _fill_raw(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            more = self._read(n - len(out))
            if not more:
                raise S3Error("IncompleteBody", "the aws-chunked body ended early", 400)
            if len(out) + len(more) > n:
                self._buffer = more[n - len(out) :]
                more = more[: n - len(out)]
            out += more
        return out


def iter_reader(read: Callable[[int], bytes], size: int = 1 << 20) -> Iterator[bytes]:
    while chunk := read(size):
        yield chunk
