"""`quarry.spark.write`: an all-or-nothing DataFrame write into a branch.

    commit = quarry.spark.write(df, "quarry://lake/main/tables/events", mode="append",
                                message="load 2026-11-26")

The driver
1. checks the target has no uncommitted changes (the merge would refuse them), and creates
   an ephemeral branch `_quarry-spark-<time>-<random>` at the target's HEAD;
2. (overwrite) stages the removal of everything under PATH on it (with dynamic partition
   overwrite: after the job, of the partition folders it wrote);
3. runs one Spark job that writes the data files into the job's folder of the storage
   namespace: Spark's own Parquet writer where it can (quarry.spark.native: the rows never
   leave the JVM; the driver then describes the committed files), else tasks in the Python
   workers that write the files and stage their entries on the ephemeral branch
   (quarry.spark.executor). The choice is native.spark_writes_files; what follows is one
   flow for both;
4. commits exactly the files the successful task attempts reported (what failed or losing
   speculative attempts staged is removed or replaced first, and the commit is checked);
   its message names the job ("Files of Spark job <job> (N files): <message>");
5. merges that commit into the target with the write's message: that merge commit is what
   `write` returns and what a first-parent log of the target shows, one per write (a full
   log also shows the job's commit, under its own message). A merge rather than a squash
   keeps the job's exact files as one commit and makes "did the merge land?" an exact
   ancestry check after a lost answer. The committer retries a merge that lost a race by
   merging its previous result onto the new HEAD;
   the commits and the merge carry request ids derived from the job id (job_request_id),
   so a retry after a lost answer gets the first result and never merges twice;
6. deletes the ephemeral branch.

Any failure (a task that fails for good, a cancelled job, a merge conflict) leaves the
target exactly as it was: the ephemeral branch and its staged entries are dropped and the
job's data files are deleted. If the driver dies, `sweep_ephemeral_branches` (run by
`quarry gc`) drops the branch later and GC removes its files.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quarry import errors, telemetry
from quarry.blob import layout
from quarry.convert import entry_from_proto
from quarry.spark.common import (
    Connection,
    QuarryUri,
    ephemeral_branch,
    new_job_id,
    open_client,
    parse_uri,
)
from quarry.spark.executor import (
    FORMATS,
    JOB_FILE_KEY,
    RESULT_SCHEMA,
    WriteSpec,
    file_entry,
    is_job_file,
    job_path_prefix,
    write_task,
)
from quarry.spark.native import spark_writes_files, write_files
from quarry.v1 import types_pb2

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from quarry.client import Client

log = logging.getLogger("quarry.spark")

MODES = ("append", "overwrite")
# Rounds of "stage exactly the reported files, commit, check" before giving up.
RECONCILE_ROUNDS = 5
# Request ids of a job's commits and merge are derived from its job id under this namespace.
_REQUEST_ID_NAMESPACE = uuid.UUID("5b0e6f44-4d8c-4f0e-9a57-0c7a1d1d6a51")


def job_request_id(job_id: str, step: str) -> str:
    """The stable request id (AIP-155) of one step of a job ("commit-<round>", "merge"):
    every attempt of that step, by the client's retries or by a driver calling it again
    after a lost answer, carries the same id, so the server answers with the first result
    instead of committing or merging twice."""
    return str(uuid.uuid5(_REQUEST_ID_NAMESPACE, f"{job_id}/{step}"))


class InvalidWriteOptions(errors.InvalidArgument):
    reason = "INVALID_WRITE_OPTIONS"


class ConcurrentOverwrite(errors.Aborted):
    """What an overwrite replaces changed on the target while it ran (another write)."""

    reason = "CONCURRENT_OVERWRITE"


# Attempts of an overwrite's merge whose target moved elsewhere meanwhile.
OVERWRITE_MERGE_ATTEMPTS = 5


class WriteIncomplete(errors.Aborted):
    """Late task attempts kept changing the job's files on the ephemeral branch."""

    reason = "SPARK_WRITE_UNSETTLED"


def _identity(entry: types_pb2.Entry) -> bytes:
    """The entry's identity (docs/architecture.md §2: every field a user reads back but mtime,
    the physical address included), the rule every other comparison of entries uses."""
    return entry_from_proto(entry).identity


def _default_committer(client: Client, spark: SparkSession) -> str:
    """Who a write is committed as when the caller names no one: the authenticated user
    (naming anyone else needs auth:CommitAsOtherUser: the Spark user, an OS account, was
    refused for every user without it), the Spark user with auth off."""
    try:
        return client.whoami().principal_id
    except errors.Unimplemented:
        return spark.sparkContext.sparkUser()


def write(  # noqa: PLR0913 — the public keyword API (DataFrameWriter's options), used by jobs
    df: DataFrame,
    uri: str,
    format: str = "parquet",
    mode: str = "append",
    message: str = "",
    metadata: Mapping[str, str] | None = None,
    *,
    committer: str = "",
    max_records_per_file: int = 0,
    partition_by: str | Sequence[str] = (),
    connection: Connection | None = None,
) -> types_pb2.Commit:
    """Write `df` under PATH of `quarry://REPO/BRANCH/PATH` in one commit on BRANCH and
    return that commit (the merge commit on the target branch). With nothing to write in
    append mode, nothing is committed and the branch's HEAD commit is returned. The
    committer defaults to the authenticated user (the Spark user when auth is off).

    `partition_by` (like DataFrameWriter.partitionBy) puts the files in Hive-style folders
    PATH/col=value/...; unlike Hive the columns also stay in the files, so `read` of PATH
    or of one partition folder returns them."""
    target = parse_uri(uri)
    if format not in FORMATS:
        raise InvalidWriteOptions(f"format {format!r} is not one of {', '.join(FORMATS)}")
    if mode not in MODES:
        raise InvalidWriteOptions(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if max_records_per_file < 0:
        raise InvalidWriteOptions("max_records_per_file may not be negative")
    partition_by = (partition_by,) if isinstance(partition_by, str) else tuple(partition_by)
    unknown = [c for c in partition_by if c not in df.columns]
    if (
        unknown
        or len(set(partition_by)) != len(partition_by)
        or len(partition_by) >= len(df.columns) > 0
    ):
        raise InvalidWriteOptions(
            f"partition_by {list(partition_by)}: needs distinct columns of the DataFrame "
            f"({', '.join(df.columns)}) and at least one column left for the data"
        )
    if mode == "overwrite" and not target.prefix:
        raise InvalidWriteOptions(
            "overwrite needs a PATH: it would replace the whole repository", metadata={"uri": uri}
        )
    if format == "csv":
        # Before any task runs, as Spark's own CSV writer refuses them (it failed in a
        # Python worker after the job ran).
        nested = [
            f.name for f in df.schema.fields if f.dataType.typeName() in ("struct", "array", "map")
        ]
        if nested:
            raise InvalidWriteOptions(
                f"csv cannot hold the nested columns {', '.join(nested)}: write parquet or "
                "json, or flatten them first"
            )
    spark = df.sparkSession
    connection = Connection.resolve(spark, connection)

    with (
        open_client(connection) as client,
        telemetry.tracer("quarry.spark").start_as_current_span(
            "quarry.spark.write",
            attributes={
                "quarry.repository": target.repository,
                "quarry.branch": target.ref,
                "quarry.path": target.path,
                "quarry.spark.mode": mode,
            },
        ) as span,
    ):
        job = _Job(
            client,
            spark,
            connection,
            _JobOptions(
                target,
                format,
                mode,
                message,
                dict(metadata or {}),
                committer or _default_committer(client, spark),
                max_records_per_file,
                partition_by,
            ),
        )
        span.set_attribute("quarry.spark.job", job.job_id)
        return job.run(df)


@dataclass(frozen=True)
class _JobOptions:
    """What `write` was asked to do, validated."""

    target: QuarryUri
    format: str
    mode: str
    message: str
    metadata: dict[str, str]
    committer: str
    max_records_per_file: int
    partition_by: tuple[str, ...] = ()


class _Job:
    def __init__(
        self, client: Client, spark: SparkSession, connection: Connection, options: _JobOptions
    ):
        self.client, self.spark, self.connection = client, spark, connection
        self.target = options.target
        self.format, self.mode, self.committer = options.format, options.mode, options.committer
        self.max_records_per_file = options.max_records_per_file
        self.partition_by = options.partition_by
        self.job_id = new_job_id()
        self.branch = ephemeral_branch(self.job_id)
        self.message = (
            options.message or f"Spark {self.mode} of {self.target.prefix or '/'} ({self.format})"
        )
        self.metadata = {
            **options.metadata,
            "quarry.spark.job": self.job_id,
            "quarry.spark.mode": self.mode,
        }
        self.ephemeral_commit = ""
        self.merge_attempted = False
        self.spark_writes_files = False

    def run(self, df: DataFrame) -> types_pb2.Commit:
        repo = self.target.repository
        repository = self.client.get_repository(repo)
        self.storage_namespace = repository.storage_namespace
        self.spark_writes_files = spark_writes_files(
            self.spark,
            df,
            self.storage_namespace,
            self.format,
            self.partition_by,
            self.max_records_per_file,
        )
        head = self.client.branch_to_write(repo, self.target.ref)
        self._require_clean_target()
        self.client.create_branch(repo, self.branch, head.commit_id)
        try:
            result = self._write_commit_merge(df, head)
        except BaseException:
            merged = self._merged() if self.merge_attempted else False
            if merged:
                # The merge landed but its answer was lost: the write succeeded.
                log.warning("merge of %s landed although the call failed", self.branch)
                self._delete_branch()
                return self._merge_commit()
            self._delete_branch()
            if merged is False:  # unknown (None): keep the files, GC decides later
                self._delete_job_files()
            raise
        self._delete_branch()
        return result

    def _write_commit_merge(self, df: DataFrame, head: types_pb2.Branch) -> types_pb2.Commit:
        repo, prefix = self.target.repository, self.target.prefix
        removed = 0
        # Like Spark: with spark.sql.sources.partitionOverwriteMode=dynamic, an overwrite
        # of a partitioned write replaces only the partitions it writes.
        dynamic = (
            self.mode == "overwrite"
            and bool(self.partition_by)
            and (
                self.spark.conf.get("spark.sql.sources.partitionOverwriteMode") or "static"
            ).lower()
            == "dynamic"
        )
        replaced: list[str] = []  # the prefixes an overwrite replaces
        if self.mode == "overwrite" and not dynamic:
            old = (e.path for e in self.client.iter_objects(repo, self.branch, prefix=prefix))
            removed = self.client.delete_objects(repo, self.branch, old)
            replaced = [prefix]
        files = self._run_tasks(df)
        if dynamic:
            folders = sorted({f["path"].rsplit("/", 1)[0] + "/" for f in files})
            replaced = folders
            old = (
                e.path
                for folder in folders
                for e in self.client.iter_objects(repo, self.branch, prefix=folder)
                if not is_job_file(self.spec, e.path)
            )
            removed = self.client.delete_objects(repo, self.branch, old)
        if not files and not removed:
            return self.client.get_commit(repo, head.commit_id)
        rows = sum(f["rows"] for f in files)
        metadata = {
            **self.metadata,
            "quarry.spark.files": str(len(files)),
            "quarry.spark.rows": str(rows),
        }
        commit = self._commit_exactly(
            {f["path"]: file_entry(self.spec, f) for f in files}, metadata
        )
        self.ephemeral_commit = commit.id
        self.merge_attempted = True
        # Merge the verified commit, not the branch: a late write there changes nothing.
        if not replaced:
            merged = self.client.merge(
                repo,
                commit.id,
                self.target.ref,
                message=self.message,
                committer=self.committer,
                metadata=metadata,
                allow_empty=True,
                request_id=job_request_id(self.job_id, "merge"),
            )
            return merged.commit
        return self._merge_overwrite(commit.id, head.commit_id, replaced, metadata)

    def _merge_overwrite(
        self, commit_id: str, started_from: str, replaced: list[str], metadata: dict
    ) -> types_pb2.Commit:
        """Merge an overwrite only onto a target whose `replaced` prefixes are still as the
        job found them. Safety rule: an overwrite never leaves another write's files in
        what it replaced. Its deletions were taken from the HEAD it started from; a merge
        onto a HEAD where another write changed those prefixes would keep that write's
        files beside its own (two racing overwrites of 100 rows left 200). So the merge is
        conditioned on the HEAD checked (destination_head_id): if the target moved, the
        prefixes are checked again on the new HEAD; if they changed, CONCURRENT_OVERWRITE
        (ABORTED: run the write again), and nothing is merged."""
        repo = self.target.repository
        for attempt in range(OVERWRITE_MERGE_ATTEMPTS):
            current = self.client.get_branch(repo, self.target.ref).commit_id
            if current != started_from and any(
                next(iter(self.client.iter_diff(repo, started_from, current, prefix=p)), None)
                for p in replaced
            ):
                raise ConcurrentOverwrite(
                    f"{self.target.ref!r} changed under {', '.join(replaced)} while this "
                    "overwrite ran (another write): nothing was merged; run it again",
                    metadata={"repository": repo, "branch": self.target.ref},
                )
            try:
                return self.client.merge(
                    repo,
                    commit_id,
                    self.target.ref,
                    message=self.message,
                    committer=self.committer,
                    metadata=metadata,
                    allow_empty=True,
                    destination_head_id=current,
                    request_id=job_request_id(self.job_id, f"merge-{attempt}"),
                ).commit
            except errors.FailedPrecondition as moved:
                if moved.reason != "DESTINATION_MOVED":
                    raise
        raise ConcurrentOverwrite(
            f"{self.target.ref!r} kept moving while this overwrite merged: run it again",
            metadata={"repository": repo, "branch": self.target.ref},
        )

    def _commit_exactly(self, reported: dict, metadata: dict) -> types_pb2.Commit:
        """Commit the ephemeral branch with exactly the reported files of this job.

        What a failed attempt staged, or what a losing speculative attempt staged (even
        after the job ended: Spark stops such tasks asynchronously), may differ from what
        the successful attempts reported: extra paths, or a reported path with another
        attempt's file. Each round sets the branch to the reported entries, commits, and
        checks the commit; a write that slipped in between is fixed by the next round."""
        repo = self.target.repository
        commit = None
        for round_number in range(RECONCILE_ROUNDS):
            self._stage_exactly(self.branch, reported)
            commit = self.client.commit(
                repo,
                self.branch,
                self._files_commit_message(len(reported)),
                committer=self.committer,
                metadata=metadata,
                allow_empty=True,
                request_id=job_request_id(self.job_id, f"commit-{round_number}"),
            ).commit
            if self._job_files(commit.id) == {p: _identity(e) for p, e in reported.items()}:
                return commit
        raise WriteIncomplete(
            f"the files of job {self.job_id} kept changing on {self.branch} after the job ended"
        )

    def _files_commit_message(self, files: int) -> str:
        """The message of the job's own commit, the merge's second parent. Distinct from
        the merge commit's (the user's message): a full log shows two commits per write,
        and they must say which is which."""
        return (
            f"Files of Spark job {self.job_id} ({files} file{'' if files == 1 else 's'}): "
            f"{self.message}"
        )

    def _job_files(self, ref: str) -> dict[str, bytes]:
        """path → entry identity of this job's files at `ref` (staging included)."""
        return {
            e.path: _identity(e)
            for e in self.client.iter_objects(
                self.target.repository, ref, prefix=job_path_prefix(self.spec)
            )
            if is_job_file(self.spec, e.path)
        }

    def _stage_exactly(self, branch: str, reported: dict) -> None:
        current = self._job_files(branch)
        extra = sorted(set(current) - set(reported))
        if extra:
            self.client.delete_objects(self.target.repository, branch, extra)
        wrong = [
            entry
            for path, entry in sorted(reported.items())
            if current.get(path) != _identity(entry)
        ]
        if wrong:
            self.client.put_objects(self.target.repository, branch, wrong)

    def _require_clean_target(self) -> None:
        """The merge at the end needs a target without uncommitted changes: fail before the
        job runs rather than after (one call; free on a clean branch)."""
        if self.client.has_uncommitted(self.target.repository, self.target.ref):
            from quarry.graveler.errors import DirtyBranch

            raise DirtyBranch(
                f"branch {self.target.ref!r} has uncommitted changes; commit or "
                f"discard them before writing to it from Spark",
                metadata={"repository": self.target.repository, "branch": self.target.ref},
            )

    def _run_tasks(self, df: DataFrame) -> list[dict]:
        from opentelemetry.propagate import inject
        from pyspark.sql.pandas.types import from_arrow_schema

        carrier: dict = {}
        if telemetry.tracing_enabled():
            inject(carrier)
        self.spec = WriteSpec(
            self.connection,
            self.target.repository,
            self.branch,
            self.storage_namespace,
            self.target.prefix,
            self.job_id,
            self.format,
            self.max_records_per_file,
            carrier,
            {"quarry.spark.job": self.job_id},
            partition_by=self.partition_by,
        )
        context = self.spark.sparkContext
        context.setJobDescription(f"quarry write {self.target} ({self.mode})")
        try:
            if self.spark_writes_files:
                return write_files(self.spark, df, self.spec)
            # The tasks' result rows come back as Arrow batches (no per-row pickling).
            reported = df.mapInArrow(
                write_task(self.spec), from_arrow_schema(RESULT_SCHEMA)
            ).toArrow()
        finally:
            context.setJobDescription(None)  # type: ignore[arg-type]  # None clears it
        return reported.to_pylist()

    def _merged(self) -> bool | None:
        """Whether the ephemeral commit is in the target's history; None if that cannot be
        told (then nothing that might be referenced is deleted)."""
        if not self.ephemeral_commit:
            return False
        try:
            base = self.client.find_merge_base(
                self.target.repository, self.ephemeral_commit, self.target.ref
            )
            return base.id == self.ephemeral_commit
        except errors.NotFound:
            return False
        except Exception:  # services unreachable: unknown
            return None

    def _merge_commit(self) -> types_pb2.Commit:
        """The target's commit that merged the ephemeral commit (looked for among the
        latest first-parent commits; the target's HEAD if others merged many since)."""
        log_walk = self.client.iter_log(self.target.repository, self.target.ref, first_parent=True)
        for index, commit in enumerate(log_walk):
            if self.ephemeral_commit in commit.parents:
                return commit
            if index >= 1000:
                break
        return self.client.get_commit(self.target.repository, self.target.ref)

    def _delete_branch(self) -> None:
        try:
            self.client.delete_branch(self.target.repository, self.branch)
        except errors.NotFound:
            pass
        except Exception as exc:  # a later sweep removes it
            log.warning("could not delete ephemeral branch %s (a sweep will): %s", self.branch, exc)

    def _delete_job_files(self) -> None:
        """Remove the data files of this job. Only after the job failed: no retained commit
        or staged entry refers to them (the ephemeral branch is gone). Only keys of the shapes
        the job's writers write (JOB_FILE_KEY: the Python workers' files, Spark's committed
        files and its `_temporary/` attempts): never another file that happens to lie in the
        job's folder."""
        from quarry.blob import open_blob_store

        try:
            with open_blob_store(self.storage_namespace, self.connection) as store:
                for key, *_ in list(store.list(layout.job_folder(self.job_id) + "/")):
                    if JOB_FILE_KEY.fullmatch(key):
                        store.delete(key)
        except Exception as exc:  # GC removes what is left
            log.warning("could not delete the files of failed job %s: %s", self.job_id, exc)
