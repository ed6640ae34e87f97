"""THE declaration table: for every RPC of protos/quarry/v1, who may call it and, for user
calls, the action and resources it checks (docs/architecture.md §9). The interceptor enforces
exactly this table; a test parses the protos and fails when an RPC has no entry.

Access kinds:
  * OPEN: no token needed (ServerInfo, Auth/Login, Auth/Setup; health and reflection are outside
    quarry.v1 and always open).
  * AUTHENTICATED: any valid principal (Auth/WhoAmI).
  * ACTION: a user whose policies allow `action` on every resource the request names, or a
    service principal.
  * SERVICE_ONLY: the suite's own services only (raw KV writes, the range-writer, staging
    reports). A user is refused whatever its policies say, even an admin.

Safety rule: an RPC of quarry.v1 with no entry here is refused (never open by default), and
a request naming several objects (PutObjects, DeleteObjects, BatchGetItems) is checked for
EVERY object it names, so a Deny on one path cannot be bypassed by batching.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quarry.auth.policy import (
    ALL_RESOURCES,
    KV_ARN,
    branch_arn,
    group_arn,
    kv_partition_arn,
    object_arn,
    policy_arn,
    repository_arn,
    storage_arn,
    tag_arn,
    user_arn,
)
from quarry.auth.request_ids import requested_id

PACKAGE = "quarry.v1"

Resources = Callable[[Any], tuple[str, ...]]


class Access(enum.Enum):
    OPEN = "open"
    AUTHENTICATED = "authenticated"
    ACTION = "action"
    SERVICE_ONLY = "service_only"


@dataclass(frozen=True)
class Rule:
    access: Access
    action: str = ""
    # The resources a request names; for a client stream, called on every message with
    # the first message of the stream (later ones may leave repository/branch empty).
    resources: Callable[..., tuple[str, ...]] | None = None
    mutating: bool = False
    client_stream: bool = False
    # More (action, resources) pairs the caller must be allowed as well (StartImport: the
    # source to read, the destination to write and commit); for a client stream called as
    # `resources` is.
    also: tuple[tuple[str, Callable[..., tuple[str, ...]]], ...] = ()
    # A call that changes nothing whose refusals are audited as a refused change: a check a
    # service makes before a write it then never sends (Auth/CheckPermission).
    audit_refusals: bool = False


def _open(mutating: bool = False) -> Rule:
    return Rule(Access.OPEN, mutating=mutating)


def _service(mutating: bool = True, client_stream: bool = False) -> Rule:
    return Rule(Access.SERVICE_ONLY, mutating=mutating, client_stream=client_stream)


def _act(action: str, resources: Resources, mutating: bool = False) -> Rule:
    return Rule(Access.ACTION, action, resources, mutating)


# ---- resource builders ------------------------------------------------------------------


def _all(_: Any) -> tuple[str, ...]:
    return (ALL_RESOURCES,)


def _repo_named(request: Any) -> tuple[str, ...]:
    return (repository_arn(request.name),)


def _repo(request: Any) -> tuple[str, ...]:
    return (repository_arn(request.repository),)


def _branch_named(request: Any) -> tuple[str, ...]:
    return (branch_arn(request.repository, request.name),)


def _branch(request: Any) -> tuple[str, ...]:
    return (branch_arn(request.repository, request.branch),)


def _destination(request: Any) -> tuple[str, ...]:
    return (branch_arn(request.repository, request.destination_branch),)


def _tag_named(request: Any) -> tuple[str, ...]:
    return (tag_arn(request.repository, request.name),)


def _object(request: Any) -> tuple[str, ...]:
    return (object_arn(request.repository, request.path),)


def _copy_source(request: Any) -> tuple[str, ...]:
    return (object_arn(request.repository, request.source_path),)


def _put_object(request: Any) -> tuple[str, ...]:
    return (object_arn(request.repository, request.entry.path),)


def _put_objects(message: Any, first: Any) -> tuple[str, ...]:
    repository = message.repository or first.repository
    paths = [entry.path for entry in message.entries] or [""]
    return tuple(object_arn(repository, path) for path in paths)


def _delete_objects(request: Any) -> tuple[str, ...]:
    paths = list(request.paths) or [""]
    return tuple(object_arn(request.repository, path) for path in paths)


def _import_sources(request: Any) -> tuple[str, ...]:
    from quarry.graveler.reach import place_of_source

    uris = [source.uri for source in request.sources] or [""]
    return tuple(storage_arn(place_of_source(uri)) for uri in uris)


def _import_destinations(request: Any) -> tuple[str, ...]:
    paths = [source.destination_path for source in request.sources] or [""]
    return tuple(object_arn(request.repository, path) for path in paths)


def _restored(message: Any, first: Any) -> tuple[str, ...]:
    return (repository_arn(first.name),)


def _restored_namespace(message: Any, first: Any) -> tuple[str, ...]:
    """A restore brings the data already in a namespace under a repository, as an import
    does with its sources."""
    from quarry.graveler.reach import place_of_source

    return (storage_arn(place_of_source(first.storage_namespace)),)


def _partition(request: Any) -> tuple[str, ...]:
    return (kv_partition_arn(request.partition_key),)


def _partitions(request: Any) -> tuple[str, ...]:
    names = sorted({item.partition_key for item in request.items}) or [b""]
    return tuple(kv_partition_arn(name) for name in names)


def _capacity(_: Any) -> tuple[str, ...]:
    return (f"{KV_ARN}capacity-report",)


# The user, group and policy a request names come from request_ids.requested_id, the one
# reader the servicer uses too (a request naming them by `id` is authorized on that id).


def _user(request: Any) -> tuple[str, ...]:
    return (user_arn(requested_id(request, "user_id")),)


def _group(request: Any) -> tuple[str, ...]:
    return (group_arn(requested_id(request, "group_id")),)


def _attachment_principals(request: Any) -> tuple[str, ...]:
    """The user and/or group an AttachPolicy/DetachPolicy request names, as the
    ...ToUser/...ToGroup RPCs check them. Both when both are named (the call is refused
    afterwards, but never authorized on one of them only); an empty user id when neither is,
    as AttachPolicyToUser's empty request."""
    named = []
    if request.user_id:
        named.append(user_arn(request.user_id))
    if request.group_id:
        named.append(group_arn(request.group_id))
    return tuple(named) or (user_arn(""),)


def _policy(request: Any) -> tuple[str, ...]:
    return (policy_arn(requested_id(request, "policy_id")),)


# ---- the table --------------------------------------------------------------------------

_BY_SERVICE: dict[str, dict[str, Rule]] = {
    "ServerInfo": {"GetServerInfo": _open()},
    "BranchManager": {
        "CreateRepository": _act("fs:CreateRepository", _repo_named, mutating=True),
        "GetRepository": _act("fs:ReadRepository", _repo_named),
        "ListRepositories": _act("fs:ListRepositories", _all),
        "DeleteRepository": _act("fs:DeleteRepository", _repo_named, mutating=True),
        "UpdateRepository": _act("fs:UpdateRepository", _repo_named, mutating=True),
        # A dump holds the repository's branches, tags, commits and rules; it changes
        # nothing but is audited like a change (mutating): the whole history leaving.
        "DumpRepository": Rule(
            Access.ACTION,
            "fs:ReadRepository",
            _repo_named,
            mutating=True,
            also=(
                ("fs:ListBranches", _repo_named),
                ("fs:ListTags", _repo_named),
                ("fs:ReadCommit", _repo_named),
                ("retention:GetGarbageCollectionRules", _repo_named),
                ("fs:GetBranchProtectionRules", _repo_named),
            ),
        ),
        "RestoreRepository": Rule(
            Access.ACTION,
            "fs:CreateRepository",
            _restored,
            mutating=True,
            client_stream=True,
            also=(("fs:ImportFromStorage", _restored_namespace),),
        ),
        "CreateBranch": _act("fs:CreateBranch", _branch_named, mutating=True),
        "GetBranch": _act("fs:ReadBranch", _branch_named),
        "ListBranches": _act("fs:ListBranches", _repo),
        "DeleteBranch": _act("fs:DeleteBranch", _branch_named, mutating=True),
        "ResetBranch": _act("fs:RevertBranch", _branch, mutating=True),
        "CreateTag": _act("fs:CreateTag", _tag_named, mutating=True),
        "GetTag": _act("fs:ReadTag", _tag_named),
        "ListTags": _act("fs:ListTags", _repo),
        "DeleteTag": _act("fs:DeleteTag", _tag_named, mutating=True),
        "SetGarbageCollectionRules": _act(
            "retention:SetGarbageCollectionRules", _repo, mutating=True
        ),
        "GetGarbageCollectionRules": _act("retention:GetGarbageCollectionRules", _repo),
        "DeleteGarbageCollectionRules": _act(
            "retention:DeleteGarbageCollectionRules", _repo, mutating=True
        ),
        "SetBranchProtectionRules": _act("fs:SetBranchProtectionRules", _repo, mutating=True),
        "GetBranchProtectionRules": _act("fs:GetBranchProtectionRules", _repo),
        "StatObject": _act("fs:ReadObject", _object),
        "PutObject": _act("fs:WriteObject", _put_object, mutating=True),
        # Writing the destination and reading the source (whose address the copy shares).
        "CopyObject": Rule(
            Access.ACTION,
            "fs:WriteObject",
            _object,
            mutating=True,
            also=(("fs:ReadObject", _copy_source),),
        ),
        "PutObjects": Rule(
            Access.ACTION, "fs:WriteObject", _put_objects, mutating=True, client_stream=True
        ),
        "DeleteObject": _act("fs:DeleteObject", _object, mutating=True),
        "DeleteObjects": _act("fs:DeleteObject", _delete_objects, mutating=True),
        "ListObjects": _act("fs:ListObjects", _repo),
        "DiffUncommitted": _act("fs:ListObjects", _repo),
        "DiscardChanges": _act("fs:RevertBranch", _branch, mutating=True),
    },
    "Committer": {
        "Commit": _act("fs:CreateCommit", _branch, mutating=True),
        "Merge": _act("fs:CreateCommit", _destination, mutating=True),
        "Revert": _act("fs:RevertBranch", _branch, mutating=True),
        "CherryPick": _act("fs:CreateCommit", _branch, mutating=True),
        "Diff": _act("fs:ListObjects", _repo),
        "GetCommit": _act("fs:ReadCommit", _repo),
        "Log": _act("fs:ReadCommit", _repo),
        "FindMergeBase": _act("fs:ReadCommit", _repo),
        # The compactor-sensor calls it as a service; `quarry compact` as a user.
        "Compact": _act("fs:CompactBranch", _branch, mutating=True),
        # Reading the sources, writing the destination paths and committing on the branch.
        "StartImport": Rule(
            Access.ACTION,
            "fs:ImportFromStorage",
            _import_sources,
            mutating=True,
            also=(("fs:WriteObject", _import_destinations), ("fs:CreateCommit", _branch)),
        ),
        "GetImportStatus": _act("fs:ReadRepository", _repo),
        # An import's id names no branch: cancelling needs fs:CreateCommit on the repository.
        "CancelImport": _act("fs:CreateCommit", _repo, mutating=True),
        # Action runs name hook URLs and their answers: their own permission (fs:Read*).
        "ListActionRuns": _act("fs:ReadActions", _repo),
        "GetActionRun": _act("fs:ReadActions", _repo),
    },
    "CompactorSensor": {
        "ReportStagingActivity": _service(),
        "GetBranchStagingStats": _act("fs:ReadBranch", _branch),
        "ListCompactionCandidates": _act("fs:ReadBranch", _all),
    },
    "KVGateway": {
        "GetItem": _act("kv:Read", _partition),
        "BatchGetItems": _act("kv:Read", _partitions),
        "SetItem": _service(),
        "SetItemIf": _service(),
        "DeleteItem": _service(),
        "BatchSetItems": _service(),
        "SetItemsThenGet": _service(),
        "BatchDeleteItems": _service(),
        "ScanItems": _act("kv:Read", _partition),
        "GetCapacityReport": _act("kv:Read", _capacity),
    },
    "RangeWriter": {
        "ApplyChanges": _service(client_stream=True),
        "MergeMetaRanges": _service(),
        "WriteMetaRange": _service(client_stream=True),
        "GetMetaRange": _service(mutating=False),
        "ClaimNamespace": _service(),
        "ReplacePrefixes": _service(),
    },
    "Auth": {
        # Audited (a line per call, refused or not): a guessed secret must leave a trace of
        # the key it was tried on and from where; the servicer names the key, never the secret.
        "Login": _open(mutating=True),
        # Refused (ADMIN_EXISTS) once an admin exists, so open is safe: only the first
        # caller of an empty installation gets anything.
        "Setup": _open(mutating=True),
        "WhoAmI": Rule(Access.AUTHENTICATED),
        # One's own permissions; the servicer decides them (the action and resource are
        # the request's).
        "CheckPermission": Rule(Access.AUTHENTICATED, audit_refusals=True),
        # The s3-gateway's SigV4 check: a signature oracle only the suite's services may ask.
        "VerifySignature": _service(),
        "CreateUser": _act("auth:CreateUser", _user, mutating=True),
        "GetUser": _act("auth:ReadUser", _user),
        "ListUsers": _act("auth:ListUsers", _all),
        "DeleteUser": _act("auth:DeleteUser", _user, mutating=True),
        "CreateCredentials": _act("auth:CreateCredentials", _user, mutating=True),
        "GetCredentials": _act("auth:ReadCredentials", _user),
        "ListCredentials": _act("auth:ListCredentials", _user),
        "DeleteCredentials": _act("auth:DeleteCredentials", _user, mutating=True),
        "CreateGroup": _act("auth:CreateGroup", _group, mutating=True),
        "GetGroup": _act("auth:ReadGroup", _group),
        "ListGroups": _act("auth:ListGroups", _all),
        "DeleteGroup": _act("auth:DeleteGroup", _group, mutating=True),
        "AddGroupMember": _act("auth:AddGroupMember", _group, mutating=True),
        "RemoveGroupMember": _act("auth:RemoveGroupMember", _group, mutating=True),
        "ListGroupMembers": _act("auth:ReadGroup", _group),
        "ListUserGroups": _act("auth:ReadUser", _user),
        "CreatePolicy": _act("auth:CreatePolicy", _policy, mutating=True),
        "GetPolicy": _act("auth:ReadPolicy", _policy),
        "ListPolicies": _act("auth:ListPolicies", _all),
        "UpdatePolicy": _act("auth:UpdatePolicy", _policy, mutating=True),
        "DeletePolicy": _act("auth:DeletePolicy", _policy, mutating=True),
        "AttachPolicy": _act("auth:AttachPolicy", _attachment_principals, mutating=True),
        "DetachPolicy": _act("auth:DetachPolicy", _attachment_principals, mutating=True),
        "AttachPolicyToUser": _act("auth:AttachPolicy", _user, mutating=True),
        "DetachPolicyFromUser": _act("auth:DetachPolicy", _user, mutating=True),
        "AttachPolicyToGroup": _act("auth:AttachPolicy", _group, mutating=True),
        "DetachPolicyFromGroup": _act("auth:DetachPolicy", _group, mutating=True),
        "ListUserPolicies": _act("auth:ReadUser", _user),
        "ListGroupPolicies": _act("auth:ReadGroup", _group),
        "ListEffectivePolicies": _act("auth:ReadUser", _user),
    },
}

RULES: dict[str, Rule] = {
    f"/{PACKAGE}.{service}/{method}": rule
    for service, methods in _BY_SERVICE.items()
    for method, rule in methods.items()
}


def rule_for(method: str) -> Rule | None:
    """The rule of a full method name (`/quarry.v1.Service/Method`), None if undeclared."""
    return RULES.get(method)


def is_quarry_method(method: str) -> bool:
    return method.startswith(f"/{PACKAGE}.")
