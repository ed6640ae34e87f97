"""Reading a ref from Spark.

`entries(spark, "quarry://REPO/REF/PREFIX")` is a DataFrame of the entries at REF: the
committed ones come straight from the range Parquet files of the ref's metarange (the
driver makes one metarange lookup; executors read the ranges, no RPC per object), and when
REF is a branch its uncommitted changes (from DiffUncommitted, one RPC per page of changes)
are laid over them.

`read(spark, "quarry://REPO/REF/PATH", format="parquet")` reads the data files of those
entries with Spark's own reader: time travel by commit id, tag or `branch@`.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quarry import errors
from quarry.spark.common import Connection, QuarryUri, open_client, parse_uri
from quarry.v1 import types_pb2

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from quarry.client import Client


class NothingToRead(errors.NotFound):
    reason = "NO_OBJECTS_UNDER_PATH"


# The columns of an entries DataFrame: quarry.v1.Entry's fields, in their order.
ENTRY_COLUMNS = tuple(field.name for field in types_pb2.Entry.DESCRIPTOR.fields)
ENTRIES_DDL = (
    "path string, physical_address string, size_bytes long, checksum string, "
    "mtime timestamp, content_type string, metadata map<string,string>"
)
# How Spark reads a range file (identity is FIXED_LEN_BYTE_ARRAY(32): binary).
RANGE_DDL = ENTRIES_DDL + ", identity binary"


@dataclass(frozen=True)
class Snapshot:
    """What a ref's entries are made of."""

    storage_namespace: str
    commit_id: str
    metarange_id: str
    changes: tuple  # uncommitted quarry.v1.Change under the prefix (branches only)


def snapshot(client: Client, repository: str, ref: str, prefix: str = "") -> Snapshot:
    """The committed base and (for a branch) the uncommitted changes of `ref`. The branch
    is read again after its changes: if a commit moved it meanwhile, the snapshot is taken
    again, so base and changes always belong together."""
    repo = client.get_repository(repository)
    for _ in range(10):
        committed = ref
        try:
            branch = client.get_branch(repository, ref)
        except (errors.NotFound, errors.InvalidArgument):
            branch = None  # a tag, a commit id, `branch@`, `~N`...
        except errors.PermissionDenied:
            # GetBranch of a tag's name asks for fs:ReadBranch on a branch of that name,
            # which a reader of tags need not hold. But a branch read as its last commit
            # would silently lose its uncommitted changes (tester hAN): only a tag (read at
            # its own commit, even beside a branch of its name: tester hAP) or a ref of a
            # commit reference's shape goes on.
            committed = _not_a_branch(client, repository, ref)
            branch = None
        if branch is None:
            commit = client.get_commit(repository, committed)
            return Snapshot(repo.storage_namespace, commit.id, commit.metarange_id, ())
        changes = tuple(client.iter_uncommitted(repository, ref, prefix=prefix))
        again = client.get_branch(repository, ref)
        if again.commit_id == branch.commit_id:
            commit = client.get_commit(repository, branch.commit_id)
            return Snapshot(repo.storage_namespace, commit.id, commit.metarange_id, changes)
    from quarry.graveler.errors import BranchContended

    raise BranchContended(
        f"branch {ref!r} kept moving while it was read",
        metadata={"repository": repository, "branch": ref},
    )


# What only a commit reference can look like: a ref with a modifier (`main@`, `v1~2`,
# `abc^2`), or a commit id (hex).
_COMMIT_REF = re.compile(r".*[@~^].*|[0-9a-f]{6,64}")


def _not_a_branch(client: Client, repository: str, ref: str) -> str:
    """What to read for a ref GetBranch refused: a tag's own commit id, or the ref itself
    when it has a commit reference's shape; else the refusal stands (PermissionDenied)."""
    try:
        return client.get_tag(repository, ref).commit_id
    except (errors.NotFound, errors.PermissionDenied, errors.InvalidArgument):
        if _COMMIT_REF.fullmatch(ref) is not None:
            return ref
    raise errors.PermissionDenied(
        f"{ref!r} may be a branch this caller may not read (fs:ReadBranch): its uncommitted "
        "changes cannot be read, and reading it without them would be a wrong answer",
        metadata={"repository": repository, "ref": ref, "action": "fs:ReadBranch"},
    )


def check_reads_every_object(client: Client, repository: str, prefix: str) -> None:
    """Safety rule: Spark reads the range files (every entry under `prefix`, addresses
    included) and the objects with the storage's own access, where Quarry's per-object
    policies cannot act on each object; so the caller must be allowed fs:ReadObject on every
    object under `prefix` (Auth/CheckPermission every_under), else PermissionDenied before
    anything is read (tester hAK: a Deny on `secret/*` did not stop it). A server with auth
    off has no Auth service (Unimplemented): there is nothing to check."""
    from quarry.auth.policy import object_arn

    try:
        client.check_permission("fs:ReadObject", object_arn(repository, prefix), every_under=True)
    except errors.Unimplemented:
        return


def range_ids_under(
    storage_namespace: str, metarange_id: str, prefix: str, connection: Connection
) -> list[str]:
    """The ranges of a metarange that can hold paths under `prefix` (by their bounds)."""
    from quarry.blob import open_blob_store
    from quarry.committed.metaranges import read_metarange

    with open_blob_store(storage_namespace, connection) as store:
        ranges = read_metarange(store, metarange_id)
    return [
        r.id
        for r in ranges
        if r.max_key >= prefix and (not prefix or r.min_key < prefix + "\U0010ffff")
    ]


def ranges_dataframe(
    spark: SparkSession, storage_namespace: str, range_ids: list[str], connection: Connection
) -> DataFrame:
    """Every row of the given range files (columns RANGE_DDL). A local namespace is read
    by Spark's Parquet reader in place; other stores by executors through the object
    store (range files are small Parquet files, read whole). The ids come from a metarange
    read_metarange accepted (this build's format), so the ranges are of this format too;
    readers here use the entry columns only, never the identity column."""
    from quarry.blob import parse_storage_namespace
    from quarry.committed import format as rformat

    if not range_ids:
        return spark.createDataFrame([], RANGE_DDL)
    kind, root, _ = parse_storage_namespace(storage_namespace)
    if kind == "local":
        import os

        paths = [spark_location(os.path.join(root, rformat.range_key(rid))) for rid in range_ids]
        return spark.read.schema(RANGE_DDL).parquet(*paths)
    slices = max(1, min(len(range_ids), spark.sparkContext.defaultParallelism * 4))
    ids = spark.createDataFrame([(rid,) for rid in range_ids], "range_id string")
    return ids.repartition(slices).mapInArrow(
        _range_reader(storage_namespace, connection), RANGE_DDL
    )


def _range_reader(
    storage_namespace: str, connection: Connection
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        from quarry.blob import open_blob_store
        from quarry.committed import format as rformat

        # Spark's Arrow bridge has no fixed-size binary: identity goes over as plain binary,
        # the type Spark's Parquet reader gives it too.
        schema = rformat.RANGE_SCHEMA.set(
            rformat.RANGE_SCHEMA.get_field_index("identity"),
            pa.field("identity", pa.binary(), nullable=False),
        )
        with open_blob_store(storage_namespace, connection) as store:
            for batch in batches:
                for rid in batch.column(0).to_pylist():
                    table = rformat.decode_range(store.get(rformat.range_key(rid)))
                    yield from table.cast(schema).to_batches()

    return run


def entries(spark: SparkSession, uri: str, *, connection: Connection | None = None) -> DataFrame:
    """A DataFrame (ENTRY_COLUMNS) of the entries under PATH at REF of
    `quarry://REPO/REF/PATH`, with a branch's uncommitted changes."""
    target = parse_uri(uri)
    return _entries(spark, target, target.path, connection)  # a plain prefix, like ListObjects


def _entries(
    spark: SparkSession, target: QuarryUri, prefix: str, connection: Connection | None
) -> DataFrame:
    from pyspark.sql import functions as F

    connection = Connection.resolve(spark, connection)
    with open_client(connection) as client:
        check_reads_every_object(client, target.repository, prefix)
        snap = snapshot(client, target.repository, target.ref, prefix)
    range_ids = range_ids_under(snap.storage_namespace, snap.metarange_id, prefix, connection)
    committed = ranges_dataframe(spark, snap.storage_namespace, range_ids, connection)
    if prefix:
        committed = committed.where(F.col("path").startswith(prefix))
    committed = committed.select(*ENTRY_COLUMNS)
    if not snap.changes:
        return committed
    touched = spark.createDataFrame([(c.path,) for c in snap.changes], "path string")
    staged = spark.createDataFrame(
        [_entry_row(c.entry) for c in snap.changes if c.type != types_pb2.CHANGE_TYPE_REMOVED],
        ENTRIES_DDL,
    )
    return committed.join(F.broadcast(touched), "path", "left_anti").unionByName(staged)


def _entry_row(entry: types_pb2.Entry) -> tuple:
    mtime = (
        entry.mtime.ToDatetime(tzinfo=_dt.UTC)
        if entry.HasField("mtime")
        else _dt.datetime.fromtimestamp(0, _dt.UTC)
    )
    return (
        entry.path,
        entry.physical_address,
        entry.size_bytes,
        entry.checksum,
        mtime,
        entry.content_type,
        dict(entry.metadata),
    )


def spark_location(physical_address: str) -> str:
    """Where Spark's readers find a physical address (s3:// is Hadoop's s3a://), with the
    characters Hadoop reads as a glob pattern escaped (a namespace with `[` or `{` in its
    path read as PATH_NOT_FOUND)."""
    if physical_address.startswith("s3://"):
        physical_address = "s3a://" + physical_address[len("s3://") :]
    return _HADOOP_GLOB.sub(r"\\\1", physical_address)


# What Hadoop's path globbing (GlobPattern) gives a meaning; a backslash escapes it.
_HADOOP_GLOB = re.compile(r"([\\\[\]{}*?])")


def read(
    spark: SparkSession,
    uri: str,
    format: str = "parquet",
    *,
    connection: Connection | None = None,
    **options: Any,
) -> DataFrame:
    """The data under PATH at REF of `quarry://REPO/REF/PATH`. PATH is a folder: its files
    are read, but for hidden ones (a name starting with `_` or `.`: `_SUCCESS`, `.crc`,
    `.DS_Store`, as Spark's own reader skips them). Local files are read by Spark's
    `format` reader (`options` are passed to it; for "csv", header and inferSchema default
    to true, as `write` writes a header); Parquet files in S3 by executors through the
    object store (no Hadoop S3 connector needed), other formats in S3 by Spark's reader
    through s3a://."""
    target = parse_uri(uri)
    connection = Connection.resolve(spark, connection)
    if format == "csv":
        # `write` puts a header line in every CSV file: read them the same way (a round
        # trip gave header lines as rows and columns _c0, _c1). Headerless files:
        # header=False.
        # escape='"': the quoting `write`'s CSV writer uses (a doubled quote), not Spark's
        # backslash default (`say "hi"` came back as `"say ""hi"""`).
        options = {"header": "true", "inferSchema": "true", "escape": '"', **options}
    listing = _entries(spark, target, target.prefix, connection)
    addresses = [
        row.physical_address
        for row in listing.select("path", "physical_address").orderBy("path").collect()
        if not row.path.rpartition("/")[2].startswith(("_", "."))
    ]
    if not addresses:
        raise NothingToRead(f"no objects under {uri}", metadata={"uri": uri})
    if format == "parquet" and not options and all(a.startswith("s3://") for a in addresses):
        return _read_parquet_objects(spark, addresses, connection)
    return spark.read.format(format).options(**options).load([spark_location(a) for a in addresses])


def _object(address: str, stores: dict, connection: Connection) -> bytes:
    """The bytes at an s3:// address (one store per bucket, kept in `stores`)."""
    from quarry.blob import open_blob_store

    bucket, _, key = address[len("s3://") :].partition("/")
    if bucket not in stores:
        stores[bucket] = open_blob_store(f"s3://{bucket}", connection)
    return stores[bucket].get(key)


def _read_parquet_objects(
    spark: SparkSession, addresses: list[str], connection: Connection
) -> DataFrame:
    """Parquet files in S3 read by executors with pyarrow; the schema is the first file's
    (later files are cast to it; a column a later file lacks is null, as Spark's reader
    makes it)."""
    import io

    import pyarrow as pa  # at run time (the module's is for type checking)
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = pq.read_schema(io.BytesIO(_object(addresses[0], {}, connection)))
    # Nullable, as Spark's Parquet reader makes every column: a later file may lack one.
    schema = pa.schema([field.with_nullable(True) for field in schema.remove_metadata()])

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        stores: dict = {}
        for batch in batches:
            for address in batch.column(0).to_pylist():
                table = pq.read_table(io.BytesIO(_object(address, stores, connection)))
                columns = [
                    table.column(field.name).cast(field.type)
                    if field.name in table.column_names
                    else pa.nulls(table.num_rows, field.type)
                    for field in schema
                ]
                yield from pa.Table.from_arrays(columns, schema=schema).to_batches()

    slices = max(1, min(len(addresses), spark.sparkContext.defaultParallelism * 4))
    files = spark.createDataFrame([(a,) for a in addresses], "address string")
    return files.repartition(slices).mapInArrow(run, from_arrow_schema(schema))
