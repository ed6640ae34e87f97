"""The object-store layout of a storage namespace, and physical addresses (docs/architecture.md
§2, §5).

This module is the only place that knows which keys Quarry writes into a repository's
storage namespace and what a physical address names. Everything else asks it for a key,
a key's kind or an address's location; nobody builds or parses one by hand (an
architecture test, tests/unit/test_architecture.py, holds every other module to it).
Garbage collection's safety depends on exactly this agreeing with what the writers write.

Physical addresses (an entry's `physical_address`: `/abs/path`, `file:///abs/path`,
`s3://bucket/key`, or any opaque string a client chose):

- check_physical_address: what a client stages. Refused (INVALID_ARGUMENT,
  INVALID_PHYSICAL_ADDRESS) when a segment is `..`, `.` or empty (`a//b`, a trailing
  `/`), also once percent-decoded (`%2e%2e`, `%2f`), or holds NUL: such an address means
  different objects to different readers (the OS and Hadoop resolve `..`, S3 does not), so
  a check on its text could pass while a read lands elsewhere. Refused, never rewritten:
  what a client stages is what it reads back.
- address_location: where a reader opens an address ("local", "/abs/path") or ("s3",
  "bucket/key"); every read (quarry.blob.open_object) and the namespace check of
  fs:ImportFromStorage (inside_namespace) go through it.
- referenced_keys: for garbage collection's reachability walk, every key of a namespace
  an address recorded in the past (before any check) could reach, resolved or literal: GC
  keeps all of them.
"""

from __future__ import annotations

import posixpath
import re
import urllib.parse
import uuid
from typing import NamedTuple

from quarry import errors
from quarry.blob.namespace import namespace_location, parse_storage_namespace


class InvalidPhysicalAddress(errors.InvalidArgument):
    """A staged physical address with a `..`, `.` or empty segment (also percent-encoded)."""

    reason = "INVALID_PHYSICAL_ADDRESS"


# ---- keys of a storage namespace --------------------------------------------------------------
#
#   _quarry/repository.json                  the ownership marker (quarry.blob.ownership)
#   _quarry/ranges/<id>.parquet              a range (committed/format.py), by content id
#   _quarry/metaranges/<id>.parquet          a metarange, by content id
#   _quarry/gc/reports/<run>.json            a GC report (spark/gc.py)
#   data/<32 hex>                            `quarry put --from` (cli/upload.py), a uuid4
#   data/spark/<job id>/part-…               a Spark write's files (spark/executor.py, native.py)
#
# Only ranges, metaranges and the two data shapes are ever collected by GC (classify).

INTERNAL_PREFIX = "_quarry/"
MARKER_KEY = "_quarry/repository.json"
RANGES_PREFIX = "_quarry/ranges/"
METARANGES_PREFIX = "_quarry/metaranges/"
RANGE_KEY = re.compile(r"_quarry/ranges/([0-9a-f]{64})\.parquet")
METARANGE_KEY = re.compile(r"_quarry/metaranges/([0-9a-f]{64})\.parquet")
GC_REPORTS_PREFIX = "_quarry/gc/reports/"
DATA_PREFIX = "data/"
# The exact key new_upload_key makes (`data/` + a uuid4's 32 hex digits).
UPLOAD_KEY = re.compile(r"data/[0-9a-f]{32}")
# A local store writes each file as a temporary file beside its target, then renames it
# (quarry.blob.local): one left by a writer killed mid-way is never listed, and is garbage.
TEMP_FILE_PREFIX = ".quarry-tmp-"
TEMP_FILE_KEY = re.compile(r"(?:[^/]+/)*\.quarry-tmp-[0-9a-f]{32}")
# Data files of a Spark write live under this prefix, one folder per job, so a failed
# job's files are found (and removed) by one listing.
JOB_DATA_PREFIX = "data/spark/"
# A Spark job id (quarry.spark.common.new_job_id): UTC time and 12 hex digits.
JOB_ID_PATTERN = r"\d{8}T\d{6}-[0-9a-f]{12}"
# The extension of a Spark write's files, by format.
JOB_FILE_EXTENSIONS = {"parquet": "snappy.parquet", "csv": "csv", "json": "json"}
# Spark's writer (quarry.spark.native) partitions by hidden copies of the partition
# columns named so; their folders exist only in the physical keys of the job's folder.
SPARK_PARTITION_COLUMN = "__quarry_partition_"
# The name Spark's writer gives a Parquet file: part-<Spark partition>-<write UUID>-c<file
# counter> ('.' before the counter in a partitioned write).
SPARK_WRITER_FILE_NAME = (
    r"part-(?P<partition>\d{5,})-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    r"[-.]c(?P<counter>\d{3,})\.snappy\.parquet"
)
# A committed file of Spark's writer, relative to its job's folder: (partition folders,
# Spark partition, file counter).
SPARK_COMMITTED_FILE = re.compile(
    r"(?P<folders>(?:"
    + re.escape(SPARK_PARTITION_COLUMN)
    + r"\d+=[^/]+/)*)"
    + SPARK_WRITER_FILE_NAME
)
# The exact keys Spark jobs write in their folder: what GC may recognize as a Spark job's
# data file (classify) and what a failed job's cleanup deletes. Either job_file_key's (the
# Python workers' files), or Spark's writer's: committed files, under its hidden partition
# folders, and its task attempts' files under _temporary/ (left there by a job whose driver
# died).
JOB_FILE_KEY = re.compile(
    re.escape(JOB_DATA_PREFIX)
    + JOB_ID_PATTERN
    + "/(?:"
    + r"part-\d{5,}-c\d{3,}-t\d+\."
    + "(?:"
    + "|".join(re.escape(ext) for ext in JOB_FILE_EXTENSIONS.values())
    + ")"
    + "|"
    + r"(?:_temporary/\d+/(?:_temporary/attempt_[0-9a-z_]+/|task_[0-9a-z_]+/)?)?"
    + r"(?:"
    + re.escape(SPARK_PARTITION_COLUMN)
    + r"\d+=[^/]+/)*"
    + SPARK_WRITER_FILE_NAME
    + ")"
)


def range_key(range_id: str) -> str:
    return f"{RANGES_PREFIX}{range_id}.parquet"


def metarange_key(metarange_id: str) -> str:
    return f"{METARANGES_PREFIX}{metarange_id}.parquet"


def gc_report_key(run_id: str) -> str:
    return f"{GC_REPORTS_PREFIX}{run_id}.json"


def new_upload_key() -> str:
    """A new key for an upload's bytes (never an existing one's: a uuid4)."""
    return f"{DATA_PREFIX}{uuid.uuid4().hex}"


def job_folder(job_id: str) -> str:
    """The folder (no trailing slash) of a Spark job's files."""
    return f"{JOB_DATA_PREFIX}{job_id}"


def job_file_key(job_id: str, fmt: str, partition: int, index: int, task_attempt_id: int) -> str:
    """A Python worker's file of a Spark job (`task_attempt_id` is unique per task attempt
    in the Spark application, so a retried task never overwrites an earlier attempt's)."""
    return (
        f"{job_folder(job_id)}/part-{partition:05d}-c{index:03d}"
        f"-t{task_attempt_id}.{JOB_FILE_EXTENSIONS[fmt]}"
    )


def job_of_key(key: str) -> str | None:
    """The job id whose folder holds `key`, None for a key outside every job's folder."""
    if not key.startswith(JOB_DATA_PREFIX):
        return None
    return key[len(JOB_DATA_PREFIX) :].split("/", 1)[0]


# Kinds of keys (Classified.kind). Only RANGE, METARANGE and DATA may ever be collected.
RANGE, METARANGE, DATA, INTERNAL, FOREIGN = "range", "metarange", "data", "internal", "foreign"
COLLECTABLE = frozenset({RANGE, METARANGE, DATA})


class Classified(NamedTuple):
    # "range", "metarange", "data": objects Quarry wrote, which GC may collect when nothing
    # refers to them; "internal": Quarry's other files (markers, reports), never collected;
    # "foreign": anything Quarry did not write, never collected.
    kind: str
    id: str = ""  # the range or metarange id


def classify(key: str) -> Classified:
    """What an object of the storage namespace is, from its key. Only the exact key shapes
    Quarry itself writes are collectable (ranges and metaranges named by content id, upload
    data `data/<uuid hex>`, Spark job files `data/spark/<job id>/part-…`); every other key,
    whatever its age, depth or resemblance, is internal or foreign and never a candidate
    (a local store's temporary file, `<dir>/.quarry-tmp-<32 hex>`, is data a killed writer
    left):
    GC must never delete a file Quarry did not write."""
    for pattern, kind in ((RANGE_KEY, RANGE), (METARANGE_KEY, METARANGE)):
        match = pattern.fullmatch(key)
        if match:
            return Classified(kind, match.group(1))
    if UPLOAD_KEY.fullmatch(key) or JOB_FILE_KEY.fullmatch(key) or TEMP_FILE_KEY.fullmatch(key):
        return Classified(DATA)
    if key.startswith(INTERNAL_PREFIX):
        return Classified(INTERNAL)
    return Classified(FOREIGN)


# ---- physical addresses ---------------------------------------------------------------------

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
# Percent-decoding is applied this many times at most when looking for hidden segments
# (`%252e` is `%2e` once decoded, `.` twice).
_DECODE_ROUNDS = 3


class Location(NamedTuple):
    kind: str  # "local" or "s3"
    where: str  # "/abs/path" (local) or "bucket/key" (s3)


def _path_part(address: str) -> tuple[str, str, bool]:
    """(scheme, the part a reader splits into segments, whether that part is a local
    absolute path): `/abs/x` → ("", "abs/x", True); `file:///abs/x`, `file://localhost/abs/x`
    and `file:/abs/x` → ("file", "abs/x", True); `s3://bucket/key` → ("s3", "bucket/key",
    False); an opaque `a/b` → ("", "a/b", False)."""
    match = _SCHEME.match(address)
    if match is None:
        if address.startswith("/"):
            return "", address[1:], True
        return "", address, False
    scheme, rest = match.group()[:-1].lower(), address[match.end() :]
    if scheme == "file":
        if rest.startswith("//localhost/"):
            rest = rest[len("//localhost") :]
        elif rest.startswith("///"):
            rest = rest[2:]
        elif rest.startswith("//"):
            return scheme, rest[2:], False  # another host's file: opaque here
        if rest.startswith("/"):
            return scheme, rest[1:], True
        return scheme, rest, False
    return scheme, rest[2:] if rest.startswith("//") else rest, False


def _plain(part: str) -> bool:
    """The fast path: no segment of `part` can be empty, `.` or `..`, or decode to one."""
    return bool(part) and not (
        "%" in part
        or "//" in part
        or "/." in part
        or part.startswith((".", "/"))
        or part.endswith("/")
        or "\x00" in part
    )


def bad_segment(part: str) -> str | None:
    """The first refused segment of `part` (or of its percent-decoded forms), else None."""
    form = part
    for _ in range(_DECODE_ROUNDS + 1):
        if "\x00" in form:
            return "NUL"
        for segment in form.split("/"):
            if segment in ("", ".", ".."):
                return segment or "an empty segment"
        decoded = urllib.parse.unquote(form)
        if decoded == form:
            return None
        form = decoded
    return None


def check_physical_address(address: str, path: str = "") -> str:
    """`address` unchanged when no segment of it is `..`, `.` or empty, also once
    percent-decoded; InvalidPhysicalAddress otherwise (naming the entry's `path`, when
    given). An empty address (an entry that records none) is allowed.

    Safety: every staged entry passes here (quarry.graveler.names.check_entry) before any
    check of where it points: an address that could resolve outside the place its text
    names never becomes an entry."""
    if not address:
        return address
    _, part, _ = _path_part(address)
    _refuse_dotted(address, part, path)
    return address


def _refuse_dotted(address: str, part: str, path: str = "") -> None:
    """check_physical_address of `address` whose _path_part is `part`."""
    if _plain(part):
        return
    bad = bad_segment(part)
    if bad is None:
        return
    where = f"{path}: " if path else ""
    raise InvalidPhysicalAddress(
        f"{where}physical address {address[:200]!r} has {bad!r} as a segment: '..', '.' and "
        f"empty segments are not allowed (also percent-encoded); give the object's own address",
        metadata={"physical_address": address, "segment": bad, **({"path": path} if path else {})},
    )


def address_location(address: str) -> Location | None:
    """Where a reader opens `address`: ("local", "/abs/path") for `/abs/path` and file URLs
    (percent-decoded, as a file URL is), ("s3", "bucket/key") for s3/s3a/s3n URLs; None for
    any other form (a relative or opaque address, another scheme). Refused
    (InvalidPhysicalAddress) as check_physical_address refuses."""
    if not address:
        return None  # an entry that records no address: nothing to open
    scheme, part, absolute = _path_part(address)
    _refuse_dotted(address, part)  # as check_physical_address refuses, from the one parse
    if absolute:
        # A file URL is percent-decoded by its readers; a plain path is taken as it is.
        return Location("local", "/" + (urllib.parse.unquote(part) if scheme else part))
    if scheme in ("s3", "s3a", "s3n") and "/" in part:
        return Location("s3", part)
    return None


def inside_namespace(address: str, storage_namespace: str) -> bool:
    """Whether the object a reader opens at `address` lies inside the (normalized)
    namespace, whatever the notation of either (`/ns/x` and `file:///ns/x` alike).
    InvalidPhysicalAddress for an address check_physical_address refuses: never an answer
    about an address whose text and target may differ."""
    return inside_location(address, namespace_location(storage_namespace))


def inside_location(address: str, root: tuple[str, str]) -> bool:
    """inside_namespace with the namespace's location (namespace_location) computed once."""
    location = address_location(address)
    if location is None:
        return False
    kind, prefix = root
    return location.kind == kind and (location.where.rstrip("/") + "/").startswith(prefix)


def referenced_keys(storage_namespace: str, address: str) -> frozenset[str]:
    """Every key of the namespace that `address` may name, for garbage collection's
    reachability walk: GC keeps an object when ANY entry's address may reach it.

    Entries recorded before check_physical_address existed may hold `..`, `.`, doubled
    slashes or percent-encoding, and readers disagree on them (the OS and Hadoop resolve
    `..` and collapse `//`, S3 keeps a key's text as it is). So every reading counts: the
    literal key, the key with `//` and `/./` collapsed, with `..` resolved, each also
    percent-decoded. Notations of the namespace count alike (`/ns`, `file:///ns`,
    `file://localhost/ns`, `file:/ns`; `s3`, `s3a`, `s3n`). A key outside the namespace
    (`..` climbing out of it) names nothing of it.

    Safety: never fewer keys than any reader may open at `address`; over-keeping only
    delays collection."""
    kind, where, prefix = parse_storage_namespace(storage_namespace)
    if kind == "local":
        base = where.rstrip("/") + "/"
        forms = [re.sub(r"^file:(//localhost(?=/))?", "", address, flags=re.IGNORECASE)]
    else:
        base = f"{where}/{prefix + '/' if prefix else ''}"
        scheme = re.match(r"s3[an]?://", address, flags=re.IGNORECASE)
        forms = [address[scheme.end() :]] if scheme else []
    found: set[str] = set()
    for _ in range(_DECODE_ROUNDS + 1):
        if not forms:
            break
        text = forms[-1]
        collapsed = re.sub(r"/(\./)+", "/", re.sub(r"/{2,}", "/", text))
        for reading in (text, collapsed, posixpath.normpath(collapsed) if collapsed else ""):
            if kind == "local" and reading.startswith("/"):
                reading = "/" + reading.lstrip("/")  # `//ns` is `/ns` to the OS
            if reading.startswith(base) and len(reading) > len(base):
                found.add(reading[len(base) :])
        decoded = urllib.parse.unquote(text)
        if decoded == text:
            break
        forms.append(decoded)
    return frozenset(found)


def object_address(storage_namespace: str, key: str) -> str:
    """The physical address of `key` inside the namespace, in the namespace's own notation
    (/abs/dir/key, file:///abs/dir/key or s3://bucket/prefix/key)."""
    parse_storage_namespace(storage_namespace)  # rejects what no store could open
    return storage_namespace.rstrip("/") + "/" + key
