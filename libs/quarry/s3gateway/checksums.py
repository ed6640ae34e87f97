"""S3's additional checksums of a written body: `x-amz-checksum-ALGORITHM` as a header, or
announced by `x-amz-trailer` and sent as a trailer of an aws-chunked body (what current
SDKs send by default; over unsigned-payload modes it is the body's only integrity check).

Safety rule: a body whose checksum does not match what the request claims is refused
(BadDigest) before anything it carries is staged, like a wrong Content-MD5. CRC32, CRC32C,
SHA-1 and SHA-256 are computed while the body streams (no second read). CRC64NVME is
accepted without being verified (README: S3 gateway), as no library here computes it.

A verified checksum is answered back (PutObject, UploadPart) and kept with the object (a
PUT's, a completed upload's FULL_OBJECT one), then answered by GetObject/HeadObject with
ChecksumMode=ENABLED; an unverified one never is.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import zlib
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import crc32c

from quarry.s3gateway.errors import S3Error
from quarry.s3gateway.request import Request

log = logging.getLogger(__name__)

HEADER_PREFIX = "x-amz-checksum-"
NOT_VERIFIED = frozenset({"crc64nvme"})


class _Crc:
    """A running CRC (zlib.crc32's or crc32c's signature) with hashlib's update/digest."""

    def __init__(self, function: Callable[[bytes, int], int]) -> None:
        self._function = function
        self._value = 0

    def update(self, data: bytes) -> None:
        self._value = self._function(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(4, "big")


_DIGESTERS: dict[str, Callable[[], Any]] = {
    "crc32": lambda: _Crc(zlib.crc32),
    "crc32c": lambda: _Crc(crc32c.crc32c),
    "sha1": hashlib.sha1,
    "sha256": hashlib.sha256,
}
_SIZES = {"crc32": 4, "crc32c": 4, "sha1": 20, "sha256": 32}


@dataclass(frozen=True)
class Claim:
    """The checksum a request claims for its body: the algorithm, and the base64 value
    (None while it is still to come as a trailer)."""

    algorithm: str
    value: str | None

    @property
    def name(self) -> str:
        return HEADER_PREFIX + self.algorithm


def claimed(request: Request, chunked: bool) -> Claim | None:
    """The body's claimed checksum (None when it claims none); InvalidRequest for more than
    one, an unknown algorithm, or a trailer announced on a body that cannot carry one."""
    headers = [
        name
        for name in request.headers
        if name.startswith(HEADER_PREFIX) and name != HEADER_PREFIX + "type"
    ]
    trailer = request.header("x-amz-trailer").strip().lower()
    if trailer and not chunked:
        raise S3Error("InvalidRequest", "x-amz-trailer needs an aws-chunked body", 400)
    if trailer and not trailer.startswith(HEADER_PREFIX):
        raise S3Error("InvalidRequest", f"unsupported trailer {trailer!r}", 400)
    named = headers + ([trailer] if trailer else [])
    if not named:
        return None
    if len(named) > 1:
        raise S3Error("InvalidRequest", "Expecting a single x-amz-checksum- header", 400)
    algorithm = named[0][len(HEADER_PREFIX) :]
    if algorithm not in _DIGESTERS and algorithm not in NOT_VERIFIED:
        raise S3Error("InvalidRequest", f"Value for {named[0]} header is invalid.", 400)
    return Claim(algorithm, None if trailer else request.header(named[0]).strip())


def verifiable_header(request: Request) -> bool:
    """Whether the request carries an x-amz-checksum-* header the gateway verifies (not
    CRC64NVME, accepted unverified)."""
    return any(request.header(HEADER_PREFIX + algorithm) for algorithm in _DIGESTERS)


class Summing:
    """`read` passed through, computing `claim`'s checksum of what it returns."""

    def __init__(self, read: Callable[[int], bytes], claim: Claim) -> None:
        self._read = read
        self.claim = claim
        factory = _DIGESTERS.get(claim.algorithm)
        self._digest = factory() if factory is not None else None

    def read(self, size: int) -> bytes:
        data = self._read(size)
        if self._digest is not None:
            self._digest.update(data)
        return data

    def verify(self, trailers: dict[str, str]) -> Claim | None:
        """BadDigest unless the body matched the claimed value (the header's, else the
        trailer's); InvalidRequest when the value is missing or not a checksum. The claim
        with its value once verified (None: an algorithm accepted unverified)."""
        claim = self.claim
        value = claim.value if claim.value is not None else trailers.get(claim.name)
        if value is None:
            raise S3Error("InvalidRequest", f"the announced {claim.name} trailer is missing", 400)
        if self._digest is None:
            log.info("%s of a written body accepted without verification", claim.name)
            return None
        try:
            expected = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            expected = b""
        if len(expected) != _SIZES[claim.algorithm]:
            raise S3Error("InvalidRequest", f"Value for {claim.name} header is invalid.", 400)
        if expected != self._digest.digest():
            raise S3Error(
                "BadDigest",
                f"The {claim.algorithm.upper()} you specified did not match the calculated "
                "checksum.",
                400,
            )
        return Claim(claim.algorithm, base64.b64encode(expected).decode("ascii"))


# ---- a checksum computed for a copy --------------------------------------------------------


def requested(request: Request) -> str | None:
    """The algorithm a CopyObject asks its copy's checksum in (x-amz-checksum-algorithm;
    None: none asked); InvalidRequest for one not computed here (CRC64NVME among them:
    refused, never answered without the checksum asked for)."""
    name = request.header("x-amz-checksum-algorithm").strip().lower()
    if not name:
        return None
    if name not in _DIGESTERS:
        raise S3Error(
            "InvalidRequest",
            f"x-amz-checksum-algorithm {name.upper()} is not supported here (CRC32, CRC32C, "
            "SHA1 or SHA256)",
            400,
        )
    return name


class Computing:
    """`algorithm`'s checksum of bytes fed to it, as the Claim a verified body's would be."""

    def __init__(self, algorithm: str) -> None:
        self._algorithm = algorithm
        self._digest = _DIGESTERS[algorithm]()

    def update(self, data: bytes) -> None:
        self._digest.update(data)

    def claim(self) -> Claim:
        return Claim(self._algorithm, base64.b64encode(self._digest.digest()).decode("ascii"))


# ---- the checksums a CompleteMultipartUpload names ---------------------------------------

# A <Part>'s checksum elements, as SDKs send them (the value UploadPart answered).
PART_ELEMENTS = {
    "ChecksumCRC32": "crc32",
    "ChecksumCRC32C": "crc32c",
    "ChecksumSHA1": "sha1",
    "ChecksumSHA256": "sha256",
    "ChecksumCRC64NVME": "crc64nvme",
}


def listed(values: Mapping[str, str]) -> Claim | None:
    """The checksum a Complete's <Part> names (element name -> text; None: none);
    InvalidRequest for more than one."""
    named = [(PART_ELEMENTS[tag], value.strip()) for tag, value in values.items() if value.strip()]
    if len(named) > 1:
        raise S3Error("InvalidRequest", "a part names more than one checksum", 400)
    return Claim(*named[0]) if named else None


class Expected:
    """A claimed checksum of bytes read elsewhere (a part, a whole object), computed as
    they pass: `matches()` once they all did (True for an algorithm not verified here)."""

    def __init__(self, claim: Claim) -> None:
        self.claim = claim
        factory = _DIGESTERS.get(claim.algorithm)
        self._digest = factory() if factory is not None else None

    def update(self, data: bytes) -> None:
        if self._digest is not None:
            self._digest.update(data)

    @property
    def verifies(self) -> bool:
        """Whether the algorithm is one computed here (matches() then means it)."""
        return self._digest is not None

    def matches(self) -> bool:
        if self._digest is None:
            return True
        try:
            expected = base64.b64decode(self.claim.value or "", validate=True)
        except (binascii.Error, ValueError):
            return False
        return expected == self._digest.digest()


# ---- a verified checksum kept with the object --------------------------------------------

# An object's verified checksum is kept in its entry's metadata under this prefix and the
# algorithm (never as an x-amz-meta-* header), as "<base64 value> <the entry's checksum>",
# and answered, as S3 does, in the PUT's response and in a whole-object GET or HEAD that
# asks for it (`x-amz-checksum-mode: ENABLED`): an SDK then checks the bytes it read end to
# end. The entry's checksum binds it to those bytes: metadata is anyone's to write through
# the CLI and gRPC, and a value set there, or carried over to an entry of other bytes (a
# tool re-staging an object with its metadata copied), is never answered -- a reader's SDK
# would refuse a good object.
STORED_PREFIX = "quarry.checksum."


def stored_key(claim: Claim) -> str:
    return STORED_PREFIX + claim.algorithm


def stored_value(claim: Claim, entry_checksum: str) -> str:
    return f"{claim.value} {entry_checksum}"


def keep(metadata: MutableMapping[str, str], claim: Claim | None, entry_checksum: str) -> None:
    """`claim` as the one checksum `metadata` keeps for the bytes `entry_checksum` names (an
    object has one, as in S3); None: none kept."""
    for name in [name for name in metadata if name.startswith(STORED_PREFIX)]:
        del metadata[name]
    if claim is not None and claim.value is not None:
        metadata[stored_key(claim)] = stored_value(claim, entry_checksum)


def stored(metadata: Mapping[str, str], entry_checksum: str) -> Claim | None:
    """The checksum an entry's metadata keeps for the bytes `entry_checksum` names (None:
    none, one bound to other bytes, or not a well-formed one of an algorithm verified on
    write: a malformed value must not become a header)."""
    for algorithm, size in _SIZES.items():
        value, _, bound = metadata.get(STORED_PREFIX + algorithm, "").partition(" ")
        if not value or bound != entry_checksum:
            continue
        try:
            if len(base64.b64decode(value, validate=True)) == size:
                return Claim(algorithm, value)
        except (binascii.Error, ValueError):
            pass
    return None


def response_headers(claim: Claim | None) -> list[tuple[str, str]]:
    if claim is None or claim.value is None:
        return []
    return [(claim.name, claim.value), (HEADER_PREFIX + "type", "FULL_OBJECT")]


def result_elements(claim: Claim | None) -> list[tuple[str, str]]:
    """The checksum as elements of a CopyObjectResult (ChecksumSHA256, ChecksumType)."""
    if claim is None or claim.value is None:
        return []
    element = next(tag for tag, algorithm in PART_ELEMENTS.items() if algorithm == claim.algorithm)
    return [(element, claim.value), ("ChecksumType", "FULL_OBJECT")]


def asked_for(request: Request) -> bool:
    """Whether a GET or HEAD asks for the object's checksum (ChecksumMode=ENABLED)."""
    return request.header("x-amz-checksum-mode").strip().upper() == "ENABLED"
