"""Zero-copy import (docs/import.md, docs/architecture.md §10), in the manner of lakeFS's
`Import` (pkg/catalog/import.go, pkg/graveler/graveler.go) — our own flow:

1. StartImport checks the request, writes the import's status record (RUNNING) and runs
   the import on a thread of this process; the call returns at once.
2. The sources are listed in key order (quarry.blob.sources) and streamed, as entries
   whose physical address is the source object's, through the range-writer's
   WriteMetaRange into ranges and one metarange: nothing passes through staging, and no
   byte is copied. The entries travel in columns (Arrow record batches,
   quarry.committed.columns): no Entry, message or range-writer object per object.
3. ONE commit on the branch: its metarange is the branch HEAD's with everything under each
   destination path replaced by the import (range-writer ReplacePrefixes: ranges outside
   the paths are reused by id), its metadata the import's id, sources and object count.
   The branch swap is the branch record's CAS (RefManager.update_branch), which moves only
   HEAD (and rebases a compacted staging layer): the staging tokens are kept, so staged
   changes stay staged on top of the import; a staged entry under a destination path
   still shadows the imported one until it is committed or discarded.
4. HEAD moved meanwhile (a commit, a merge, another import): the CAS fails, and the swap is
   redone on the new HEAD with the same import metarange (a few range reads), up to the
   retry budget; then the import FAILS with the reason, the branch untouched.
5. Actions: an import is a commit, so (as in lakeFS) pre-commit hooks judge each attempt's
   metarange before its commit record is written (a refusal: FAILED, branch untouched),
   and post-commit hooks run once the swap is done (docs/actions.md).

KV cost per import: O(1) — the status record (created, a heartbeat every
HEARTBEAT_SECONDS, the commit id it is installing, the final state), the commit record and
the branch swap (plus one more commit and swap per lost race). Never one write per object.

Safety rules:
  * Nothing is visible on the branch before the swap, and the swap is all of it: a failure,
    a cancel or a dead process leaves the branch exactly as it was (the import's ranges are
    unreferenced files GC removes later).
  * The swap never drops a staging token, never changes a path outside the destination
    paths, and never installs a commit built on a HEAD that is no longer the branch's.
  * A source inside any repository's storage namespace (another repository's, or the
    target's own `_quarry/` area) is refused: an import must not make Quarry's own files,
    or another repository's objects, entries of this one (GC would then keep, or a later
    deletion break, objects it does not own).
  * Imported objects are not Quarry's: GC deletes only inside a repository's namespace.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from opentelemetry import context as otel_context
from prometheus_client import Counter

from quarry import errors
from quarry.actions.runs import Event
from quarry.blob.base import InvalidStorageNamespace
from quarry.blob.chunks import ColumnChunk, local_chunks, sequential_chunks
from quarry.blob.sources import Listing, Source, parse_source
from quarry.graveler import actions, layout, names
from quarry.graveler import errors as gerrors
from quarry.graveler.core import CommitRecord, Core, make_commit, tracer
from quarry.graveler.model import ChangeType
from quarry.graveler.protection import COMMIT
from quarry.graveler.reads import Reads
from quarry.graveler.refs import Repository
from quarry.kv import store as kv
from quarry.v1 import types_pb2

if TYPE_CHECKING:
    import pyarrow as pa

    from quarry.config import Settings

log = logging.getLogger(__name__)

RUNNING = "RUNNING"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
TERMINAL = (COMPLETED, FAILED, CANCELLED)

# The status record is rewritten at most this often while the listing runs (objects listed,
# the heartbeat, and the moment a cancel asked of another process is noticed).
HEARTBEAT_SECONDS = 10.0
# A RUNNING import whose record is older than this reads as FAILED: its process stopped.
STALE_SECONDS = 60.0
# Listing processes a local source is read by (QUARRY_IMPORT_LISTING_PROCESSES; 0: none,
# the importing thread walks it).
LISTING_PROCESSES = 2
# Shutdown: how long an import cancelled by the shutdown has to write its final state.
STOP_WAIT_SECONDS = 5.0
# At most this many sources in one import.
MAX_SOURCES = 100

IMPORTED_OBJECTS = Counter(
    "quarry_import_objects", "Objects imported (listed into committed imports)", registry=None
)
IMPORTED_BYTES = Counter(
    "quarry_import_bytes", "Bytes of the objects imported (not copied)", registry=None
)
IMPORTS = Counter("quarry_imports", "Imports finished, by outcome", ["outcome"], registry=None)
METRICS = (IMPORTED_OBJECTS, IMPORTED_BYTES, IMPORTS)


class ImportCancelled(errors.Cancelled):
    reason = "IMPORT_CANCELLED"


class _Moved(Exception):
    """HEAD or the compacted layer moved since the import's commit was built."""


@dataclass
class ImportRecord:
    """The status record (stored as JSON under imports/<id> in the repository's partition)."""

    id: str
    repository: str
    branch: str
    sources: list[dict[str, str]]
    message: str = ""
    committer: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    state: str = RUNNING
    objects_listed: int = 0
    bytes_listed: int = 0
    objects_skipped: int = 0
    ranges_written: int = 0
    error: str = ""
    commit_id: str = ""
    # The commit being installed: if the process dies after the swap, the reader finds it
    # on the branch and reports COMPLETED.
    pending_commit_id: str = ""
    started: float = 0.0
    updated: float = 0.0
    cancel_requested: bool = False

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @staticmethod
    def decode(data: bytes) -> ImportRecord:
        return ImportRecord(**json.loads(data))


@dataclass(frozen=True)
class ImportSource:
    uri: str
    destination_path: str


@dataclass
class ImportView:
    """What GetImportStatus answers: the record, its state computed (a stale RUNNING is
    FAILED), and the commit when COMPLETED."""

    record: ImportRecord
    commit: types_pb2.Commit | None = None


def destination_prefix(path: str) -> str:
    """The prefix an import owns: "" (the whole branch) or a directory ending in "/"."""
    path = path.lstrip("/")
    if not path:
        return ""
    if not path.endswith("/"):
        path += "/"
    names.check_path(path)
    if any(part in (".", "..") for part in path[:-1].split("/")) or "//" in path:
        raise gerrors.InvalidPath(
            f"destination path {path!r} may not have empty, '.' or '..' segments",
            metadata={"path": path},
        )
    return path


class _Job:
    """A running import in this process: its record (and predicate), a local cancel."""

    def __init__(self, record: ImportRecord, predicate: bytes) -> None:
        self.record = record
        self.predicate = predicate
        self.cancel = threading.Event()
        # Why it was cancelled, for its final state: a user's cancel, or the shutdown.
        self.cancelled_because = "cancelled"
        self.thread: threading.Thread | None = None


class Imports:
    def __init__(self, core: Core, reads: Reads) -> None:
        self.core = core
        self.reads = reads
        self.refs = core.refs
        self.settings: Settings | None = None  # for S3 sources (endpoint, region)
        self.heartbeat_seconds = HEARTBEAT_SECONDS
        self.stale_seconds = STALE_SECONDS
        self.listing_processes = LISTING_PROCESSES
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()
        self.clock: Callable[[], float] = time.time

    # ---- the RPCs -------------------------------------------------------------------------

    def start_import(
        self,
        repo_name: str,
        branch_name: str,
        sources: list[ImportSource],
        message: str = "",
        committer: str = "",
        metadata: dict[str, str] | None = None,
    ) -> ImportView:
        repo = self.core.live_repo(repo_name)
        names.check_branch_name(branch_name)
        self.core.branch(repo, branch_name)  # exists, and is a branch
        self.core.protection.check(repo, branch_name, COMMIT)
        checked = self._check_sources(repo, sources)
        message = message or f"Import from {checked[0][0].location}"
        metadata = dict(metadata or {})
        names.check_commit_metadata(message, metadata)
        now = self.clock()
        record = ImportRecord(
            id=uuid.uuid4().hex,
            repository=repo.name,
            branch=branch_name,
            sources=[{"uri": s.uri, "destination_path": p} for s, p in checked],
            message=message,
            committer=committer,
            metadata=metadata,
            started=now,
            updated=now,
        )
        data = record.encode()
        self.core.kv.set_if(repo.partition, layout.import_key(record.id), data, kv.ABSENT)
        job = _Job(record, data)
        with self._lock:
            self._jobs[record.id] = job
        parent = otel_context.get_current()
        job.thread = threading.Thread(
            target=self._run,
            args=(repo, job, checked, parent),
            name=f"import-{record.id[:8]}",
            daemon=True,
        )
        job.thread.start()
        return ImportView(record)

    def get_import(self, repo_name: str, import_id: str) -> ImportView:
        repo = self.core.repo(repo_name)
        record, _ = self._read(repo, import_id)
        commit_id = record.commit_id
        if record.state == RUNNING and self.clock() - record.updated > self.stale_seconds:
            # Its process stopped: the branch has the import or does not, never part of it.
            if record.pending_commit_id and self._installed(repo, record):
                record.state, commit_id = COMPLETED, record.pending_commit_id
            else:
                record.state = FAILED
                record.error = (
                    f"the importing process stopped (no heartbeat for "
                    f"{int(self.clock() - record.updated)} s); the branch is unchanged; "
                    "run the import again"
                )
        commit = self.refs.get_commit(repo, commit_id) if commit_id else None
        if commit is not None:
            record.commit_id = commit.id
        return ImportView(record, commit)

    def cancel_import(self, repo_name: str, import_id: str) -> ImportView:
        """Ask the import to stop (idempotent). A running import stops at its next check and
        ends CANCELLED, the branch unchanged; one already installing its commit completes."""
        repo = self.core.repo(repo_name)
        with self._lock:
            job = self._jobs.get(import_id)
        if job is not None:
            job.cancel.set()
        for _ in range(self.core.retries.branch.max_attempts):
            record, predicate = self._read(repo, import_id)
            if record.state in TERMINAL or record.cancel_requested:
                break
            record.cancel_requested = True
            try:
                self.core.kv.set_if(
                    repo.partition,
                    layout.import_key(import_id),
                    record.encode(),
                    kv.Equals(predicate),
                )
                break
            except kv.PredicateFailed:
                continue  # a heartbeat in between: read again
        return self.get_import(repo_name, import_id)

    def stop(self, grace: float) -> None:
        """Shutdown: running imports get `grace` seconds to finish; those still running then
        stop at their next check and end CANCELLED, the branch unchanged, their final state
        written before the service closes its channels — `import status` says so at once
        (they were killed mid-way and read RUNNING until their heartbeat went stale).
        Bounded: grace plus STOP_WAIT_SECONDS; one that does not stop by then is left to
        the stale-heartbeat rule."""
        deadline = time.monotonic() + grace
        with self._lock:
            jobs = [job for job in self._jobs.values() if job.thread is not None]
        for job in jobs:
            job.thread.join(max(0.0, deadline - time.monotonic()))  # type: ignore[union-attr]
        left = [job for job in jobs if job.thread.is_alive()]  # type: ignore[union-attr]
        for job in left:
            job.cancelled_because = "stopped by the service's shutdown; run the import again"
            job.cancel.set()
        for job in left:
            job.thread.join(STOP_WAIT_SECONDS)  # type: ignore[union-attr]

    def wait(self, import_id: str, timeout: float | None = None) -> None:
        """Wait for an import of this process to end (tests, shutdown)."""
        with self._lock:
            job = self._jobs.get(import_id)
        if job is not None and job.thread is not None:
            job.thread.join(timeout)

    # ---- checks ---------------------------------------------------------------------------

    def _check_sources(
        self, repo: Repository, sources: list[ImportSource]
    ) -> list[tuple[Source, str]]:
        if not sources:
            raise errors.InvalidArgument("an import needs at least one source")
        if len(sources) > MAX_SOURCES:
            raise errors.InvalidArgument(f"at most {MAX_SOURCES} sources per import")
        checked: list[tuple[Source, str]] = []
        for source in sources:
            try:
                parsed = parse_source(source.uri)
            except InvalidStorageNamespace as exc:
                raise gerrors.InvalidImportSource(
                    f"import source {source.uri!r}: {exc.message}", metadata={"uri": source.uri}
                ) from None
            self.core.addresses.check_source(repo, parsed)
            try:
                Listing(parsed, self.settings).check()
            except InvalidStorageNamespace as exc:
                raise gerrors.InvalidImportSource(
                    f"import source {source.uri!r}: {exc.message}", metadata={"uri": source.uri}
                ) from None
            checked.append((parsed, destination_prefix(source.destination_path)))
        prefixes = sorted(p for _, p in checked)
        for before, after in zip(prefixes, prefixes[1:], strict=False):
            if after.startswith(before):
                raise errors.InvalidArgument(
                    f"destination paths {before!r} and {after!r} overlap: "
                    "an import owns each of its destination paths"
                )
        return sorted(checked, key=lambda pair: pair[1])

    # ---- the record -----------------------------------------------------------------------

    def _read(self, repo: Repository, import_id: str) -> tuple[ImportRecord, bytes]:
        if not import_id or len(import_id) > 64 or not import_id.isalnum():
            raise gerrors.ImportNotFound(
                f"no import {import_id!r} in {repo.name!r}", metadata={"id": import_id}
            )
        try:
            got = self.core.kv.get(repo.partition, layout.import_key(import_id))
        except kv.KeyNotFound:
            raise gerrors.ImportNotFound(
                f"no import {import_id!r} in {repo.name!r}", metadata={"id": import_id}
            ) from None
        return ImportRecord.decode(got.value), got.predicate

    def _installed(self, repo: Repository, record: ImportRecord) -> bool:
        try:
            branch, _ = self.refs.get_branch(repo, record.branch)
        except gerrors.BranchNotFound:
            return False
        try:
            return self.refs.is_ancestor(repo, record.pending_commit_id, branch.commit_id)
        except errors.NotFound:
            return False

    def _save(self, repo: Repository, job: _Job, *, final: bool = False) -> None:
        """Write the job's record if it is still the one this process wrote last. Lost to a
        CancelImport: a running import is cancelled (raised), a final state is written
        anyway (the cancel came too late, or asked for what happened)."""
        key = layout.import_key(job.record.id)
        job.record.updated = self.clock()
        for _ in range(self.core.retries.branch.max_attempts):
            data = job.record.encode()
            try:
                self.core.kv.set_if(repo.partition, key, data, kv.Equals(job.predicate))
                job.predicate = data
                return
            except kv.PredicateFailed:
                current, predicate = self._read(repo, job.record.id)
                job.predicate = predicate
                if current.cancel_requested:
                    job.record.cancel_requested = True
                    if not final:
                        job.cancel.set()
                        raise ImportCancelled(f"import {job.record.id} was cancelled") from None
        raise gerrors.BranchContended(f"the status record of import {job.record.id} kept changing")

    # ---- the run --------------------------------------------------------------------------

    def _run(
        self,
        repo: Repository,
        job: _Job,
        sources: list[tuple[Source, str]],
        parent: otel_context.Context,
    ) -> None:
        token = otel_context.attach(parent)
        record = job.record
        attributes = {
            "quarry.repository": repo.name,
            "quarry.branch": record.branch,
            "quarry.import": record.id,
        }
        try:
            with tracer.start_as_current_span("graveler.import", attributes=attributes) as span:
                try:
                    commit = self._import(repo, job, sources)
                except ImportCancelled:
                    record.state = CANCELLED
                    record.error = f"{job.cancelled_because}; the branch is unchanged"
                except Exception as exc:  # every failure ends FAILED, the branch untouched
                    log.warning("import %s failed", record.id, exc_info=True)
                    message = exc.message if isinstance(exc, errors.QuarryError) else repr(exc)
                    record.state, record.error = FAILED, f"{message}; the branch is unchanged"
                else:
                    record.state, record.commit_id = COMPLETED, commit.id
                    span.set_attribute("quarry.commit", commit.id)
                span.set_attribute("quarry.objects", record.objects_listed)
                span.set_attribute("quarry.state", record.state)
                if record.state != COMPLETED:
                    record.pending_commit_id = ""
                IMPORTS.labels(record.state.lower()).inc()
                try:
                    self._save(repo, job, final=True)
                except Exception:
                    log.exception("import %s: could not write its final state", record.id)
        finally:
            with self._lock:
                self._jobs.pop(record.id, None)
            otel_context.detach(token)

    def _chunks(self, source: Source, prefix: str) -> Generator[ColumnChunk, None, None]:
        """A source's listing as column chunks (quarry.blob.chunks): a local directory read
        by listing processes when there are any, else (and S3) listed in this thread."""
        listing = Listing(source, self.settings)
        if source.kind == "local" and self.listing_processes > 0:
            return local_chunks(
                listing.local_root(), prefix, names.MAX_PATH_BYTES, self.listing_processes
            )
        return sequential_chunks(listing, prefix, names.MAX_PATH_BYTES)

    def _batches(
        self, repo: Repository, job: _Job, sources: list[tuple[Source, str]]
    ) -> Generator[pa.RecordBatch, None, None]:
        """Every source's objects as entry columns under its destination path, in path
        order (the destination paths are disjoint and sorted, each listing sorted), a record
        batch (quarry.committed.columns) of BATCH_ROWS rows / BATCH_BYTES at most at a time,
        joined from the listing's chunks: no Entry or message per object. A cancel and the
        heartbeat are looked at once per chunk."""
        # Imported here: Arrow (pyarrow, numpy) is for imports only, not for every process
        # that loads graveler.
        from quarry.committed.columns import BATCH_BYTES, BATCH_ROWS

        record = job.record
        next_save = self.clock() + self.heartbeat_seconds
        pending: list[ColumnChunk] = []
        rows = size = 0
        for source, prefix in sources:
            chunks = self._chunks(source, prefix)
            try:
                for chunk in self._checked(chunks):
                    if job.cancel.is_set():
                        raise ImportCancelled(f"import {record.id} was cancelled")
                    if self.clock() >= next_save:
                        self._save(repo, job)
                        next_save = self.clock() + self.heartbeat_seconds
                    record.objects_skipped += chunk.skipped
                    if not chunk.rows:
                        continue
                    if pending and (
                        rows + chunk.rows > BATCH_ROWS or size + chunk.text_bytes > BATCH_BYTES
                    ):
                        yield self._batch(pending)
                        pending, rows, size = [], 0, 0
                    record.objects_listed += chunk.rows
                    record.bytes_listed += chunk.bytes_total
                    pending.append(chunk)
                    rows += chunk.rows
                    size += chunk.text_bytes
            finally:
                chunks.close()  # listing processes stop with the listing, however it ends
        if pending:
            yield self._batch(pending)

    @staticmethod
    def _checked(chunks: Iterator[ColumnChunk]) -> Iterator[ColumnChunk]:
        """A name that is not Unicode text (undecodable bytes) is a bad entry."""
        try:
            yield from chunks
        except UnicodeEncodeError as exc:
            raise errors.InvalidArgument(f"invalid entry: {exc}") from None

    @staticmethod
    def _batch(chunks: list[ColumnChunk]) -> pa.RecordBatch:
        import pyarrow as pa  # only imports need Arrow (see _batches)

        from quarry.committed.columns import chunks_batch

        try:
            return chunks_batch(chunks)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise errors.InvalidArgument(f"invalid entry: {exc}") from None

    def _import(
        self, repo: Repository, job: _Job, sources: list[tuple[Source, str]]
    ) -> types_pb2.Commit:
        record = job.record
        namespace = repo.storage_namespace
        with tracer.start_as_current_span("graveler.import.write_ranges") as span:
            batches = self._batches(repo, job, sources)
            try:
                written = self.core.range_writer.write_columns(namespace, batches)
            finally:
                # Stops its listing processes now if the write ended early (not when the
                # generator is collected); one still running on gRPC's thread stops there.
                with suppress(ValueError):
                    batches.close()
            span.set_attribute("quarry.ranges_written", written.ranges_written)
        record.ranges_written = written.ranges_written
        if job.cancel.is_set():
            raise ImportCancelled(f"import {record.id} was cancelled")
        prefixes = [prefix for _, prefix in sources]
        metadata = {
            **record.metadata,
            "import_id": record.id,
            "import_sources": ",".join(s["uri"] for s in record.sources),
            "import_destinations": ",".join(prefixes),
            "import_objects": str(record.objects_listed),
        }

        def exhausted() -> errors.QuarryError:
            return gerrors.BranchContended(
                f"branch {record.branch!r} kept moving: the import lost the race "
                f"{self.core.retries.branch.max_attempts} times (its ranges are written; run it again)",
                metadata={"repository": repo.name, "branch": record.branch},
            )

        for attempt in self.core.retries.branch.attempts(exhausted):
            commit = self._commit_attempt(repo, job, written.metarange_id, prefixes, metadata)
            if commit is not None:
                self._check_still_live(repo)
                IMPORTED_OBJECTS.inc(record.objects_listed)
                IMPORTED_BYTES.inc(record.bytes_listed)
                event = self._event(record, metadata, post=True)
                event.commit_id = commit.id
                actions.post_event(self.core, self.reads, repo, commit, event)
                return commit
            tracer_span = tracer.start_span("graveler.import.retry")
            tracer_span.set_attribute("quarry.attempt", attempt + 1)
            tracer_span.end()
        raise AssertionError("unreachable")

    def _check_still_live(self, repo: Repository) -> None:
        """RepositoryNotFound unless the repository's record still names the instance the
        import committed to: one deleted meanwhile (and perhaps made again under its name)
        got the commit in its dead instance, which is no success to report (tester hAO: the
        import said COMPLETED with a commit the repository of that name did not have)."""
        try:
            live = self.refs.get_repository(repo.name, fresh=True).instance_id == repo.instance_id
        except gerrors.RepositoryNotFound:
            live = False
        if not live:
            raise gerrors.RepositoryNotFound(
                f"repository {repo.name!r} was deleted during the import",
                metadata={"repository": repo.name},
            )

    @contextmanager
    def _heartbeat(self, repo: Repository, job: _Job) -> Iterator[None]:
        """Keep the status record fresh while the hooks run (they may take minutes: each
        hook up to QUARRY_ACTIONS_MAX_TIMEOUT_SECONDS), so a live import never reads as
        stale. A cancel seen by a heartbeat sets job.cancel, checked after the hooks."""
        if self.core.actions is None:
            yield
            return
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.heartbeat_seconds):
                try:
                    self._save(repo, job)
                except ImportCancelled:
                    return
                except Exception:
                    log.warning("import %s: heartbeat failed", job.record.id, exc_info=True)
                    return

        thread = threading.Thread(target=beat, name=f"import-beat-{job.record.id[:8]}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    @staticmethod
    def _event(record: ImportRecord, metadata: dict[str, str], post: bool = False) -> Event:
        return Event(
            "post-commit" if post else "pre-commit",
            record.repository,
            record.branch,
            record.branch,
            record.message,
            record.committer,
            dict(metadata),
        )

    def _commit_attempt(
        self,
        repo: Repository,
        job: _Job,
        import_metarange: str,
        prefixes: list[str],
        metadata: dict[str, str],
    ) -> types_pb2.Commit | None:
        """Build the import's commit on the branch's current HEAD and swap it in; None if
        HEAD (or the compacted layer) moved meanwhile."""
        record = job.record
        namespace = repo.storage_namespace
        branch, _ = self.core.branch(repo, record.branch)
        head = self.refs.get_commit(repo, branch.commit_id)
        replaced = self.core.range_writer.replace_prefixes(
            namespace, head.metarange_id, prefixes, import_metarange
        )
        # An import is a commit, and lakeFS runs pre-commit hooks for it (Graveler.Import):
        # they judge this attempt's metarange (the action files in it, including imported
        # ones), before the commit record or the swap; a failure ends the import FAILED with
        # the branch untouched. A lost race builds a new metarange: the hooks run again.
        with self._heartbeat(repo, job):
            actions.pre_event(
                self.core, self.reads, repo, replaced.metarange_id, self._event(record, metadata)
            )
        compacted = branch.compacted_metarange_id
        rebased = ""
        if compacted:
            # The staged changes folded into the compacted layer stay staged: the same
            # changes (compacted vs the old HEAD), applied onto the new HEAD.
            changes = (
                (change.path, change.entry if change.type != ChangeType.REMOVED else None)
                for change in self.core.committed.diff(namespace, head.metarange_id, compacted)
            )
            rebased = self.core.range_writer.apply_changes(
                namespace, replaced.metarange_id, changes
            ).metarange_id
        commit = make_commit(
            CommitRecord(
                [head.id],
                replaced.metarange_id,
                record.message,
                record.committer,
                metadata,
                head.generation + 1,
            )
        )
        self.refs.insert_commit(repo, commit)
        if job.cancel.is_set():
            raise ImportCancelled(f"import {record.id} was cancelled")
        record.pending_commit_id = commit.id
        self._save(repo, job)  # a cancel asked of another process is seen here, at the latest

        def swap(current: types_pb2.Branch) -> types_pb2.Branch:
            if current.commit_id != head.id or current.compacted_metarange_id != compacted:
                raise _Moved()
            current.commit_id = commit.id
            current.compacted_metarange_id = rebased
            return current  # staging_token, sealed_tokens and dirty: untouched

        with tracer.start_as_current_span("graveler.swap_branch"):
            try:
                self.refs.update_branch(repo, record.branch, swap, step="import")
            except _Moved:
                return None
            except gerrors.BranchContended:
                return None
        self.core.forget_branch(repo, record.branch)
        return commit


__all__ = [
    "CANCELLED",
    "COMPLETED",
    "FAILED",
    "RUNNING",
    "ImportRecord",
    "ImportSource",
    "ImportView",
    "Imports",
    "destination_prefix",
]
