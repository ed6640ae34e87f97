"""The S3 gateway where S3 clients rely on an exact answer, end to end: a real `quarry serve
s3-gateway` process, driven by boto3 and by requests signed with botocore's own SigV4
signer (sent with http.client when a test must change what was signed).

Safety checks, each tried on purpose: an `x-amz-*` header the signature does not cover is
refused (a presigned upload URL cannot be turned into a copy); a conditional write never
replaces an object its condition did not see (one of racing `If-None-Match: *` writers
wins); a body whose claimed checksum does not match is refused and nothing it carries is
staged; one denied key of a DeleteObjects fails only that key; a re-uploaded part replaces
the earlier one."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from urllib.parse import quote, urlsplit

import crc32c
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from support.s3gateway import running_gateway

REPO = "conformance"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with running_gateway(tmp_path_factory.mktemp("s3conf")) as gw:
        with gw.suite.client() as client:
            client.create_repository(REPO, gw.suite.namespace(REPO))
        yield gw


@pytest.fixture(scope="module")
def keys(gateway):
    return gateway.credentials()


@pytest.fixture(scope="module")
def s3(gateway, keys):
    return gateway.s3(keys)


@pytest.fixture
def client(gateway):
    with gateway.suite.client() as c:
        yield c


def _code(error: ClientError) -> str:
    return error.response["Error"]["Code"]


def _staged(client, prefix: str) -> list[str]:
    return [e.path for e in client.iter_objects(REPO, "main", prefix=prefix)]


def _data_files(gateway) -> set[str]:
    data = os.path.join(gateway.suite.namespace(REPO), "data")
    return set(os.listdir(data)) if os.path.isdir(data) else set()


def _send(
    gateway,
    keys,
    method: str,
    key: str,
    body: bytes = b"",
    signed_headers: dict[str, str] | None = None,
    payload: str | None = None,
    added_headers: dict[str, str] | None = None,
    query: str = "",
) -> tuple[int, bytes]:
    """A request signed by botocore (`signed_headers` and the payload hash `payload`,
    default the body's SHA-256), then sent with `added_headers` that the signature does not
    cover; (status, body)."""
    url = f"{gateway.endpoint}/{REPO}/{quote(key)}" + (f"?{query}" if query else "")
    payload_hash = payload or hashlib.sha256(body).hexdigest()

    class Signer(S3SigV4Auth):
        def payload(self, request):
            return payload_hash

    request = AWSRequest(
        method=method,
        url=url,
        headers={"X-Amz-Content-SHA256": payload_hash, **(signed_headers or {})},
    )
    Signer(Credentials(*keys), "s3", "us-east-1").add_auth(request)
    headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
    headers.update(added_headers or {})
    headers["Content-Length"] = str(len(body))
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        connection.request(method, target, body=body, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


# ---- signatures cover every x-amz-* header --------------------------------------------------


def test_a_presigned_upload_url_cannot_be_turned_into_a_copy(gateway, s3, client):
    s3.put_object(Bucket=REPO, Key="main/private/secret.txt", Body=b"the signer may read this")
    url = s3.generate_presigned_url(
        "put_object", Params={"Bucket": REPO, "Key": "main/inbox/upload.bin"}, ExpiresIn=300
    )

    def put(headers: dict[str, str]) -> tuple[int, bytes]:
        request = urllib.request.Request(url, data=b"uploaded", method="PUT", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    status, answer = put({"x-amz-copy-source": f"/{REPO}/main/private/secret.txt"})
    assert status == 403 and b"<Code>AccessDenied</Code>" in answer, answer
    assert b"x-amz-copy-source" in answer  # names the header that was not signed
    assert _staged(client, "inbox/") == []
    status, answer = put({"x-amz-meta-injected": "yes"})
    assert status == 403, answer
    assert _staged(client, "inbox/") == []
    # The URL itself works: what it signed is allowed.
    assert put({})[0] == 200
    got = s3.get_object(Bucket=REPO, Key="main/inbox/upload.bin")
    assert got["Body"].read() == b"uploaded" and got["Metadata"] == {}


def test_a_header_added_after_signing_is_refused(gateway, keys, client):
    body = b"signed body"
    status, answer = _send(
        gateway, keys, "PUT", "main/added/a.txt", body, added_headers={"x-amz-meta-owner": "eve"}
    )
    assert status == 403 and b"<Code>AccessDenied</Code>" in answer, answer
    assert _staged(client, "added/") == []
    # Signed, the same header is fine.
    status, answer = _send(
        gateway, keys, "PUT", "main/added/a.txt", body, signed_headers={"x-amz-meta-owner": "eve"}
    )
    assert status == 200, answer
    assert client.stat_object(REPO, "main", "added/a.txt").metadata["owner"] == "eve"


# ---- conditional writes ------------------------------------------------------------------------


def test_if_none_match_star_writes_only_a_new_key(gateway, s3, client):
    first = s3.put_object(Bucket=REPO, Key="main/cond/new.txt", Body=b"first", IfNoneMatch="*")
    assert first["ResponseMetadata"]["HTTPStatusCode"] == 200
    before = _data_files(gateway)
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=REPO, Key="main/cond/new.txt", Body=b"second", IfNoneMatch="*")
    assert _code(refused.value) == "PreconditionFailed"
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert s3.get_object(Bucket=REPO, Key="main/cond/new.txt")["Body"].read() == b"first"
    assert _data_files(gateway) == before  # the refused write's bytes were removed


def test_racing_if_none_match_writers_have_one_winner(gateway, keys):
    writers = 8
    start = threading.Barrier(writers)
    outcomes: list[str] = []

    def write(i: int) -> None:
        s3 = gateway.s3(keys)
        start.wait()
        try:
            s3.put_object(Bucket=REPO, Key="main/lock/owner", Body=f"{i}".encode(), IfNoneMatch="*")
            outcomes.append(f"won {i}")
        except ClientError as error:
            outcomes.append(_code(error))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [o for o in outcomes if o.startswith("won")]
    assert len(winners) == 1, outcomes
    assert sorted(set(outcomes) - set(winners)) == ["PreconditionFailed"]
    s3 = gateway.s3(keys)
    owner = s3.get_object(Bucket=REPO, Key="main/lock/owner")["Body"].read().decode()
    assert winners == [f"won {owner}"]


def test_if_match_replaces_only_the_object_it_names(gateway, s3, client):
    etag = s3.put_object(Bucket=REPO, Key="main/cas/doc.json", Body=b"v1")["ETag"]
    with pytest.raises(ClientError) as stale:
        s3.put_object(
            Bucket=REPO, Key="main/cas/doc.json", Body=b"v2", IfMatch='"' + "0" * 32 + '"'
        )
    assert _code(stale.value) == "PreconditionFailed"
    assert s3.get_object(Bucket=REPO, Key="main/cas/doc.json")["Body"].read() == b"v1"
    replaced = s3.put_object(Bucket=REPO, Key="main/cas/doc.json", Body=b"v2", IfMatch=etag)
    assert s3.get_object(Bucket=REPO, Key="main/cas/doc.json")["Body"].read() == b"v2"
    # The first ETag is now stale: a second writer holding it loses.
    with pytest.raises(ClientError) as lost:
        s3.put_object(Bucket=REPO, Key="main/cas/doc.json", Body=b"v2-other", IfMatch=etag)
    assert _code(lost.value) == "PreconditionFailed"
    assert s3.head_object(Bucket=REPO, Key="main/cas/doc.json")["ETag"] == replaced["ETag"]
    with pytest.raises(ClientError) as missing:
        s3.put_object(Bucket=REPO, Key="main/cas/none.json", Body=b"x", IfMatch=etag)
    assert _code(missing.value) == "NoSuchKey"
    assert "cas/none.json" not in _staged(client, "cas/")


def test_a_conditional_header_the_gateway_cannot_honour_is_refused(gateway, keys, client):
    status, answer = _send(
        gateway,
        keys,
        "PUT",
        "main/cond/etag.txt",
        b"x",
        signed_headers={"If-None-Match": '"abc"'},
    )
    assert status == 501 and b"<Code>NotImplemented</Code>" in answer, answer
    assert "cond/etag.txt" not in _staged(client, "cond/")


def test_complete_multipart_upload_honours_if_none_match(gateway, s3):
    s3.put_object(Bucket=REPO, Key="main/cond/big.bin", Body=b"already here")
    upload = s3.create_multipart_upload(Bucket=REPO, Key="main/cond/big.bin")["UploadId"]
    part = s3.upload_part(
        Bucket=REPO, Key="main/cond/big.bin", UploadId=upload, PartNumber=1, Body=b"new bytes"
    )
    parts = {"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}
    with pytest.raises(ClientError) as refused:
        s3.complete_multipart_upload(
            Bucket=REPO,
            Key="main/cond/big.bin",
            UploadId=upload,
            MultipartUpload=parts,
            IfNoneMatch="*",
        )
    assert _code(refused.value) == "PreconditionFailed"
    assert s3.get_object(Bucket=REPO, Key="main/cond/big.bin")["Body"].read() == b"already here"
    # The upload is still there: completing it unconditionally works.
    s3.complete_multipart_upload(
        Bucket=REPO, Key="main/cond/big.bin", UploadId=upload, MultipartUpload=parts
    )
    assert s3.get_object(Bucket=REPO, Key="main/cond/big.bin")["Body"].read() == b"new bytes"


# ---- checksums of written bodies ------------------------------------------------------------


def _checksum(algorithm: str, data: bytes) -> str:
    digest = {
        "crc32": lambda: zlib.crc32(data).to_bytes(4, "big"),
        "crc32c": lambda: crc32c.crc32c(data).to_bytes(4, "big"),
        "sha1": lambda: hashlib.sha1(data).digest(),
        "sha256": lambda: hashlib.sha256(data).digest(),
    }[algorithm]()
    return base64.b64encode(digest).decode()


@pytest.mark.parametrize("algorithm", ["crc32", "crc32c", "sha1", "sha256"])
def test_a_checksum_header_is_verified(gateway, keys, client, algorithm):
    data = os.urandom(100_000)
    header = f"x-amz-checksum-{algorithm}"
    key = f"main/sums/{algorithm}.bin"
    status, answer = _send(
        gateway, keys, "PUT", key, data, signed_headers={header: _checksum(algorithm, data)}
    )
    assert status == 200, answer
    before = _data_files(gateway)
    wrong = _checksum(algorithm, data + b"!")
    status, answer = _send(gateway, keys, "PUT", key + ".bad", data, signed_headers={header: wrong})
    assert status == 400 and b"<Code>BadDigest</Code>" in answer, answer
    assert f"{algorithm}.bin.bad" not in [p.rpartition("/")[2] for p in _staged(client, "sums/")]
    assert _data_files(gateway) == before


def test_boto3_checksums_pass(s3):
    # (CRC32C needs botocore[crt], not installed: the hand-signed test above covers it.)
    for algorithm in ("CRC32", "SHA1", "SHA256"):
        s3.put_object(
            Bucket=REPO,
            Key=f"main/sums/boto3-{algorithm}",
            Body=b"x" * 5000,
            ChecksumAlgorithm=algorithm,
        )
        got = s3.get_object(Bucket=REPO, Key=f"main/sums/boto3-{algorithm}")
        assert got["Body"].read() == b"x" * 5000


def test_a_verified_checksum_is_kept_and_answered_when_asked_for(s3, client):
    """The checksum a PUT was verified against comes back in its answer and in a whole GET
    or HEAD with ChecksumMode=ENABLED (boto3 then checks the bytes it read against it); not
    in a ranged GET, nor as an x-amz-meta-* header, nor when not asked for."""
    data = os.urandom(70_000)
    for algorithm in ("CRC32", "SHA256"):
        key = f"main/kept/{algorithm}"
        field = f"Checksum{algorithm}"
        put = s3.put_object(Bucket=REPO, Key=key, Body=data, ChecksumAlgorithm=algorithm)
        expected = _checksum(algorithm.lower(), data)
        assert put[field] == expected
        head = s3.head_object(Bucket=REPO, Key=key, ChecksumMode="ENABLED")
        assert head[field] == expected and head["ChecksumType"] == "FULL_OBJECT"
        assert not any(k.startswith("quarry") for k in head["Metadata"])
        got = s3.get_object(Bucket=REPO, Key=key, ChecksumMode="ENABLED")
        assert got[field] == expected and got["Body"].read() == data
        assert field not in s3.head_object(Bucket=REPO, Key=key)
        ranged = s3.get_object(Bucket=REPO, Key=key, Range="bytes=0-9", ChecksumMode="ENABLED")
        assert field not in ranged and ranged["Body"].read() == data[:10]
    # A copy that replaces the metadata keeps the checksum: the bytes are the same.
    s3.copy_object(
        Bucket=REPO,
        Key="main/kept/copy",
        CopySource=f"{REPO}/main/kept/CRC32",
        MetadataDirective="REPLACE",
        Metadata={"k": "v"},
    )
    copied = s3.head_object(Bucket=REPO, Key="main/kept/copy", ChecksumMode="ENABLED")
    assert copied["ChecksumCRC32"] == _checksum("crc32", data) and copied["Metadata"] == {"k": "v"}
    # The names are the gateway's own: not settable as user metadata.
    with pytest.raises(ClientError) as refused:
        s3.put_object(
            Bucket=REPO,
            Key="main/kept/forged",
            Body=b"x",
            Metadata={"quarry.checksum.crc32": "AAAAAA=="},
        )
    assert _code(refused.value) == "InvalidArgument"


def test_a_kept_checksum_not_bound_to_the_entrys_bytes_never_becomes_a_header(s3, client):
    """Entry metadata is anyone's to write over gRPC and the CLI: a value that is not a
    checksum of its algorithm's size, one set without the entry's checksum it is bound to
    (`quarry put --meta quarry.checksum.sha256=...`), or one carried over to an entry of
    other bytes is not answered (a boto3 reader would refuse a good object; tester hAG)."""
    from quarry.client.entries import make_entry

    s3.put_object(Bucket=REPO, Key="main/kept/plain", Body=b"abc", ChecksumAlgorithm="CRC32")
    entry = client.stat_object(REPO, "main", "kept/plain")
    zeros = base64.b64encode(bytes(32)).decode()
    other_bytes = "f" * 32
    for metadata, checksum in (
        (
            {"quarry.checksum.crc32": "not base64!", "quarry.checksum.sha256": "AAAA"},
            entry.checksum,
        ),
        ({"quarry.checksum.sha256": zeros}, entry.checksum),
        ({"quarry.checksum.sha256": f"{zeros} {'0' * 32}"}, entry.checksum),
        (dict(entry.metadata), other_bytes),  # the kept value, on an entry of other bytes
    ):
        forged = make_entry(
            "kept/forged-meta",
            entry.physical_address,
            entry.size_bytes,
            checksum,
            metadata=metadata,
        )
        client.put_objects(REPO, "main", [forged])
        head = s3.head_object(Bucket=REPO, Key="main/kept/forged-meta", ChecksumMode="ENABLED")
        assert "ChecksumCRC32" not in head and "ChecksumSHA256" not in head, metadata
    assert (
        s3.get_object(Bucket=REPO, Key="main/kept/forged-meta", ChecksumMode="ENABLED")[
            "Body"
        ].read()
        == b"abc"
    )


def test_upload_part_answers_the_parts_checksum(s3):
    upload = s3.create_multipart_upload(Bucket=REPO, Key="main/kept/mp", ChecksumAlgorithm="CRC32")
    part = os.urandom(5 * 1024 * 1024)
    answered = s3.upload_part(
        Bucket=REPO,
        Key="main/kept/mp",
        UploadId=upload["UploadId"],
        PartNumber=1,
        Body=part,
        ChecksumAlgorithm="CRC32",
    )
    assert answered["ChecksumCRC32"] == _checksum("crc32", part)
    s3.complete_multipart_upload(
        Bucket=REPO,
        Key="main/kept/mp",
        UploadId=upload["UploadId"],
        MultipartUpload={
            "Parts": [
                {
                    "PartNumber": 1,
                    "ETag": answered["ETag"],
                    "ChecksumCRC32": answered["ChecksumCRC32"],
                }
            ]
        },
    )
    got = s3.get_object(Bucket=REPO, Key="main/kept/mp", ChecksumMode="ENABLED")
    assert got["Body"].read() == part


def _two_parts(s3, key: str) -> tuple[str, list[dict], bytes]:
    upload = s3.create_multipart_upload(Bucket=REPO, Key=key, ChecksumAlgorithm="CRC32")
    first, second = os.urandom(5 * 1024 * 1024), os.urandom(1000)
    parts = []
    for number, data in ((1, first), (2, second)):
        answered = s3.upload_part(
            Bucket=REPO,
            Key=key,
            UploadId=upload["UploadId"],
            PartNumber=number,
            Body=data,
            ChecksumAlgorithm="CRC32",
        )
        parts.append(
            {
                "PartNumber": number,
                "ETag": answered["ETag"],
                "ChecksumCRC32": answered["ChecksumCRC32"],
            }
        )
    return upload["UploadId"], parts, first + second


def test_complete_verifies_each_parts_checksum_and_the_whole_objects(s3, client):
    """A part named with a checksum its bytes do not have is InvalidPart; a whole-object
    checksum that does not match is BadDigest: nothing staged, the upload still there to be
    completed right. A matching whole-object checksum is kept and answered."""
    key = "main/kept/verified-mp"
    upload_id, parts, data = _two_parts(s3, key)
    forged = [dict(parts[0]), {**parts[1], "ChecksumCRC32": _checksum("crc32", b"other")}]
    with pytest.raises(ClientError) as refused:
        s3.complete_multipart_upload(
            Bucket=REPO, Key=key, UploadId=upload_id, MultipartUpload={"Parts": forged}
        )
    assert _code(refused.value) == "InvalidPart"
    with pytest.raises(ClientError) as refused:
        s3.complete_multipart_upload(
            Bucket=REPO,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={"Parts": parts},
            ChecksumCRC32=_checksum("crc32", data + b"!"),
            ChecksumType="FULL_OBJECT",
        )
    assert _code(refused.value) == "BadDigest"
    assert "kept/verified-mp" not in _staged(client, "kept/")
    s3.complete_multipart_upload(
        Bucket=REPO,
        Key=key,
        UploadId=upload_id,
        MultipartUpload={"Parts": parts},
        ChecksumCRC32=_checksum("crc32", data),
        ChecksumType="FULL_OBJECT",
    )
    head = s3.head_object(Bucket=REPO, Key=key, ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"] == _checksum("crc32", data)
    assert s3.get_object(Bucket=REPO, Key=key, ChecksumMode="ENABLED")["Body"].read() == data


def _trailer_body(data: bytes, trailer: str) -> bytes:
    """An aws-chunked body in STREAMING-UNSIGNED-PAYLOAD-TRAILER form, with `trailer`."""
    body = b""
    for i in range(0, len(data), 65536):
        piece = data[i : i + 65536]
        body += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    return body + b"0\r\n" + trailer.encode() + b"\r\n\r\n"


def test_a_checksum_trailer_is_verified(gateway, keys, client):
    data = os.urandom(150_000)
    signed = {
        "Content-Encoding": "aws-chunked",
        "X-Amz-Decoded-Content-Length": str(len(data)),
        "X-Amz-Trailer": "x-amz-checksum-crc32",
    }
    mode = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
    good = _trailer_body(data, f"x-amz-checksum-crc32:{_checksum('crc32', data)}")
    status, answer = _send(gateway, keys, "PUT", "main/trail/good", good, signed, mode)
    assert status == 200, answer
    assert client.stat_object(REPO, "main", "trail/good").size_bytes == len(data)
    before = _data_files(gateway)
    bad = _trailer_body(data, f"x-amz-checksum-crc32:{_checksum('crc32', b'other')}")
    status, answer = _send(gateway, keys, "PUT", "main/trail/bad", bad, signed, mode)
    assert status == 400 and b"<Code>BadDigest</Code>" in answer, answer
    missing = _trailer_body(data, "")
    status, answer = _send(gateway, keys, "PUT", "main/trail/missing", missing, signed, mode)
    assert status == 400 and b"<Code>InvalidRequest</Code>" in answer, answer
    assert _staged(client, "trail/") == ["trail/good"]
    assert _data_files(gateway) == before


# ---- DeleteObjects answers key by key ----------------------------------------------------------


def test_one_denied_key_of_delete_objects_fails_only_itself(gateway, s3, client):
    from quarry.auth.policy import object_arn

    for key in ("pub/d1", "secret/d1", "pub/d2"):
        s3.put_object(Bucket=REPO, Key=f"main/{key}", Body=b"x")
    client.create_user("deleter")
    client.add_group_member("Developers", "deleter")
    client.create_policy(
        "deny-secret",
        json.dumps(
            {
                "Statement": [
                    {
                        "Effect": "Deny",
                        "Action": "fs:DeleteObject",
                        "Resource": object_arn(REPO, "secret/*"),
                    }
                ]
            }
        ),
    )
    client.attach_policy("deny-secret", user="deleter")
    deleter = gateway.s3(gateway.credentials("deleter"))
    answer = deleter.delete_objects(
        Bucket=REPO,
        Delete={"Objects": [{"Key": f"main/{k}"} for k in ("pub/d1", "secret/d1", "pub/d2")]},
    )
    assert sorted(d["Key"] for d in answer["Deleted"]) == ["main/pub/d1", "main/pub/d2"]
    assert [(e["Key"], e["Code"]) for e in answer["Errors"]] == [("main/secret/d1", "AccessDenied")]
    assert "secret/d1" in answer["Errors"][0]["Message"]
    assert _staged(client, "pub/") == [] and _staged(client, "secret/") == ["secret/d1"]


# ---- the XML documents of DeleteObjects and CompleteMultipartUpload are what was signed --------


def _delete_document(*keys: str) -> bytes:
    objects = "".join(f"<Object><Key>{key}</Key></Object>" for key in keys)
    return f"<Delete>{objects}</Delete>".encode()


def test_a_delete_objects_request_replayed_with_another_body_deletes_nothing(
    gateway, keys, s3, client
):
    """Safety rule: DeleteObjects acts only on the document its signer signed. Seen once (a
    proxy, a debug log), a signed request resent with another document must not delete
    what that document names, whether the signature covers the body's SHA-256 or only
    carries its Content-MD5 or x-amz-checksum-*."""
    for key in ("precious", "harmless"):
        s3.put_object(Bucket=REPO, Key=f"main/replay/{key}", Body=b"keep")
    harmless, forged = (
        _delete_document("main/replay/harmless"),
        _delete_document("main/replay/precious"),
    )
    md5 = base64.b64encode(hashlib.md5(harmless).digest()).decode()
    unsigned = "UNSIGNED-PAYLOAD"
    attempts = [
        # (headers the signer signed, payload hash mode, the code the forged body gets)
        ({}, hashlib.sha256(harmless).hexdigest(), "XAmzContentSHA256Mismatch"),
        ({"Content-MD5": md5}, unsigned, "BadDigest"),
        ({"x-amz-checksum-crc32": _checksum("crc32", harmless)}, unsigned, "BadDigest"),
    ]
    for signed, payload, code in attempts:
        status, answer = _send(gateway, keys, "POST", "", forged, signed, payload, query="delete=")
        assert status == 400 and f"<Code>{code}</Code>".encode() in answer, (signed, answer)
        assert _staged(client, "replay/") == ["replay/harmless", "replay/precious"]
    # What was signed is carried out: the harmless key goes, the precious one stays.
    status, answer = _send(
        gateway, keys, "POST", "", harmless, {"Content-MD5": md5}, query="delete="
    )
    assert status == 200 and b"<Key>main/replay/harmless</Key>" in answer, answer
    assert _staged(client, "replay/") == ["replay/precious"]


def test_a_complete_replayed_with_another_part_list_completes_nothing(gateway, keys, s3, client):
    """A CompleteMultipartUpload signed for parts 1 and 2, resent naming part 2 alone, must
    not stage an object of part 2. The whole object's x-amz-checksum-* a client sends with
    a Complete is not the document's checksum: it does not refuse the document."""
    key = "main/replay/assembled.bin"
    upload = s3.create_multipart_upload(Bucket=REPO, Key=key)["UploadId"]
    first, second = b"a" * (5 * 1024 * 1024), b"b" * 1000
    etags = [
        s3.upload_part(Bucket=REPO, Key=key, UploadId=upload, PartNumber=n, Body=body)["ETag"]
        for n, body in ((1, first), (2, second))
    ]

    def document(*numbers: int) -> bytes:
        parts = "".join(
            f"<Part><PartNumber>{n}</PartNumber><ETag>{etags[n - 1]}</ETag></Part>" for n in numbers
        )
        return f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>".encode()

    signed_hash = hashlib.sha256(document(1, 2)).hexdigest()
    query = f"uploadId={upload}"
    status, answer = _send(
        gateway, keys, "POST", key, document(2), payload=signed_hash, query=query
    )
    assert status == 400 and b"<Code>XAmzContentSHA256Mismatch</Code>" in answer, answer
    assert _staged(client, "replay/assembled") == []
    object_checksum = {"x-amz-checksum-crc32": _checksum("crc32", first + second)}
    status, answer = _send(gateway, keys, "POST", key, document(1, 2), object_checksum, query=query)
    assert status == 200 and b"<CompleteMultipartUploadResult" in answer, answer
    got = s3.get_object(Bucket=REPO, Key=key)["Body"].read()
    assert got == first + second


# ---- multipart parts ---------------------------------------------------------------------------


def test_a_reuploaded_part_replaces_the_earlier_one(s3):
    key = "main/parts/object.bin"
    upload = s3.create_multipart_upload(Bucket=REPO, Key=key)["UploadId"]
    old = s3.upload_part(Bucket=REPO, Key=key, UploadId=upload, PartNumber=1, Body=b"old")
    new = s3.upload_part(Bucket=REPO, Key=key, UploadId=upload, PartNumber=1, Body=b"new")
    for number in (2, 3):
        s3.upload_part(Bucket=REPO, Key=key, UploadId=upload, PartNumber=number, Body=b"+")
    listed = s3.list_parts(Bucket=REPO, Key=key, UploadId=upload)
    assert [(p["PartNumber"], p["ETag"]) for p in listed["Parts"]] == [
        (1, new["ETag"]),
        (2, listed["Parts"][1]["ETag"]),
        (3, listed["Parts"][2]["ETag"]),
    ]
    first = s3.list_parts(Bucket=REPO, Key=key, UploadId=upload, MaxParts=2)
    assert [p["PartNumber"] for p in first["Parts"]] == [1, 2]
    assert first["IsTruncated"] and first["NextPartNumberMarker"] == 2
    rest = s3.list_parts(Bucket=REPO, Key=key, UploadId=upload, PartNumberMarker=2)
    assert [p["PartNumber"] for p in rest["Parts"]] == [3] and not rest["IsTruncated"]
    with pytest.raises(ClientError) as superseded:
        s3.complete_multipart_upload(
            Bucket=REPO,
            Key=key,
            UploadId=upload,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": old["ETag"]}]},
        )
    assert _code(superseded.value) == "InvalidPart"
    s3.complete_multipart_upload(
        Bucket=REPO,
        Key=key,
        UploadId=upload,
        MultipartUpload={
            "Parts": [{"PartNumber": p["PartNumber"], "ETag": p["ETag"]} for p in listed["Parts"]]
        },
    )
    assert s3.get_object(Bucket=REPO, Key=key)["Body"].read() == b"new++"


def test_get_by_part_number_answers_the_one_part_of_a_stored_object(s3):
    s3.put_object(Bucket=REPO, Key="main/parts/whole.bin", Body=b"0123456789")
    part = s3.get_object(Bucket=REPO, Key="main/parts/whole.bin", PartNumber=1)
    assert part["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert part["ContentRange"] == "bytes 0-9/10" and part["Body"].read() == b"0123456789"
    head = s3.head_object(Bucket=REPO, Key="main/parts/whole.bin", PartNumber=1)
    assert head["ResponseMetadata"]["HTTPStatusCode"] == 206
    with pytest.raises(ClientError) as beyond:
        s3.get_object(Bucket=REPO, Key="main/parts/whole.bin", PartNumber=2)
    assert _code(beyond.value) == "InvalidPartNumber"
    with pytest.raises(ClientError) as both:
        s3.get_object(Bucket=REPO, Key="main/parts/whole.bin", PartNumber=1, Range="bytes=0-1")
    assert _code(both.value) == "InvalidRequest"


# ---- a client's mistakes are 400s ---------------------------------------------------------------


def test_malformed_values_are_client_errors(gateway, keys, s3):
    status, answer = _send(
        gateway,
        keys,
        "PUT",
        "main/bad/length.txt",
        b"abc",
        signed_headers={"X-Amz-Decoded-Content-Length": "abc"},
    )
    assert status == 400 and b"<Code>InvalidArgument</Code>" in answer, answer
    upload = s3.create_multipart_upload(Bucket=REPO, Key="main/bad/parts.bin")["UploadId"]
    document = (
        b"<CompleteMultipartUpload><Part><PartNumber>one</PartNumber><ETag>x</ETag></Part>"
        b"</CompleteMultipartUpload>"
    )
    status, answer = _send(
        gateway, keys, "POST", "main/bad/parts.bin", document, query=f"uploadId={upload}"
    )
    assert status == 400 and b"<Code>MalformedXML</Code>" in answer, answer


# ---- copy sources and branch listings ------------------------------------------------------------


def test_a_copy_source_key_may_contain_a_question_mark(s3):
    s3.put_object(Bucket=REPO, Key="main/q/what?.txt", Body=b"asked")
    s3.copy_object(
        Bucket=REPO, Key="main/q/copy.txt", CopySource={"Bucket": REPO, "Key": "main/q/what?.txt"}
    )
    assert s3.get_object(Bucket=REPO, Key="main/q/copy.txt")["Body"].read() == b"asked"


def test_the_branch_listing_pages(s3, client):
    """Branches are keys NAME/, in S3's key order (`pg-0/` before `pg/`), paged exactly;
    the pages of one listing read the branches once, not once per page (3,000 branches
    paged 7 at a time took 40 s)."""
    from prometheus_client import REGISTRY

    for name in ["pg", "pg.x", *(f"pg-{i}" for i in range(5))]:
        client.create_branch(REPO, name, "main")
    names = [*(f"pg-{i}" for i in range(5)), "pg.x", "pg"]  # as keys: '-' < '.' < '/'
    labels = {
        "service": "branch-manager",
        "method": "quarry.v1.BranchManager/ListBranches",
        "code": "OK",
    }
    before = REGISTRY.get_sample_value("quarry_rpc_requests_total", labels) or 0.0
    started = time.monotonic()
    seen, token = [], None
    while True:
        extra = {"ContinuationToken": token} if token else {}
        page = s3.list_objects_v2(Bucket=REPO, Prefix="pg", Delimiter="/", MaxKeys=2, **extra)
        seen += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        assert len(page.get("CommonPrefixes", [])) <= 2
        if not page["IsTruncated"]:
            break
        token = page["NextContinuationToken"]
    assert seen == [f"{n}/" for n in names]
    listed = REGISTRY.get_sample_value("quarry_rpc_requests_total", labels) or 0.0
    # Four pages, one read of the branches per snapshot lifetime (the gateway's default
    # cache, 10 s): on a machine slow enough to outlast it, one more read, never one per page.
    snapshots = 1 + int((time.monotonic() - started) // 10)
    assert listed - before <= snapshots
    seen, marker = [], ""
    while True:
        page = s3.list_objects(Bucket=REPO, Prefix="pg", Delimiter="/", MaxKeys=3, Marker=marker)
        seen += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        if not page["IsTruncated"]:
            break
        marker = page["NextMarker"]
    assert seen == [f"{n}/" for n in names]


def test_copy_onto_itself_needs_a_metadata_change(s3):
    s3.put_object(Bucket=REPO, Key="main/self/x.txt", Body=b"x", ContentType="text/plain")
    source = {"Bucket": REPO, "Key": "main/self/x.txt"}
    with pytest.raises(ClientError) as refused:
        s3.copy_object(Bucket=REPO, Key="main/self/x.txt", CopySource=source)
    assert _code(refused.value) == "InvalidRequest"
    # REPLACE is the way to change an object's metadata in place; a type not given is the
    # default, never the source's.
    s3.copy_object(
        Bucket=REPO,
        Key="main/self/x.txt",
        CopySource=source,
        MetadataDirective="REPLACE",
        Metadata={"owner": "me"},
    )
    head = s3.head_object(Bucket=REPO, Key="main/self/x.txt")
    assert head["Metadata"] == {"owner": "me"}
    assert head["ContentType"] == "application/octet-stream"


def test_a_key_over_1024_bytes_is_key_too_long(s3, client):
    key = "main/" + "k" * 1100
    for call in (
        lambda: s3.put_object(Bucket=REPO, Key=key, Body=b"x"),
        lambda: s3.create_multipart_upload(Bucket=REPO, Key=key),
    ):
        with pytest.raises(ClientError) as refused:
            call()
        assert _code(refused.value) == "KeyTooLongError"


def test_a_listing_that_names_no_existing_ref_is_never_empty(s3, tmp_path):
    """An empty listing tells `aws s3 sync --delete` that every local file should go: a
    mistyped branch, or a listing across refs, must answer an error instead."""
    with pytest.raises(ClientError) as missing:
        s3.list_objects_v2(Bucket=REPO, Prefix="no-such-branch/")
    assert _code(missing.value) == "NoSuchKey"
    with pytest.raises(ClientError) as across:
        s3.list_objects_v2(Bucket=REPO)  # no prefix, no delimiter: every ref
    assert _code(across.value) == "NotImplemented"
    local = tmp_path / "mine"
    local.mkdir()
    (local / "keep.txt").write_text("mine")
    env = {**os.environ}
    env.pop("AWS_CA_BUNDLE", None)
    creds = s3._request_signer._credentials
    env.update(AWS_ACCESS_KEY_ID=creds.access_key, AWS_SECRET_ACCESS_KEY=creds.secret_key)
    for source in (f"s3://{REPO}", f"s3://{REPO}/no-such-branch/"):
        done = subprocess.run(
            [
                str(BIN / "aws"),
                "--endpoint-url",
                s3.meta.endpoint_url,
                "--region",
                "us-east-1",
                "s3",
                "sync",
                "--delete",
                source,
                str(local),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode != 0, done.stdout
        assert (local / "keep.txt").read_text() == "mine"


def test_copy_honours_write_conditions_and_conditional_deletes_are_refused(s3):
    s3.put_object(Bucket=REPO, Key="main/ccopy/src", Body=b"source")
    existing = s3.put_object(Bucket=REPO, Key="main/ccopy/dst", Body=b"destination")["ETag"]
    source = {"Bucket": REPO, "Key": "main/ccopy/src"}
    with pytest.raises(ClientError) as exists:
        s3.copy_object(Bucket=REPO, Key="main/ccopy/dst", CopySource=source, IfNoneMatch="*")
    assert _code(exists.value) == "PreconditionFailed"
    with pytest.raises(ClientError) as stale:
        s3.copy_object(
            Bucket=REPO, Key="main/ccopy/dst", CopySource=source, IfMatch='"' + "0" * 32 + '"'
        )
    assert _code(stale.value) == "PreconditionFailed"
    assert s3.get_object(Bucket=REPO, Key="main/ccopy/dst")["Body"].read() == b"destination"
    s3.copy_object(Bucket=REPO, Key="main/ccopy/dst", CopySource=source, IfMatch=existing)
    assert s3.get_object(Bucket=REPO, Key="main/ccopy/dst")["Body"].read() == b"source"
    s3.copy_object(Bucket=REPO, Key="main/ccopy/new", CopySource=source, IfNoneMatch="*")
    with pytest.raises(ClientError) as delete:
        s3.delete_object(Bucket=REPO, Key="main/ccopy/new", IfMatch='"' + "0" * 32 + '"')
    assert _code(delete.value) == "NotImplemented"
    with pytest.raises(ClientError) as batch:
        s3.delete_objects(
            Bucket=REPO, Delete={"Objects": [{"Key": "main/ccopy/new", "ETag": '"x"'}]}
        )
    assert _code(batch.value) == "NotImplemented"
    assert s3.get_object(Bucket=REPO, Key="main/ccopy/new")["Body"].read() == b"source"


def test_stalled_clients_never_take_the_gateway(tmp_path_factory):
    """Clients that stop sending their upload hold a worker thread only until
    QUARRY_HTTP_IDLE_SECONDS passes; meanwhile /_health answers (it is served on the event
    loop), and afterwards every thread serves again. Here 2 threads and 4 stalled uploads:
    without the idle cut, the GET below would wait for ever."""
    import socket
    import time

    with running_gateway(
        tmp_path_factory.mktemp("s3stall"),
        gateway_env={"QUARRY_HTTP_IDLE_SECONDS": "1", "QUARRY_MAX_WORKERS": "2"},
    ) as gw:
        with gw.suite.client() as client:
            client.create_repository(REPO, gw.suite.namespace(REPO))
        s3 = gw.s3()
        s3.put_object(Bucket=REPO, Key="main/ok.txt", Body=b"ok")
        url = urlsplit(
            s3.generate_presigned_url(
                "put_object", Params={"Bucket": REPO, "Key": "main/stalled.bin"}, ExpiresIn=300
            )
        )
        stalled = []
        for _ in range(4):
            sock = socket.create_connection((url.hostname, url.port), timeout=30)
            sock.sendall(
                f"PUT {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                "Content-Length: 1000000\r\n\r\n".encode()
                + b"x" * 100_000  # then nothing more
            )
            stalled.append(sock)
        try:
            time.sleep(0.3)  # the uploads reach the worker threads
            with urllib.request.urlopen(gw.endpoint + "/_health", timeout=5) as health:
                assert health.read() == b"ok\n"
            started = time.monotonic()
            got = s3.get_object(Bucket=REPO, Key="main/ok.txt")["Body"].read()
            assert got == b"ok"
            assert time.monotonic() - started < 20  # a hang bound: uncut, it never answers
            assert "main/stalled.bin" not in [
                o["Key"]
                for o in s3.list_objects_v2(Bucket=REPO, Prefix="main/").get("Contents", [])
            ]
        finally:
            for sock in stalled:
                sock.close()


def test_a_download_the_client_abandons_stops_there(gateway, s3):
    """The client reads 1 MiB of 48 MiB and closes the connection: the gateway stops
    reading the object (for an S3 namespace, fetching it) and logs the request as 499,
    instead of reading to the end for nobody."""
    import socket

    from support.wait import wait_until

    s3.put_object(Bucket=REPO, Key="main/big/abandoned.bin", Body=os.urandom(48 << 20))
    url = urlsplit(
        s3.generate_presigned_url(
            "get_object", Params={"Bucket": REPO, "Key": "main/big/abandoned.bin"}, ExpiresIn=300
        )
    )
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(f"GET {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n\r\n".encode())
        received = 0
        while received < 1 << 20:
            piece = sock.recv(65536)
            assert piece
            received += len(piece)

    def abandoned() -> bool:
        return any(
            "GetObject" in line and "-> 499" in line
            for line in gateway.log.read_text().splitlines()
        )

    wait_until(abandoned, timeout=30, interval=0.1, what="the abandoned GET's 499 log line")


def test_a_link_planted_after_staging_is_not_followed_out_of_the_namespace(gateway, s3, client):
    """Staging judges where an address points once; the file was then replaced by a link
    to Quarry's home and a GET served the signing key (a tester forged a service token with
    it). The gateway now checks the file it opened (its real path) before sending a byte:
    AccessDenied, for GET, a ranged GET and a copy; a plain object still reads."""
    s3.put_object(Bucket=REPO, Key="main/swap/x.txt", Body=b"harmless")
    s3.put_object(Bucket=REPO, Key="main/swap/kept.txt", Body=b"kept")
    secret = gateway.suite.home / "bait-secret.txt"
    secret.write_bytes(b"the signing key")
    address = client.stat_object(REPO, "main", "swap/x.txt").physical_address
    os.unlink(address)
    os.symlink(secret, address)
    for ranged in ({}, {"Range": "bytes=0-3"}):
        with pytest.raises(ClientError) as refused:
            s3.get_object(Bucket=REPO, Key="main/swap/x.txt", **ranged)
        assert _code(refused.value) == "AccessDenied"
    with pytest.raises(ClientError) as refused:
        s3.copy_object(
            Bucket=REPO,
            Key="main/swap/copy.txt",
            CopySource={"Bucket": REPO, "Key": "main/swap/x.txt"},
        )
    assert _code(refused.value) == "AccessDenied"
    assert s3.get_object(Bucket=REPO, Key="main/swap/kept.txt")["Body"].read() == b"kept"


def test_an_object_whose_checksum_is_not_an_md5_has_an_etag_no_client_takes_for_one(
    gateway, s3, client
):
    """`quarry put --from` and Spark record a SHA-256; served as the ETag, s3cmd reported an
    MD5 mismatch on every download and its sync re-transferred unchanged files. The ETag is
    now in the multipart form (`<32 hex>-1`), stable while the object is, and If-Match and
    If-None-Match work with it, the conditional write as a compare-and-swap."""
    body = b"written by a quarry put --from"
    sha = hashlib.sha256(body).hexdigest()
    address = os.path.join(gateway.suite.namespace(REPO), "data", "0" * 32)
    os.makedirs(os.path.dirname(address), exist_ok=True)
    with open(address, "wb") as out:
        out.write(body)
    client.put_object(
        REPO,
        "main",
        path="sha/doc.txt",
        physical_address=address,
        size_bytes=len(body),
        checksum=sha,
    )
    etag = s3.head_object(Bucket=REPO, Key="main/sha/doc.txt")["ETag"]
    assert etag.startswith('"') and etag.strip('"').endswith("-1") and sha not in etag
    assert s3.get_object(Bucket=REPO, Key="main/sha/doc.txt")["ETag"] == etag
    with pytest.raises(ClientError) as unchanged:
        s3.get_object(Bucket=REPO, Key="main/sha/doc.txt", IfNoneMatch=etag)
    assert unchanged.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
    # A conditional write on that ETag replaces it; on a stale one it is refused.
    s3.put_object(Bucket=REPO, Key="main/sha/doc.txt", Body=b"v2", IfMatch=etag)
    with pytest.raises(ClientError) as stale:
        s3.put_object(Bucket=REPO, Key="main/sha/doc.txt", Body=b"v3", IfMatch=etag)
    assert _code(stale.value) == "PreconditionFailed"
    assert s3.get_object(Bucket=REPO, Key="main/sha/doc.txt")["Body"].read() == b"v2"


# ---- the standard headers S3 keeps with an object ----------------------------------------------


def test_the_standard_headers_written_with_an_object_are_served_with_it(s3, client):
    """Content-Encoding, Cache-Control, Content-Disposition, Content-Language and Expires
    are stored and answered on GET and HEAD, as S3 does (they were dropped: a gzip object
    came back as bytes with no encoding). Through a PUT, a multipart upload and a copy."""
    import gzip
    from datetime import UTC, datetime

    body = gzip.compress(b'{"a": 1}\n')
    expires = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    headers = {
        "ContentEncoding": "gzip",
        "CacheControl": "max-age=3600",
        "ContentDisposition": 'attachment; filename="d.json"',
        "ContentLanguage": "en",
        "Expires": expires,
        "ContentType": "application/json",
    }

    def served(key: str) -> None:
        for answer in (
            s3.head_object(Bucket=REPO, Key=key),
            s3.get_object(Bucket=REPO, Key=key),
        ):
            assert answer["ContentEncoding"] == "gzip"
            assert answer["CacheControl"] == "max-age=3600"
            assert answer["ContentDisposition"] == 'attachment; filename="d.json"'
            assert answer["ContentLanguage"] == "en"
            assert answer["Expires"] == expires
            assert answer["ContentType"] == "application/json"
            assert answer["Metadata"] == {"owner": "ada"}  # the user's own, and only those
        assert s3.get_object(Bucket=REPO, Key=key)["Body"].read() == body  # bytes as stored

    s3.put_object(
        Bucket=REPO, Key="main/std/put.json", Body=body, Metadata={"owner": "ada"}, **headers
    )
    served("main/std/put.json")
    upload = s3.create_multipart_upload(
        Bucket=REPO, Key="main/std/multi.json", Metadata={"owner": "ada"}, **headers
    )["UploadId"]
    etag = s3.upload_part(
        Bucket=REPO, Key="main/std/multi.json", UploadId=upload, PartNumber=1, Body=body
    )["ETag"]
    s3.complete_multipart_upload(
        Bucket=REPO,
        Key="main/std/multi.json",
        UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
    )
    served("main/std/multi.json")
    s3.copy_object(Bucket=REPO, Key="main/std/copy.json", CopySource=f"{REPO}/main/std/put.json")
    served("main/std/copy.json")  # COPY keeps them
    s3.copy_object(
        Bucket=REPO,
        Key="main/std/replaced.json",
        CopySource=f"{REPO}/main/std/put.json",
        MetadataDirective="REPLACE",
        CacheControl="no-store",
    )
    replaced = s3.head_object(Bucket=REPO, Key="main/std/replaced.json")
    assert replaced["CacheControl"] == "no-store" and "ContentEncoding" not in replaced
    # A GET's response-* parameters still override what is stored.
    got = s3.get_object(Bucket=REPO, Key="main/std/put.json", ResponseCacheControl="no-cache")
    assert got["CacheControl"] == "no-cache"
    # The names they are kept under are not a client's to set as user metadata.
    with pytest.raises(ClientError) as refused:
        s3.put_object(
            Bucket=REPO,
            Key="main/std/forged.json",
            Body=b"x",
            Metadata={"quarry.http.content-encoding": "gzip"},
        )
    assert _code(refused.value) == "InvalidArgument"


def test_list_multipart_uploads_pages_and_groups_as_s3(s3):
    """max-uploads, key-marker / upload-id-marker and delimiter were ignored: every upload
    came back with IsTruncated false, the same ones again after a marker."""
    keys = [f"main/lmu/{n}" for n in range(4)] + ["main/lmu/2", "main/lmu/sub/a", "main/lmu/sub/b"]
    made = sorted(
        (key, s3.create_multipart_upload(Bucket=REPO, Key=key)["UploadId"]) for key in keys
    )
    try:
        pages, seen = 0, []
        marker: dict[str, str] = {}
        while True:
            page = s3.list_multipart_uploads(
                Bucket=REPO, Prefix="main/lmu/", MaxUploads=2, **marker
            )
            pages += 1
            seen += [(u["Key"], u["UploadId"]) for u in page.get("Uploads", [])]
            assert len(page.get("Uploads", [])) <= 2
            if not page["IsTruncated"]:
                break
            marker = {"KeyMarker": page["NextKeyMarker"]}
            if page.get("NextUploadIdMarker"):
                marker["UploadIdMarker"] = page["NextUploadIdMarker"]
        assert seen == made  # each once, in key then upload id order (two uploads of lmu/2)
        assert pages == 4
        grouped = s3.list_multipart_uploads(Bucket=REPO, Prefix="main/lmu/", Delimiter="/")
        assert [p["Prefix"] for p in grouped["CommonPrefixes"]] == ["main/lmu/sub/"]
        assert [u["Key"] for u in grouped["Uploads"]] == [k for k, _ in made if "sub/" not in k]
    finally:
        for key, upload in made:
            s3.abort_multipart_upload(Bucket=REPO, Key=key, UploadId=upload)


def test_entry_metadata_becomes_only_the_headers_the_gateway_chose(s3, client):
    """Safety rule: metadata is anyone's to write (CLI, gRPC, console); on a GET or HEAD it
    becomes only the five standard headers or x-amz-meta-*, with values a header can hold.
    `quarry.http.set-cookie` set a cookie on this host (whose other ports serve the
    console), and a CR/LF in a value split the answer (a 500)."""
    s3.put_object(Bucket=REPO, Key="main/meta/planted.txt", Body=b"")
    written = client.stat_object(REPO, "main", "meta/planted.txt")
    client.put_object(
        REPO,
        "main",
        path="meta/planted.txt",
        physical_address=written.physical_address,
        size_bytes=0,
        checksum=written.checksum,
        metadata={
            "quarry.http.set-cookie": "quarry_console_session=forged; Path=/",
            "quarry.http.transfer-encoding": "chunked",
            "quarry.http.content-length": "7",
            "quarry.http.cache-control": "max-age=60",
            "split": "a\r\nset-cookie: forged=1",
            "bad name": "x",
            "owner": "ada",
        },
    )
    for answer in (
        s3.head_object(Bucket=REPO, Key="main/meta/planted.txt"),
        s3.get_object(Bucket=REPO, Key="main/meta/planted.txt"),
    ):
        headers = answer["ResponseMetadata"]["HTTPHeaders"]
        assert "set-cookie" not in headers and "transfer-encoding" not in headers, headers
        assert headers.get("content-length") == "0"
        assert headers["cache-control"] == "max-age=60"  # one of the five: served
        assert answer["Metadata"] == {"owner": "ada"}  # the rest of it, as x-amz-meta-*


def test_an_unsigned_delete_objects_body_needs_a_check_the_signature_covers(
    gateway, keys, s3, client
):
    """With UNSIGNED-PAYLOAD the signature does not cover the document: without a signed
    Content-MD5 or a verifiable x-amz-checksum-* (CRC64NVME is accepted unverified) a signed
    request seen once could be resent deleting other keys. S3 refuses such a DeleteObjects
    too."""
    s3.put_object(Bucket=REPO, Key="main/unsigned/keep", Body=b"keep")
    forged = _delete_document("main/unsigned/keep")
    for signed in ({}, {"x-amz-checksum-crc64nvme": "AAAAAAAAAAA="}):
        status, answer = _send(
            gateway, keys, "POST", "", forged, signed, "UNSIGNED-PAYLOAD", query="delete="
        )
        assert status == 400 and b"<Code>InvalidRequest</Code>" in answer, (signed, answer)
    # An unsigned Content-MD5 (added after signing) counts for nothing either.
    md5 = base64.b64encode(hashlib.md5(forged).digest()).decode()
    status, answer = _send(
        gateway,
        keys,
        "POST",
        "",
        forged,
        payload="UNSIGNED-PAYLOAD",
        added_headers={"Content-MD5": md5},
        query="delete=",
    )
    assert status == 400 and b"<Code>InvalidRequest</Code>" in answer, answer
    assert _staged(client, "unsigned/") == ["unsigned/keep"]
    # Signed, it is carried out.
    status, answer = _send(
        gateway, keys, "POST", "", forged, {"Content-MD5": md5}, "UNSIGNED-PAYLOAD", query="delete="
    )
    assert status == 200, answer
    assert _staged(client, "unsigned/") == []


def test_every_version_id_of_a_request_is_checked(gateway, keys, s3):
    s3.put_object(Bucket=REPO, Key="main/versions/live", Body=b"live")
    status, answer = _send(
        gateway, keys, "DELETE", "main/versions/live", query="versionId=null&versionId=other"
    )
    assert status == 400 and b"InvalidArgument" in answer, answer
    assert s3.get_object(Bucket=REPO, Key="main/versions/live")["Body"].read() == b"live"


def test_max_uploads_zero_lists_nothing_and_is_not_truncated(s3):
    upload = s3.create_multipart_upload(Bucket=REPO, Key="main/lmu0/a")["UploadId"]
    try:
        page = s3.list_multipart_uploads(Bucket=REPO, Prefix="main/lmu0/", MaxUploads=0)
        assert page.get("Uploads", []) == [] and page["IsTruncated"] is False
    finally:
        s3.abort_multipart_upload(Bucket=REPO, Key="main/lmu0/a", UploadId=upload)


def test_a_trailer_no_header_announced_is_refused_not_ignored(gateway, keys, client):
    """A checksum trailer sent without x-amz-trailer went unchecked: a wrong CRC32 was
    stored with a 200."""
    data = os.urandom(1000)
    signed = {"Content-Encoding": "aws-chunked", "X-Amz-Decoded-Content-Length": str(len(data))}
    body = _trailer_body(data, f"x-amz-checksum-crc32:{_checksum('crc32', b'other')}")
    status, answer = _send(
        gateway,
        keys,
        "PUT",
        "main/trail/undeclared",
        body,
        signed,
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
    )
    assert status == 400 and b"<Code>InvalidRequest</Code>" in answer, answer
    assert "trail/undeclared" not in _staged(client, "trail/")


def test_a_bucket_name_no_repository_can_have_is_no_such_bucket(s3):
    """It answered NoSuchKey for the object, as if the bucket existed."""
    with pytest.raises(ClientError) as refused:
        s3.get_object(Bucket="not_a_repo", Key="main/x")
    assert _code(refused.value) == "NoSuchBucket"


def _other_repository(gateway, client, name: str) -> str:
    client.create_repository(name, gateway.suite.namespace(name))
    return name


def test_copy_object_computes_the_checksum_algorithm_asked_for(gateway, s3, client):
    """x-amz-checksum-algorithm on CopyObject: the copy keeps a checksum in that algorithm,
    computed from the source's bytes, answered in CopyObjectResult and by HEAD/GET with
    ChecksumMode (boto3 validates the GET), within a repository and across repositories;
    the source's own checksum stays with a copy that asks for none (tester hAG#10)."""
    data = os.urandom(300_000)
    s3.put_object(Bucket=REPO, Key="main/ccsum/src", Body=data, ChecksumAlgorithm="CRC32")
    other = _other_repository(gateway, client, "ccsum-other")
    for bucket, algorithm in (
        (REPO, "SHA256"),
        (REPO, "SHA1"),
        (other, "SHA256"),
        (other, "CRC32"),
    ):
        key = f"main/ccsum/{algorithm}"
        answer = s3.copy_object(
            Bucket=bucket,
            Key=key,
            CopySource=f"{REPO}/main/ccsum/src",
            ChecksumAlgorithm=algorithm,
        )["CopyObjectResult"]
        field, expected = f"Checksum{algorithm}", _checksum(algorithm.lower(), data)
        assert answer[field] == expected, (bucket, answer)
        head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        assert head[field] == expected and head["ChecksumType"] == "FULL_OBJECT"
        assert [f for f in head if f.startswith("Checksum") and f != "ChecksumType"] == [field]
        got = s3.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        assert got[field] == expected and got["Body"].read() == data
    plain = s3.copy_object(
        Bucket=other, Key="main/ccsum/plain", CopySource=f"{REPO}/main/ccsum/src"
    )
    assert plain["CopyObjectResult"]["ChecksumCRC32"] == _checksum("crc32", data)
    # An algorithm not computed here is refused, never answered without the checksum.
    with pytest.raises(ClientError) as refused:
        s3.copy_object(
            Bucket=REPO,
            Key="main/ccsum/crc64",
            CopySource=f"{REPO}/main/ccsum/src",
            ChecksumAlgorithm="CRC64NVME",
        )
    assert _code(refused.value) == "InvalidRequest"
    assert "ccsum/crc64" not in _staged(client, "ccsum/")


def test_a_copy_never_carries_a_checksum_over_other_bytes(gateway, s3, client):
    """Safety rule: a source whose stored bytes are no longer its entry's (damaged in
    place, same size) is not copied to another repository, nor given a checksum computed
    from them: DATA_LOSS (500), nothing staged, no file left in the destination's
    namespace."""
    other = _other_repository(gateway, client, "ccsum-damaged")
    data = os.urandom(200_000)
    s3.put_object(Bucket=REPO, Key="main/ccsum/damaged", Body=data)  # an MD5 entry checksum
    address = client.stat_object(REPO, "main", "ccsum/damaged").physical_address
    with open(address, "r+b") as fh:
        fh.seek(1000)
        fh.write(bytes(b ^ 0xFF for b in data[1000:1016]))
    data_dir = Path(gateway.suite.namespace(other)) / "data"
    before = set(os.listdir(data_dir)) if data_dir.is_dir() else set()
    source = f"{REPO}/main/ccsum/damaged"
    for bucket, extra in ((other, {}), (REPO, {"ChecksumAlgorithm": "SHA256"})):
        with pytest.raises(ClientError) as refused:
            s3.copy_object(Bucket=bucket, Key="main/ccsum/damaged-copy", CopySource=source, **extra)
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500, bucket
        assert not [e.path for e in client.iter_objects(bucket, "main", prefix="ccsum/damaged-")]
    assert (set(os.listdir(data_dir)) if data_dir.is_dir() else set()) == before
    # An entry whose checksum is a multipart ETag (no digest of the bytes) is checked by
    # size as a GET checks it: a file replaced by a longer one is refused, never copied
    # cut to the recorded size (tester hAN).
    key = "main/ccsum/multipart"
    upload_id, parts, _data = _two_parts(s3, key)
    s3.complete_multipart_upload(
        Bucket=REPO, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    grown = client.stat_object(REPO, "main", "ccsum/multipart")
    assert grown.checksum.endswith("-2")
    with open(grown.physical_address, "ab") as fh:
        fh.write(b"more bytes than the entry records")
    with pytest.raises(ClientError) as longer:
        s3.copy_object(Bucket=other, Key="main/ccsum/mp-copy", CopySource=f"{REPO}/{key}")
    assert longer.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert not [e.path for e in client.iter_objects(other, "main", prefix="ccsum/mp-")]
    assert (set(os.listdir(data_dir)) if data_dir.is_dir() else set()) == before


def test_a_copy_of_an_entry_without_a_size_copies_its_whole_file(gateway, s3, client, tmp_path):
    """An entry that records no size (`quarry put --address` without --size) copied to
    another repository or as an upload part: its local file's bytes, all of them (it was
    copied as 0 bytes)."""
    other = _other_repository(gateway, client, "ccsum-sizeless")
    data = os.urandom(50_000)
    held = Path(gateway.suite.namespace(REPO)) / "sizeless.bin"
    held.write_bytes(data)
    client.put_object(REPO, "main", path="ccsum/sizeless", physical_address=str(held))
    source = f"{REPO}/main/ccsum/sizeless"
    s3.copy_object(Bucket=other, Key="main/ccsum/sizeless", CopySource=source)
    assert s3.get_object(Bucket=other, Key="main/ccsum/sizeless")["Body"].read() == data
    upload = s3.create_multipart_upload(Bucket=REPO, Key="main/ccsum/sizeless-mp")["UploadId"]
    part = s3.upload_part_copy(
        Bucket=REPO, Key="main/ccsum/sizeless-mp", UploadId=upload, PartNumber=1, CopySource=source
    )["CopyPartResult"]
    s3.complete_multipart_upload(
        Bucket=REPO,
        Key="main/ccsum/sizeless-mp",
        UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
    )
    assert s3.get_object(Bucket=REPO, Key="main/ccsum/sizeless-mp")["Body"].read() == data


def test_a_composite_checksum_on_complete_is_not_taken_for_the_bodys(s3):
    """COMPOSITE (x-amz-checksum-type) is a checksum of the parts' checksums, with or
    without its "-N": not verified as the object's own, never a BadDigest (tester hAG)."""
    key = "main/kept/composite-mp"
    upload_id, parts, data = _two_parts(s3, key)
    raw = b"".join(base64.b64decode(p["ChecksumCRC32"]) for p in parts)
    s3.complete_multipart_upload(
        Bucket=REPO,
        Key=key,
        UploadId=upload_id,
        MultipartUpload={"Parts": parts},
        ChecksumCRC32=_checksum("crc32", raw),
        ChecksumType="COMPOSITE",
    )
    assert s3.get_object(Bucket=REPO, Key=key)["Body"].read() == data
