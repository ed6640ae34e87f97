"""S3's XML documents: the answers the gateway writes and the request bodies it reads
(CompleteMultipartUpload, Delete). Written with xml.etree (escaping is its job); parsed with
a size limit and no DTDs or entities (expat refuses external entities by default, and a
body with a DOCTYPE is refused here outright)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from quarry.s3gateway.errors import S3Error

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
MAX_REQUEST_XML_BYTES = 2 * 1024 * 1024


def timestamp(seconds: float) -> str:
    """S3's ISO 8601 form with milliseconds, e.g. 2026-11-27T18:00:00.000Z."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def http_date(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%a, %d %b %Y %H:%M:%S GMT")


def _add(parent: ET.Element, tag: str, value: Any = None) -> ET.Element:
    child = ET.SubElement(parent, tag)
    if value is not None:
        child.text = str(value).lower() if isinstance(value, bool) else str(value)
    return child


def _fill(parent: ET.Element, fields: Iterable[tuple[str, Any]]) -> None:
    for tag, value in fields:
        if isinstance(value, list):
            for item in value:
                _fill(_add(parent, tag), item)
        elif value is not None:
            _add(parent, tag, value)


def document(root: str, fields: Iterable[tuple[str, Any]], namespace: bool = True) -> bytes:
    """<root xmlns=S3>fields</root>. A field is (tag, scalar), or (tag, [fields, ...]) for
    repeated nested elements; None values are left out."""
    element = ET.Element(root, xmlns=NS) if namespace else ET.Element(root)
    _fill(element, fields)
    # A carriage return as a reference, as S3 writes it: a parser reads a raw one as a line
    # feed (every end of line is normalized), so a key `a\rb` was listed as `a\nb`, a key
    # that does not exist. ElementTree writes none other than inside text.
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(element).replace(
        b"\r", b"&#13;"
    )


def error_document(error: S3Error, request_id: str) -> bytes:
    return document(
        "Error",
        [
            ("Code", error.code),
            ("Message", error.message),
            ("Resource", error.resource or None),
            ("RequestId", request_id),
        ],
        namespace=False,  # S3's error documents have none (clients look up bare tags)
    )


def parse(body: bytes, root: str) -> ET.Element:
    """The request body as an element named `root` (namespace ignored); MalformedXML else."""
    if len(body) > MAX_REQUEST_XML_BYTES:
        raise S3Error("MalformedXML", "the XML body is too large", 400)
    if b"<!DOCTYPE" in body or b"<!ENTITY" in body:
        raise S3Error("MalformedXML", "DTDs and entities are not accepted", 400)
    try:
        element = ET.fromstring(body)
    except ET.ParseError:
        raise S3Error("MalformedXML", "The XML you provided was not well-formed", 400) from None
    if local(element.tag) != root:
        raise S3Error("MalformedXML", f"expected a {root} document", 400)
    return element


def local(tag: str) -> str:
    return tag.rpartition("}")[2]


def children(element: ET.Element, tag: str) -> list[ET.Element]:
    return [child for child in element if local(child.tag) == tag]


def text(element: ET.Element, tag: str, default: str = "") -> str:
    for child in element:
        if local(child.tag) == tag:
            return child.text or ""
    return default
