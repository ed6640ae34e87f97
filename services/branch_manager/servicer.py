"""BranchManager servicer: proto ⇄ Graveler calls, nothing else."""

from __future__ import annotations

import functools
import logging

from quarry import errors
from quarry.auth.checks import check_import, needs_namespace
from quarry.convert import change_to_proto, entry_from_proto, entry_to_proto
from quarry.graveler import dumps, records
from quarry.graveler.graveler import Graveler
from quarry.graveler.requests import RequestIdReused, RequestLog, check_request_id, fingerprint
from quarry.runtime.idempotency import INSTALLATION, idempotent, run_once
from quarry.runtime.listing import listed
from quarry.v1 import branch_manager_pb2 as pb
from quarry.v1 import branch_manager_pb2_grpc

log = logging.getLogger(__name__)


def _token_of(staged: int) -> str:
    """The staging token a write landed on (Graveler's StagedCount), "" if unknown."""
    return getattr(staged, "staging_token", "")


class BranchManagerServicer(branch_manager_pb2_grpc.BranchManagerServicer):
    def __init__(self, graveler: Graveler, requests: RequestLog, on_staged=None, authorizer=None):
        self._g = graveler
        # Auth on: checks fs:ImportFromStorage for addresses outside the namespace.
        self._authorizer = authorizer
        # Calls with a request_id run at most once (quarry.runtime.idempotency).
        self._requests = requests
        # Called with (repository, branch, staging token, staged puts, staged deletes) after
        # a write is acknowledged; the compactor-sensor reporter (StagingReporter.record,
        # in-memory only) hooks in here. It must never block or fail the write.
        self._on_staged = on_staged or (lambda *_: None)

    def _report_staged(
        self, repository: str, branch: str, staging_token: str, puts: int, deletes: int
    ) -> None:
        if not puts and not deletes:
            return
        try:
            self._on_staged(repository, branch, staging_token, puts, deletes)
        except Exception:  # an acknowledged write must not fail on a report
            log.warning("staging report hook failed", exc_info=True)

    # ---- repositories ----

    @idempotent(pb.CreateRepositoryResponse, repository=INSTALLATION)
    def CreateRepository(self, request, context):
        repo = self._g.create_repository(
            request.name, request.storage_namespace, request.default_branch, request.staging_shards
        )
        return pb.CreateRepositoryResponse(repository=repo.to_proto())

    @idempotent(pb.UpdateRepositoryResponse, repository=INSTALLATION)
    def UpdateRepository(self, request, context):
        repo = self._g.update_repository(
            request.name,
            staging_shards=request.staging_shards if request.HasField("staging_shards") else None,
        )
        return pb.UpdateRepositoryResponse(repository=repo.to_proto())

    def DumpRepository(self, request, context):
        for batch in dumps.messages(self._g.dump_repository(request.name)):
            yield pb.DumpRepositoryResponse(records=batch)

    def RestoreRepository(self, request_iterator, context):
        first = next(request_iterator, None)
        if first is None or not first.name or not first.storage_namespace:
            raise errors.InvalidArgument(
                "the first RestoreRepository message must name the repository and the "
                "storage namespace"
            )

        def dumped():
            yield from first.records
            for request in request_iterator:
                if request.name or request.storage_namespace or request.adopt_namespace:
                    raise errors.InvalidArgument(
                        "only the first RestoreRepository message names the repository, the "
                        "namespace and adopt_namespace"
                    )
                yield from request.records

        restored = self._g.restore_repository(
            first.name, first.storage_namespace, dumped(), first.adopt_namespace
        )
        return pb.RestoreRepositoryResponse(
            repository=restored.repository.to_proto(),
            branches=restored.branches,
            tags=restored.tags,
            commits=restored.commits,
        )

    def GetRepository(self, request, context):
        return pb.GetRepositoryResponse(repository=self._g.get_repository(request.name).to_proto())

    def ListRepositories(self, request, context):
        return listed(
            pb.ListRepositoriesResponse,
            "repositories",
            lambda: self._g.list_repositories(request.page_size, request.page_token),
            lambda repo: repo.to_proto(),
        )

    @idempotent(pb.DeleteRepositoryResponse, repository=INSTALLATION)
    def DeleteRepository(self, request, context):
        self._g.delete_repository(request.name)
        return pb.DeleteRepositoryResponse()

    # ---- branches ----

    @idempotent(pb.CreateBranchResponse)
    def CreateBranch(self, request, context):
        branch = self._g.create_branch(request.repository, request.name, request.source_ref)
        return pb.CreateBranchResponse(branch=branch)

    def GetBranch(self, request, context):
        return pb.GetBranchResponse(branch=self._g.get_branch(request.repository, request.name))

    def ListBranches(self, request, context):
        return listed(
            pb.ListBranchesResponse,
            "branches",
            lambda: self._g.list_branches(
                request.repository, request.page_size, request.page_token
            ),
        )

    @idempotent(pb.DeleteBranchResponse)
    def DeleteBranch(self, request, context):
        self._g.delete_branch(request.repository, request.name)
        return pb.DeleteBranchResponse()

    @idempotent(pb.ResetBranchResponse)
    def ResetBranch(self, request, context):
        branch = self._g.reset_branch(
            request.repository, request.branch, request.ref, request.force
        )
        return pb.ResetBranchResponse(branch=branch)

    # ---- tags ----

    @idempotent(pb.CreateTagResponse)
    def CreateTag(self, request, context):
        return pb.CreateTagResponse(
            tag=self._g.create_tag(request.repository, request.name, request.ref)
        )

    def GetTag(self, request, context):
        return pb.GetTagResponse(tag=self._g.get_tag(request.repository, request.name))

    def ListTags(self, request, context):
        return listed(
            pb.ListTagsResponse,
            "tags",
            lambda: self._g.list_tags(request.repository, request.page_size, request.page_token),
        )

    @idempotent(pb.DeleteTagResponse)
    def DeleteTag(self, request, context):
        self._g.delete_tag(request.repository, request.name)
        return pb.DeleteTagResponse()

    # ---- settings ----

    def SetGarbageCollectionRules(self, request, context):
        self._g.set_gc_rules(request.repository, request.rules)
        return pb.SetGarbageCollectionRulesResponse()

    def GetGarbageCollectionRules(self, request, context):
        return pb.GetGarbageCollectionRulesResponse(rules=self._g.get_gc_rules(request.repository))

    def DeleteGarbageCollectionRules(self, request, context):
        self._g.delete_gc_rules(request.repository)
        return pb.DeleteGarbageCollectionRulesResponse()

    @idempotent(pb.SetBranchProtectionRulesResponse)
    def SetBranchProtectionRules(self, request, context):
        checksum = self._g.set_branch_protection_rules(
            request.repository, request.rules, request.if_checksum
        )
        return pb.SetBranchProtectionRulesResponse(checksum=checksum)

    def GetBranchProtectionRules(self, request, context):
        rules, checksum = self._g.get_branch_protection_rules(request.repository)
        return pb.GetBranchProtectionRulesResponse(rules=rules, checksum=checksum)

    # ---- objects ----

    def StatObject(self, request, context):
        entry = self._g.stat_object(request.repository, request.ref, request.path)
        return pb.StatObjectResponse(entry=entry_to_proto(entry))

    @idempotent(pb.PutObjectResponse)
    def PutObject(self, request, context):
        self._check_import(request.repository, [request.entry])
        entry = entry_from_proto(request.entry)
        staged = self._g.put_objects(
            request.repository,
            request.branch,
            [entry],
            if_absent=request.if_absent,
            if_match_checksum=request.if_match_checksum,
        )
        self._report_staged(request.repository, request.branch, _token_of(staged), int(staged), 0)
        return pb.PutObjectResponse(entry=entry_to_proto(entry))

    @idempotent(pb.CopyObjectResponse)
    def CopyObject(self, request, context):
        entry, staged = self._g.copy_object(
            request.repository,
            request.source_ref,
            request.source_path,
            request.branch,
            request.path,
            if_absent=request.if_absent,
        )
        self._report_staged(request.repository, request.branch, _token_of(staged), int(staged), 0)
        return pb.CopyObjectResponse(entry=entry_to_proto(entry))

    def PutObjects(self, request_iterator, context):
        """All or nothing with respect to the caller's mistakes: the whole stream is read
        and checked first (the targets, every entry through the writer's own checks, the
        request ids), and a stream with any refused message stages NOTHING and changes no
        branch. Only then is it staged, batch by batch through the writer flow as before
        (per message: one branch read, one batch write, one validation read).

        Memory: the checked messages are held until the stream ends, bounded by
        Writes.stream_limits (Settings.max_put_objects_stream_entries / _bytes): a longer
        stream is refused (INVALID_ARGUMENT / PUT_STREAM_TOO_LARGE) as soon as it passes
        the bound, before anything is staged.

        request_id: a message carrying one is still its own idempotent unit (staged at most
        once; a repeat adds the first call's count and stages nothing). Its id is checked
        up front too: malformed, or used within this stream or in the request log for a
        different batch, refuses the whole stream. (A different request claiming the same id
        concurrently, between that check and this message's turn, is refused when its turn
        comes, after earlier batches were staged.)

        An environment failure while staging (KV store unreachable, the branch contended)
        may leave earlier batches staged: that is a retryable failure of an idempotent
        write (staging the same entries again changes nothing; with request ids a replay
        skips the batches already staged), never a caller's mistake half applied."""
        repository, branch, messages = self._checked_put_stream(request_iterator)
        total = 0
        for request in messages:
            if request.request_id:
                # A message with a request_id is its own idempotent unit: its batch, with
                # the stream's repository and branch, is staged at most once.
                total += run_once(
                    self._requests,
                    self._put_unit(request, repository, branch),
                    repository,
                    functools.partial(self._stage_batch, repository, branch, request),
                    pb.PutObjectsResponse,
                ).count
            else:
                total += self._stage_batch(repository, branch, request).count
        return pb.PutObjectsResponse(count=total)

    def _checked_put_stream(self, request_iterator) -> tuple[str, str, list]:
        """(repository, branch, messages) of a PutObjects stream read whole, every message
        checked as the writer would check it; raises on the first refused one."""
        repository = branch = ""
        messages: list = []
        entries = encoded = 0
        ids: dict[str, bytes] = {}  # request id -> fingerprint, within this stream
        for request in request_iterator:
            if not messages:
                repository, branch = request.repository, request.branch
                if not repository or not branch:
                    raise errors.InvalidArgument(
                        "the first PutObjects message must name repository and branch"
                    )
            elif (request.repository and request.repository != repository) or (
                request.branch and request.branch != branch
            ):
                raise errors.InvalidArgument(
                    "all PutObjects messages must target the same repository and branch"
                )
            entries += len(request.entries)
            encoded += request.ByteSize()
            self._g.writes.stream_limits.check(entries, encoded)
            self._g.writes.check_put(
                repository, branch, (entry_from_proto(e) for e in request.entries)
            )
            self._check_import(repository, request.entries)
            if request.request_id:
                unit = self._put_unit(request, repository, branch)
                request_id = check_request_id(request.request_id)
                unit_fingerprint = fingerprint(unit)
                if ids.setdefault(request_id, unit_fingerprint) != unit_fingerprint:
                    raise RequestIdReused(
                        f"request_id {request_id} is used by two different messages of this stream",
                        metadata={"request_id": request_id},
                    )
                self._requests.check_not_reused(
                    self._requests.partition_for(repository), request_id, unit_fingerprint
                )
            messages.append(request)
        return repository, branch, messages

    @staticmethod
    def _put_unit(request, repository: str, branch: str) -> pb.PutObjectsRequest:
        """The idempotent unit of a message with a request_id: its batch, with the stream's
        repository and branch."""
        unit = pb.PutObjectsRequest()
        unit.CopyFrom(request)
        unit.repository, unit.branch = repository, branch
        return unit

    def _check_import(self, repository: str, entries) -> None:
        """fs:ImportFromStorage for a user staging addresses outside the repository's
        namespace (the repository record is cached: no KV read in steady state)."""
        # Auth off, a service caller or a user allowed to import anything: decided before
        # any per-entry work (the hot path).
        if not needs_namespace(self._authorizer, ((e.path, e.physical_address) for e in entries)):
            return
        pairs = [(e.path, e.physical_address) for e in entries]
        namespace = self._g.refs.get_repository(repository).storage_namespace
        check_import(self._authorizer, repository, namespace, pairs)

    def _stage_batch(self, repository: str, branch: str, request) -> pb.PutObjectsResponse:
        entries = [entry_from_proto(e) for e in request.entries]
        # Each batch goes through the writer flow on its own: one branch read, one batch
        # write, one validation read.
        staged = self._g.put_objects(repository, branch, entries)
        self._report_staged(repository, branch, _token_of(staged), int(staged), 0)
        return pb.PutObjectsResponse(count=int(staged))

    @idempotent(pb.DeleteObjectResponse)
    def DeleteObject(self, request, context):
        deleted = self._g.delete_objects(request.repository, request.branch, [request.path])
        self._report_staged(request.repository, request.branch, _token_of(deleted), 0, int(deleted))
        return pb.DeleteObjectResponse()

    @idempotent(pb.DeleteObjectsResponse)
    def DeleteObjects(self, request, context):
        deleted = self._g.delete_objects(request.repository, request.branch, request.paths)
        self._report_staged(request.repository, request.branch, _token_of(deleted), 0, int(deleted))
        return pb.DeleteObjectsResponse(deleted=int(deleted))

    def ListObjects(self, request, context):
        with records.listing() as skipped:
            entries, prefixes, token = self._g.list_objects(
                request.repository,
                request.ref,
                request.prefix,
                request.delimiter,
                request.page_size,
                request.page_token,
            )
        return pb.ListObjectsResponse(
            entries=[entry_to_proto(e) for e in entries],
            common_prefixes=prefixes,
            next_page_token=token,
            skipped_corrupt_records=skipped.count,
        )

    def DiffUncommitted(self, request, context):
        return listed(
            pb.DiffUncommittedResponse,
            "changes",
            lambda: self._g.diff_uncommitted(
                request.repository,
                request.branch,
                request.prefix,
                request.page_size,
                request.page_token,
            ),
            change_to_proto,
        )

    @idempotent(pb.DiscardChangesResponse)
    def DiscardChanges(self, request, context):
        self._g.discard_changes(request.repository, request.branch, request.path, request.prefix)
        return pb.DiscardChangesResponse()
