"""The gateway's SigV4 canonicalization (quarry.s3gateway.sigv4) against botocore's own
signer, and the Auth side's check (quarry.auth.sigv4_secrets): a request botocore signs is
accepted, any change to what was signed is refused."""

from __future__ import annotations

import calendar
import time
from urllib.parse import parse_qsl, urlsplit

import pytest
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from quarry.auth.sigv4_secrets import Scope, SecretSealer, signatures_match
from quarry.s3gateway import sigv4
from quarry.s3gateway.errors import S3Error

KEY_ID = "AKIAQTESTKEY00000001"
SECRET = "s3cr3t/with+odd=chars0123456789abcdefgh"


def _signed_request(prepared) -> sigv4.SignedRequest:
    parts = urlsplit(prepared.url)
    headers: dict[str, list[str]] = {}
    for name, value in prepared.headers.items():
        headers.setdefault(name.lower(), []).append(
            value if isinstance(value, str) else value.decode()
        )
    headers.setdefault("host", [parts.netloc])
    return sigv4.SignedRequest(
        prepared.method,
        parts.path,
        parse_qsl(parts.query, keep_blank_values=True),
        headers,
    )


def _verify(request: sigv4.SignedRequest, secret: str = SECRET) -> bool:
    signature = sigv4.parse(request)
    assert signature is not None
    text = sigv4.string_to_sign(request, signature)
    scope = Scope(signature.date, signature.region, signature.service)
    return signatures_match(secret, scope, [(text, signature.signature)])


def _header_signed(method: str, url: str, body: bytes = b"", headers=None):
    request = AWSRequest(method=method, url=url, data=body, headers=headers or {})
    S3SigV4Auth(Credentials(KEY_ID, SECRET), "s3", "us-east-1").add_auth(request)
    return request.prepare()


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:7406/repo/main/data/file.parquet",
        "http://127.0.0.1:7406/repo?list-type=2&prefix=main%2Fa%20b%2F&delimiter=%2F",
        "http://127.0.0.1:7406/repo/main/caf%C3%A9%20%2B%20%28x%29%21.txt",
        "http://127.0.0.1:7406/repo/main/x?uploads",
        "http://127.0.0.1:7406/",
    ],
)
def test_header_signatures_from_botocore_verify(url):
    prepared = _header_signed("GET", url)
    assert _verify(_signed_request(prepared))


def test_a_signed_put_with_its_payload_hash_verifies_and_a_changed_header_does_not():
    prepared = _header_signed(
        "PUT",
        "http://127.0.0.1:7406/repo/main/a.txt",
        b"hello",
        {"Content-Type": "text/plain", "x-amz-meta-owner": "  two   spaces "},
    )
    request = _signed_request(prepared)
    assert _verify(request)
    assert not _verify(request, secret=SECRET + "x")
    request.headers["content-type"] = ["application/json"]
    assert not _verify(request)


def test_a_changed_path_or_query_is_refused():
    request = _signed_request(_header_signed("GET", "http://h/repo/main/a.txt?x=1"))
    assert _verify(request)
    moved = sigv4.SignedRequest(request.method, "/repo/main/b.txt", request.query, request.headers)
    assert not _verify(moved)
    queried = sigv4.SignedRequest(request.method, request.raw_path, [("x", "2")], request.headers)
    assert not _verify(queried)


def test_presigned_urls_from_botocore_verify_until_they_expire():
    request = AWSRequest(method="GET", url="http://127.0.0.1:7406/repo/main/a%20b.txt")
    S3SigV4QueryAuth(Credentials(KEY_ID, SECRET), "s3", "us-east-1", expires=60).add_auth(request)
    signed = _signed_request(request.prepare())
    assert _verify(signed)
    signature = sigv4.parse(signed)
    assert signature.presigned and signature.expires == 60
    signed_at = calendar.timegm(time.strptime(signature.amz_date, "%Y%m%dT%H%M%SZ"))
    sigv4.check_time(signature, signed_at + 59, 900)
    with pytest.raises(S3Error) as refused:
        sigv4.check_time(signature, signed_at + 61, 900)
    assert refused.value.code == "AccessDenied" and "expired" in refused.value.message


def test_a_request_signed_too_long_ago_is_refused_as_skewed():
    signature = sigv4.parse(_signed_request(_header_signed("GET", "http://h/repo")))
    now = calendar.timegm(time.strptime(signature.amz_date, "%Y%m%dT%H%M%SZ"))
    sigv4.check_time(signature, now + 899, 900)
    for off in (901, -901):
        with pytest.raises(S3Error) as refused:
            sigv4.check_time(signature, now + off, 900)
        assert refused.value.code == "RequestTimeTooSkewed"


def test_the_aws_documented_chunked_upload_example_decodes_and_verifies():
    """AWS's worked example of STREAMING-AWS4-HMAC-SHA256-PAYLOAD (the S3 API reference,
    "Transferring Payload in Multiple Chunks"): 66560 bytes of "a" in chunks of 64 KiB and
    1 KiB, with its published seed and chunk signatures."""
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    seed = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
    chunks = [
        (b"a" * 65536, "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648"),
        (b"a" * 1024, "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497"),
        (b"", "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9"),
    ]
    body = b"".join(
        f"{len(data):x};chunk-signature={sig}\r\n".encode() + data + b"\r\n" for data, sig in chunks
    )
    signature = sigv4.Signature(
        access_key_id="AKIAIOSFODNN7EXAMPLE",
        date="20130524",
        region="us-east-1",
        service="s3",
        signed_headers=(),
        signature=seed,
        amz_date="20130524T000000Z",
        payload_hash=sigv4.STREAMING_PAYLOAD,
    )
    stream = iter([body[i : i + 1000] for i in range(0, len(body), 1000)])
    decoder = sigv4.ChunkedDecoder(lambda n: next(stream, b""), signature, seed)
    payload = b"".join(iter(lambda: decoder.read(4096), b""))
    assert payload == b"a" * 66560
    assert [s for _, s in decoder.signed] == [sig for _, sig in chunks]
    scope = Scope("20130524", "us-east-1", "s3")
    assert signatures_match(secret, scope, decoder.signed)
    # A chunk whose bytes changed no longer matches its signature.
    tampered = body.replace(b"a" * 10, b"b" * 10, 1)
    stream = iter([tampered])
    decoder = sigv4.ChunkedDecoder(lambda n: next(stream, b""), signature, seed)
    b"".join(iter(lambda: decoder.read(4096), b""))
    assert not signatures_match(secret, scope, decoder.signed)


def test_a_truncated_chunked_body_is_refused():
    body = b"400;chunk-signature=" + b"0" * 64 + b"\r\n" + b"a" * 100
    stream = iter([body])
    signature = sigv4.Signature("K", "20130524", "r", "s3", (), "0" * 64, "20130524T000000Z", "x")
    decoder = sigv4.ChunkedDecoder(lambda n: next(stream, b""), signature, "0" * 64)
    with pytest.raises(S3Error) as refused:
        while decoder.read(4096):
            pass
    assert refused.value.code == "IncompleteBody"


def test_a_sealed_secret_opens_only_for_its_credential_and_key():
    sealer = SecretSealer(b"k" * 32)
    sealed = sealer.seal(KEY_ID, SECRET)
    assert SECRET.encode() not in sealed
    assert sealer.open(KEY_ID, sealed) == SECRET
    assert sealer.open("AKIAQOTHERKEY0000001", sealed) is None  # moved to another credential
    assert SecretSealer(b"j" * 32).open(KEY_ID, sealed) is None  # another signing key
    assert sealer.open(KEY_ID, b"") is None  # a credential made before sealing existed


def test_a_signature_is_never_checked_against_another_scope():
    request = _signed_request(_header_signed("GET", "http://h/repo"))
    signature = sigv4.parse(request)
    text = sigv4.string_to_sign(request, signature)
    assert signatures_match(
        SECRET, Scope(signature.date, "us-east-1", "s3"), [(text, signature.signature)]
    )
    assert not signatures_match(
        SECRET, Scope(signature.date, "eu-west-1", "s3"), [(text, signature.signature)]
    )
