"""The gateway's path resolver (bucket / ref / path, path-style and virtual-host style) and
its XML reader's refusals."""

from __future__ import annotations

import pytest

from quarry.s3gateway import xmlserde
from quarry.s3gateway.errors import S3Error
from quarry.s3gateway.paths import resolve


@pytest.mark.parametrize(
    ("raw_path", "host", "domain", "bucket", "ref", "path"),
    [
        ("/repo/main/a/b.parquet", "127.0.0.1:7406", "", "repo", "main", "a/b.parquet"),
        ("/repo/v1.0/x%20y.txt", "localhost:7406", "s3.local", "repo", "v1.0", "x y.txt"),
        ("/repo", "h", "", "repo", "", ""),
        ("/", "h", "", "", "", ""),
        # Virtual-host style for the configured domain: the whole path is REF/PATH.
        ("/main/a.txt", "repo.s3.local:7406", "s3.local", "repo", "main", "a.txt"),
        ("/main/a.txt", "REPO.S3.LOCAL", "s3.local", "repo", "main", "a.txt"),
        # Another host: path-style.
        ("/repo/main/a.txt", "other.example:7406", "s3.local", "repo", "main", "a.txt"),
    ],
)
def test_resolve(raw_path, host, domain, bucket, ref, path):
    target = resolve(raw_path, host, domain)
    assert (target.bucket, target.ref, target.path) == (bucket, ref, path)


def test_xml_bodies_with_entities_or_of_another_kind_are_refused():
    billion_laughs = b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaa">]><Delete>&a;</Delete>'
    for body, root in (
        (billion_laughs, "Delete"),
        (b"<Delete><Object>", "Delete"),
        (b"<Other/>", "Delete"),
        (b"<Delete/>" + b" " * (xmlserde.MAX_REQUEST_XML_BYTES + 1), "Delete"),
    ):
        with pytest.raises(S3Error) as refused:
            xmlserde.parse(body, root)
        assert refused.value.code == "MalformedXML"
    parsed = xmlserde.parse(
        b'<Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Quiet>true</Quiet>'
        b"<Object><Key>main/a</Key></Object></Delete>",
        "Delete",
    )
    assert xmlserde.text(parsed, "Quiet") == "true"
    assert [xmlserde.text(o, "Key") for o in xmlserde.children(parsed, "Object")] == ["main/a"]


def test_error_documents_escape_what_they_quote():
    document = xmlserde.error_document(S3Error("NoSuchKey", "no <key> & more", 404, "a<b"), "RID")
    assert b"no &lt;key&gt; &amp; more" in document and b"<RequestId>RID</RequestId>" in document


def test_the_servers_own_storage_failure_is_a_retryable_503_that_names_no_path(caplog):
    """A full or read-only disk under the namespace was `400 InvalidRequest` (clients do not
    retry a 400) with the server's local path in the message."""
    from quarry.blob.base import StorageUnreachable
    from quarry.s3gateway.errors import from_quarry

    failure = StorageUnreachable("read-only file system (/srv/lake/data/.quarry-tmp-1)")
    answer = from_quarry(failure, "/bucket/key")
    assert (answer.code, answer.status) == ("ServiceUnavailable", 503)
    assert "/srv/lake" not in answer.message
    assert "/srv/lake" in caplog.text  # the operator still sees it


def test_a_carriage_return_in_a_key_survives_a_parser():
    """A parser normalizes a raw CR to LF: a key `a\\rb` was listed as `a\\nb` (pyarrow's
    listing, which asks for no encoding-type), a key that does not exist."""
    import xml.etree.ElementTree as ET

    from quarry.s3gateway import xmlserde

    body = xmlserde.document("ListBucketResult", [("Contents", [[("Key", "main/a\rb\nc")]])])
    assert b"\r" not in body
    parsed = ET.fromstring(body)
    keys = [e.text for e in parsed.iter() if e.tag.endswith("Key")]
    assert keys == ["main/a\rb\nc"]
