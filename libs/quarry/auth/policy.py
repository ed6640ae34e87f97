"""lakeFS-compatible policy documents: validation and evaluation.

A document is `{"Statement": [{"Effect": "Allow"|"Deny", "Action": [...], "Resource": ...}]}`
(keys case-insensitive, so lakeFS's lowercase `statement`/`effect`/... work too). `Action`
and `Resource` are a string or a list of strings; both may use the wildcards `*` (any run of
characters) and `?` (one character). A resource may use `${user}`, replaced by the calling
user's id (lakeFS's "own credentials" policies).

Evaluation (`decide`): a matching Deny wins over any Allow; with no matching statement the
answer is deny (default deny). Safety rule: nothing here may ever turn "no statement
matches" or "a Deny matches" into an allow.
"""

from __future__ import annotations

import enum
import functools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from quarry.auth.errors import InvalidPolicy

# ---- actions --------------------------------------------------------------------------

FS_ACTIONS = (
    "fs:ReadRepository",
    "fs:CreateRepository",
    "fs:DeleteRepository",
    "fs:UpdateRepository",
    "fs:ListRepositories",
    "fs:ReadObject",
    "fs:ListObjects",
    "fs:WriteObject",
    "fs:DeleteObject",
    "fs:ImportFromStorage",
    "fs:CreateBranch",
    "fs:DeleteBranch",
    "fs:ReadBranch",
    "fs:ListBranches",
    "fs:RevertBranch",
    "fs:CompactBranch",
    "fs:CreateCommit",
    "fs:ReadCommit",
    "fs:CreateTag",
    "fs:DeleteTag",
    "fs:ReadTag",
    "fs:ListTags",
    "fs:SetBranchProtectionRules",
    "fs:GetBranchProtectionRules",
    "fs:ReadActions",
)
RETENTION_ACTIONS = (
    "retention:GetGarbageCollectionRules",
    "retention:SetGarbageCollectionRules",
    "retention:DeleteGarbageCollectionRules",
)
AUTH_ACTIONS = (
    "auth:CreateUser",
    "auth:ReadUser",
    "auth:ListUsers",
    "auth:DeleteUser",
    "auth:CreateCredentials",
    "auth:ReadCredentials",
    "auth:ListCredentials",
    "auth:DeleteCredentials",
    "auth:CreateGroup",
    "auth:ReadGroup",
    "auth:ListGroups",
    "auth:DeleteGroup",
    "auth:AddGroupMember",
    "auth:RemoveGroupMember",
    "auth:CreatePolicy",
    "auth:ReadPolicy",
    "auth:ListPolicies",
    "auth:UpdatePolicy",
    "auth:DeletePolicy",
    "auth:AttachPolicy",
    "auth:DetachPolicy",
    # Record another user's id as the committer of a commit, merge, revert or cherry-pick
    # (Admins, through auth:*); everyone else commits as themselves.
    "auth:CommitAsOtherUser",
)
KV_ACTIONS = ("kv:Read",)
ACTIONS: tuple[str, ...] = FS_ACTIONS + RETENTION_ACTIONS + AUTH_ACTIONS + KV_ACTIONS
_ACTION_SET = frozenset(ACTIONS)

# ---- resources ------------------------------------------------------------------------

FS_ARN = "arn:quarry:fs:::"
AUTH_ARN = "arn:quarry:auth:::"
KV_ARN = "arn:quarry:kv:::"
ALL_RESOURCES = "*"
# Read as `arn:quarry:` (a lakeFS policy document works as written).
LAKEFS_ARN_PREFIX = "arn:lakefs:"
USER_VARIABLE = "${user}"
_RESOURCE_FORMS = (
    "*, arn:quarry:fs:::repository/<repo>[/branch/<b>|/object/<path>|/tag/<t>], "
    "arn:quarry:fs:::storage/<uri> (fs:ImportFromStorage), "
    "arn:quarry:auth:::user|group|policy/<id>, arn:quarry:kv:::partition/<partition>"
)
_RESOURCE_SHAPE = re.compile(
    r"^arn:quarry:(?:fs:::(?:repository|storage)/.+|auth:::(?:user|group|policy)/.+|kv:::partition/.+"
    r"|(?:fs|auth|kv):::\*)$"
)


def repository_arn(repo: str) -> str:
    return f"{FS_ARN}repository/{repo}"


def branch_arn(repo: str, branch: str) -> str:
    return f"{FS_ARN}repository/{repo}/branch/{branch}"


def object_arn(repo: str, path: str) -> str:
    return f"{FS_ARN}repository/{repo}/object/{path}"


def storage_arn(uri: str) -> str:
    """A place in object storage outside Quarry (an import's source)."""
    return f"{FS_ARN}storage/{uri}"


def tag_arn(repo: str, tag: str) -> str:
    return f"{FS_ARN}repository/{repo}/tag/{tag}"


def user_arn(user_id: str) -> str:
    return f"{AUTH_ARN}user/{user_id}"


def group_arn(group_id: str) -> str:
    return f"{AUTH_ARN}group/{group_id}"


def policy_arn(policy_id: str) -> str:
    return f"{AUTH_ARN}policy/{policy_id}"


def kv_partition_arn(partition: bytes) -> str:
    return f"{KV_ARN}partition/{partition.decode('utf-8', 'backslashreplace')}"


# ---- wildcards ------------------------------------------------------------------------


@functools.lru_cache(maxsize=8192)
def _compiled(pattern: str) -> re.Pattern[str]:
    parts = []
    for char in pattern:
        if char == "*":
            parts.append(".*")
        elif char == "?":
            parts.append(".")
        else:
            parts.append(re.escape(char))
    return re.compile("".join(parts), re.DOTALL)


def wildcard_match(pattern: str, value: str) -> bool:
    """`*` matches any run of characters (also `/`), `?` exactly one; nothing else is special."""
    if pattern == "*":
        return True
    if "*" not in pattern and "?" not in pattern:
        return pattern == value
    return _compiled(pattern).fullmatch(value) is not None


# ---- documents ------------------------------------------------------------------------


class Effect(enum.Enum):
    ALLOW = "Allow"
    DENY = "Deny"


@dataclass(frozen=True)
class Statement:
    effect: Effect
    actions: tuple[str, ...]
    resources: tuple[str, ...]

    def names_action(self, action: str) -> bool:
        return any(wildcard_match(pattern, action) for pattern in self.actions)

    def names_every_resource(self) -> bool:
        return "*" in self.resources

    def names_resource(self, resource: str, user_id: str | None) -> bool:
        for pattern in self.resources:
            if USER_VARIABLE in pattern:
                if user_id is None:
                    continue  # a service principal is no user: ${user} matches nothing
                pattern = pattern.replace(USER_VARIABLE, user_id)
            if wildcard_match(pattern, resource):
                return True
        return False


@dataclass(frozen=True)
class Policy:
    id: str
    statements: tuple[Statement, ...]


def parse_policy(policy_id: str, document: str) -> Policy:
    """Validate `document` and return it parsed; InvalidPolicy naming the position of the
    first problem (JSON line/column, or Statement[i].Field[j])."""
    try:
        raw = json.loads(document)
    except json.JSONDecodeError as exc:
        raise InvalidPolicy(
            f"policy {policy_id!r} is not valid JSON: {exc.msg} at line {exc.lineno} "
            f"column {exc.colno}",
            metadata={"policy": policy_id, "line": str(exc.lineno), "column": str(exc.colno)},
        ) from None
    except (ValueError, RecursionError) as exc:
        # json's own limits: an integer of more than 4,300 digits, nesting deeper than the
        # interpreter's recursion limit.
        raise InvalidPolicy(
            f"policy {policy_id!r} is not a policy document: {exc}"[:500],
            metadata={"policy": policy_id},
        ) from None
    if not isinstance(raw, dict):
        _invalid(policy_id, "", "a policy document is a JSON object with a Statement list")
    top = _keys(policy_id, "", raw, {"statement", "version", "id"})
    statements = top.get("statement")
    if not isinstance(statements, list) or not statements:
        _invalid(policy_id, "Statement", "Statement must be a non-empty list of statements")
    parsed = tuple(_parse_statement(policy_id, i, s) for i, s in enumerate(statements))
    return Policy(policy_id, parsed)


def _parse_statement(policy_id: str, index: int, raw: Any) -> Statement:
    where = f"Statement[{index}]"
    if not isinstance(raw, dict):
        _invalid(policy_id, where, "a statement is a JSON object with Effect, Action, Resource")
    fields = _keys(policy_id, where, raw, {"effect", "action", "resource", "sid"})
    for name in ("effect", "action", "resource"):
        if name not in fields:
            _invalid(policy_id, f"{where}.{name.capitalize()}", "is missing")
    effect_raw = fields["effect"]
    effect = {"allow": Effect.ALLOW, "deny": Effect.DENY}.get(
        effect_raw.lower() if isinstance(effect_raw, str) else ""
    )
    if effect is None:
        _invalid(
            policy_id, f"{where}.Effect", f'must be "Allow" or "Deny", not {json.dumps(effect_raw)}'
        )
    actions = _strings(policy_id, f"{where}.Action", fields["action"])
    for j, action in enumerate(actions):
        if not _known_action(action):
            _invalid(
                policy_id,
                f"{where}.Action[{j}]",
                f"{action!r} is not a known action (nor a wildcard matching one); known "
                f"services: fs, retention, auth, kv",
            )
    resources = [
        # lakeFS's policies as exported: its ARNs have Quarry's shapes under another name.
        "arn:quarry:" + r[len(LAKEFS_ARN_PREFIX) :] if r.startswith(LAKEFS_ARN_PREFIX) else r
        for r in _strings(policy_id, f"{where}.Resource", fields["resource"])
    ]
    for j, resource in enumerate(resources):
        if resource != ALL_RESOURCES and not _RESOURCE_SHAPE.match(resource):
            _invalid(
                policy_id,
                f"{where}.Resource[{j}]",
                f"{resource!r} is not a Quarry resource; forms: {_RESOURCE_FORMS}",
            )
    return Statement(effect, tuple(actions), tuple(resources))


def _known_action(action: str) -> bool:
    if "*" in action or "?" in action:
        return any(wildcard_match(action, known) for known in ACTIONS)
    return action in _ACTION_SET


def _keys(policy_id: str, where: str, raw: dict[str, Any], allowed: set[str]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for key, value in raw.items():
        lower = key.lower() if isinstance(key, str) else key
        path = f"{where}.{key}" if where else key
        if lower not in allowed:
            _invalid(
                policy_id,
                path,
                f"unknown field; allowed: {', '.join(sorted(a.capitalize() for a in allowed))}",
            )
        if lower in fields:
            _invalid(policy_id, path, "given twice (field names are case-insensitive)")
        fields[lower] = value
    return fields


def _strings(policy_id: str, where: str, raw: Any) -> list[str]:
    values = [raw] if isinstance(raw, str) else raw
    if not isinstance(values, list) or not values:
        _invalid(policy_id, where, "must be a string or a non-empty list of strings")
    for j, value in enumerate(values):
        if not isinstance(value, str) or not value:
            _invalid(policy_id, f"{where}[{j}]", "must be a non-empty string")
    return list(values)


def _invalid(policy_id: str, where: str, why: str) -> NoReturn:
    position = where or "document"
    raise InvalidPolicy(
        f"policy {policy_id!r}: {position}: {why}",
        metadata={"policy": policy_id, "position": position},
    )


# ---- evaluation -----------------------------------------------------------------------


class Decision(enum.Enum):
    ALLOW = "allow"
    DENY = "deny"  # an explicit Deny matched
    NO_GRANT = "no_grant"  # nothing matched: denied by default


def decide(
    policies: Iterable[Policy], action: str, resources: Sequence[str], user_id: str | None
) -> tuple[Decision, str]:
    """The decision for `action` on EVERY one of `resources`, and the resource that decided
    a refusal ("" when allowed). Deny wins; default deny."""
    if not resources:
        return Decision.NO_GRANT, ""  # naming nothing is not "allowed on everything"
    # The action is the same for every resource: match it once.
    statements = _statements_for(policies, action)
    # A bulk request (PutObjects: 1,000 objects) under an Allow on "*" with no Deny naming
    # the action at all is allowed as a whole.
    if _allowed_everywhere(statements):
        return Decision.ALLOW, ""
    for resource in resources:
        allowed = False
        for statement in statements:
            if not statement.names_resource(resource, user_id):
                continue
            if statement.effect is Effect.DENY:
                return Decision.DENY, resource
            allowed = True
        if not allowed:
            return Decision.NO_GRANT, resource
    return Decision.ALLOW, ""


def allows_everywhere(policies: Iterable[Policy], action: str) -> bool:
    """Whether `action` is allowed on every resource whatever it is: an Allow on "*" names
    the action and no Deny names it at all. Never true when any Deny names the action (deny
    wins: then each resource must be decided)."""
    return _allowed_everywhere(_statements_for(policies, action))


def allows_under(policies: Iterable[Policy], action: str, prefix: str, user_id: str | None) -> bool:
    """Whether `action` is allowed on every resource that starts with `prefix` (every object
    of a repository: `arn:quarry:fs:::repository/REPO/object/`): an Allow whose resource is
    "*" or a literal head of `prefix` followed by one trailing "*", and no Deny naming the
    action on a resource that could match one of them. Conservative: a pattern with another
    wildcard never counts as covering, and any Deny that may overlap the prefix makes it
    False (a caller then decides each resource, or refuses)."""
    allowed = False
    for statement in _statements_for(policies, action):
        for pattern in statement.resources:
            if USER_VARIABLE in pattern:
                if user_id is None:
                    continue
                pattern = pattern.replace(USER_VARIABLE, user_id)
            if statement.effect is Effect.DENY:
                if _may_overlap(pattern, prefix):
                    return False
            elif _covers(pattern, prefix):
                allowed = True
    return allowed


def _covers(pattern: str, prefix: str) -> bool:
    head = pattern[:-1]
    return pattern == "*" or (
        pattern.endswith("*") and "*" not in head and "?" not in head and prefix.startswith(head)
    )


def _may_overlap(pattern: str, prefix: str) -> bool:
    """Whether `pattern` could match some resource starting with `prefix`: its literal part
    before the first wildcard and `prefix` agree as far as both go."""
    cut = min((i for i in (pattern.find("*"), pattern.find("?")) if i >= 0), default=-1)
    if cut < 0:
        return pattern.startswith(prefix)
    head = pattern[:cut]
    return head.startswith(prefix) or prefix.startswith(head)


def _statements_for(policies: Iterable[Policy], action: str) -> list[Statement]:
    return [
        statement
        for policy in policies
        for statement in policy.statements
        if statement.names_action(action)
    ]


def _allowed_everywhere(statements: Sequence[Statement]) -> bool:
    return not any(s.effect is Effect.DENY for s in statements) and any(
        s.effect is Effect.ALLOW and s.names_every_resource() for s in statements
    )


# ---- the structured form (API.md's statements[{effect, actions[], resource}]) ----------


@dataclass(frozen=True)
class FlatStatement:
    """One statement with exactly one resource: the structured form of the gRPC contract.
    Its fields are taken as given; parse_policy validates them."""

    effect: str
    actions: tuple[str, ...]
    resource: str


def document_of(policy_id: str, text: str, statements: Sequence[FlatStatement]) -> str:
    """The policy document of a create or update request that gives either a JSON document
    (`text`) or structured statements, never both and never neither (INVALID_POLICY). The
    statements become Statement[i] of the document, so parse_policy names the same position
    (statements[i].actions[j] is Statement[i].Action[j])."""
    if bool(text) == bool(statements):
        _invalid(
            policy_id,
            "",
            f"give either a JSON document or structured statements, not "
            f"{'both' if text else 'neither'}",
        )
    if text:
        return text
    return document(
        *(
            {"Effect": s.effect, "Action": list(s.actions), "Resource": s.resource}
            for s in statements
        )
    )


def flat_statements(policy: Policy) -> list[FlatStatement]:
    """The statements of a parsed policy, one per resource: a statement naming resources
    [a, b] matches a request exactly when one of [a] or [b] does, so the decisions are the
    same (decide() checks each resource against every statement)."""
    return [
        FlatStatement(statement.effect.value, statement.actions, resource)
        for statement in policy.statements
        for resource in statement.resources
    ]


def document(*statements: dict[str, Any]) -> str:
    """A policy document from statement dicts (bootstrap and tests)."""
    return json.dumps({"Statement": list(statements)}, separators=(",", ":"))
