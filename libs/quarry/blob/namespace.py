"""Storage namespaces: parsing, normalization and overlap (docs/architecture.md §2).

A namespace is an absolute local directory (`/abs/dir` or `file:///abs/dir`) or
`s3://bucket/prefix`. Normalized: doubled slashes collapsed, the trailing slash dropped,
`file://localhost/` written `file:///`; a repository records a local namespace by its real
path (canonical_storage_namespace: symlinks resolved), and overlaps are checked between real
paths (namespace_location). Refused (INVALID_ARGUMENT / INVALID_NAMESPACE): empty,
relative paths, `.` or `..` segments, NUL or other control characters, query strings or
fragments, invalid bucket names, and, for a repository, a root (`/`, `s3://bucket`): a
repository owns its whole namespace, and a root would contain every other namespace there.
"""

from __future__ import annotations

import os
import re
import urllib.parse

from quarry.blob.base import InvalidStorageNamespace

FORMS = "/abs/dir, file:///abs/dir or s3://bucket/prefix"
# S3's bucket naming rules (3-63 characters, lowercase letters, digits, dots and hyphens,
# starting and ending with a letter or digit; no "..", not an IP address).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IP = re.compile(r"\d+\.\d+\.\d+\.\d+")
# NUL and the other C0 control characters, and DEL: one regex search (a namespace is parsed
# for every object written, so not a Python loop over its characters). Also what an import's
# listing refuses in a key (quarry.blob.sources).
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


def _refuse(namespace: str, why: str) -> InvalidStorageNamespace:
    return InvalidStorageNamespace(f"invalid storage namespace {namespace!r}: {why}")


def _check_characters(namespace: str, text: str) -> None:
    if CONTROL_CHARACTERS.search(text):
        raise _refuse(namespace, "NUL or other control characters are not allowed")


def _segments(namespace: str, path: str) -> list[str]:
    """The path's non-empty segments; `.` and `..` are refused, not resolved (a namespace
    must say where it is, not how to get there)."""
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise _refuse(namespace, "'.' and '..' segments are not allowed")
    return parts


def parse_storage_namespace(storage_namespace: str) -> tuple[str, str, str]:
    """("local", "/abs/dir", "") or ("s3", bucket, "normalized/prefix"), with the path or
    prefix normalized; InvalidStorageNamespace otherwise. A root ("/", "s3://bucket") parses
    (a store can be opened there); repositories use normalize_storage_namespace."""
    ns = (storage_namespace or "").strip()
    if not ns:
        raise InvalidStorageNamespace(f"storage namespace is empty: use {FORMS}")
    _check_characters(ns, ns)
    if ns.startswith("/"):
        return "local", "/" + "/".join(_segments(ns, ns)), ""
    scheme, sep, rest = ns.partition("://")
    if not sep and ns.lower().startswith("file:/"):
        scheme, rest = "file", ns[len("file:") :].lstrip("/")
        rest = "/" + rest
    scheme = scheme.lower()
    if scheme == "file":
        parsed = urllib.parse.urlsplit("file://" + rest)
        if (
            parsed.netloc not in ("", "localhost")
            or not parsed.path.startswith("/")
            or parsed.query
            or parsed.fragment
        ):
            raise _refuse(ns, "use file:///absolute/path")
        path = urllib.parse.unquote(parsed.path)
        _check_characters(ns, path)
        return "local", "/" + "/".join(_segments(ns, path)), ""
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise _refuse(ns, "missing bucket: use s3://bucket/prefix")
        if not _BUCKET.fullmatch(bucket) or ".." in bucket or _IP.fullmatch(bucket):
            raise _refuse(ns, f"{bucket!r} is not a valid S3 bucket name")
        if "?" in prefix or "#" in prefix:
            raise _refuse(ns, "query strings and fragments are not allowed")
        return "s3", bucket, "/".join(_segments(ns, prefix))
    raise _refuse(ns, f"expected {FORMS}")


def normalize_storage_namespace(storage_namespace: str) -> str:
    """A repository's namespace, validated and normalized (in the notation it was given:
    /abs/dir, file:///abs/dir or s3://bucket/prefix). Roots are refused."""
    kind, where, prefix = parse_storage_namespace(storage_namespace)
    ns = storage_namespace.strip()
    if kind == "local":
        if where == "/":
            raise _refuse(
                ns,
                "the root directory cannot be a repository's namespace; use a directory of its own",
            )
        return where if ns.startswith("/") else "file://" + where
    if not prefix:
        raise _refuse(
            ns, "a whole bucket cannot be a repository's namespace; use s3://bucket/prefix"
        )
    return f"s3://{where}/{prefix}"


def canonical_storage_namespace(storage_namespace: str) -> str:
    """normalize_storage_namespace, and for a local namespace its real path (symlinks
    resolved, os.path.realpath; the part that does not exist yet is kept as written): what a
    repository records, so a link later re-pointed never moves its namespace."""
    ns = normalize_storage_namespace(storage_namespace)
    kind, where, _ = parse_storage_namespace(ns)
    if kind != "local":
        return ns
    real = os.path.realpath(where)
    if real == "/":
        raise _refuse(
            storage_namespace.strip(),
            "it resolves to the root directory; use a directory of its own",
        )
    return real if ns.startswith("/") else "file://" + real


def namespace_location(storage_namespace: str) -> tuple[str, str]:
    """(kind, "location/") with a trailing slash, comparable across notations: one
    namespace lies inside another when its location starts with the other's. A local
    namespace's location is its real path (symlinks resolved): a namespace reached through
    a link into another repository's namespace lies inside it, whatever its text says."""
    kind, where, prefix = parse_storage_namespace(storage_namespace)
    if kind == "local":
        return "local", os.path.realpath(where).rstrip("/") + "/"
    return "s3", f"{where}/{prefix + '/' if prefix else ''}"


def namespaces_overlap(a: str, b: str) -> bool:
    """True when the namespaces are equal or one lies inside the other (local ones compared
    by their real paths)."""
    (kind_a, loc_a), (kind_b, loc_b) = namespace_location(a), namespace_location(b)
    return kind_a == kind_b and (loc_a.startswith(loc_b) or loc_b.startswith(loc_a))
