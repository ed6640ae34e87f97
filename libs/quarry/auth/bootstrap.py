"""Built-in policies and groups with lakeFS's meanings, and `setup_admin`, the first-run
bootstrap (what `quarry setup` / `quarry up` / the Helm Job will call).

| group      | policies                                                         |
|------------|------------------------------------------------------------------|
| Admins     | AuthFullAccess, FSFullAccess, RetentionFullAccess, KVReadAll      |
| SuperUsers | FSFullAccess, AuthManageOwnCredentials, RetentionReadAll          |
| Developers | FSReadWriteAll, AuthManageOwnCredentials, RetentionReadAll        |
| Viewers    | FSReadAll, AuthManageOwnCredentials                               |

Developers read and write data (objects, branches, tags, commits) but cannot create or
delete repositories, import from outside a namespace, set branch protection or manage IAM.

Safety rule: setup_admin succeeds at most once per installation and never replaces an
existing policy or group. "Once" is one atomic KV set-if-absent of the installation record
(IamStore.claim_installation), written BEFORE the admin is created, so of any number of
concurrent Setup calls exactly one creates an admin. It never depends on mutable data: moving
the admin out of Admins, emptying or deleting that group, never reopens Setup. An
installation from before the record (it has users) counts as installed and gets its record
(IamStore.is_installed). The price: a Setup that crashes after its claim leaves an
installation without an admin (the record names the admin it was for): Setup stays closed,
and only an operator with KV access can reopen it, never an anonymous caller.
"""

from __future__ import annotations

import contextlib

from quarry import errors
from quarry.auth import errors as auth_errors
from quarry.auth.keys import MIN_CHOSEN_SECRET_LENGTH
from quarry.auth.policy import document
from quarry.auth.store import IamStore, check_id
from quarry.storage.v1 import auth_records_pb2 as records

ADMINS = "Admins"
SUPER_USERS = "SuperUsers"
DEVELOPERS = "Developers"
VIEWERS = "Viewers"

_ALL = "*"
_OWN_USER = "arn:quarry:auth:::user/${user}"

BUILTIN_POLICIES: dict[str, str] = {
    "FSFullAccess": document({"Effect": "Allow", "Action": ["fs:*"], "Resource": _ALL}),
    "FSReadWriteAll": document(
        {
            "Effect": "Allow",
            "Action": [
                "fs:Read*",
                "fs:List*",
                "fs:WriteObject",
                "fs:DeleteObject",
                "fs:CreateBranch",
                "fs:DeleteBranch",
                "fs:RevertBranch",
                "fs:CompactBranch",
                "fs:CreateCommit",
                "fs:CreateTag",
                "fs:DeleteTag",
                "fs:GetBranchProtectionRules",
            ],
            "Resource": _ALL,
        }
    ),
    "FSReadAll": document(
        {"Effect": "Allow", "Action": ["fs:Read*", "fs:List*"], "Resource": _ALL}
    ),
    "AuthFullAccess": document({"Effect": "Allow", "Action": ["auth:*"], "Resource": _ALL}),
    "AuthManageOwnCredentials": document(
        {
            "Effect": "Allow",
            "Action": [
                "auth:CreateCredentials",
                "auth:DeleteCredentials",
                "auth:ListCredentials",
                "auth:ReadCredentials",
            ],
            "Resource": _OWN_USER,
        }
    ),
    "RetentionFullAccess": document(
        {"Effect": "Allow", "Action": ["retention:*"], "Resource": _ALL}
    ),
    "RetentionReadAll": document(
        {"Effect": "Allow", "Action": ["retention:Get*"], "Resource": _ALL}
    ),
    "KVReadAll": document({"Effect": "Allow", "Action": ["kv:Read"], "Resource": _ALL}),
}

BUILTIN_GROUPS: dict[str, tuple[str, ...]] = {
    ADMINS: ("AuthFullAccess", "FSFullAccess", "RetentionFullAccess", "KVReadAll"),
    SUPER_USERS: ("FSFullAccess", "AuthManageOwnCredentials", "RetentionReadAll"),
    DEVELOPERS: ("FSReadWriteAll", "AuthManageOwnCredentials", "RetentionReadAll"),
    VIEWERS: ("FSReadAll", "AuthManageOwnCredentials"),
}


def ensure_builtins(iam: IamStore) -> None:
    """Create the built-in policies and groups that are missing; never overwrite one."""
    for policy_id, text in BUILTIN_POLICIES.items():
        with contextlib.suppress(errors.AlreadyExists):
            iam.create_policy(policy_id, text)
    for group_id, policy_ids in BUILTIN_GROUPS.items():
        try:
            iam.create_group(group_id, description=f"built-in: {', '.join(policy_ids)}")
        except errors.AlreadyExists:
            continue  # an operator may have changed its attachments on purpose
        for policy_id in policy_ids:
            iam.attach_group_policy(group_id, policy_id)


def setup_admin(
    iam: IamStore,
    user_id: str = "admin",
    email: str = "",
    access_key_id: str = "",
    secret_access_key: str = "",
    client_address: str = "",
) -> tuple[records.UserRecord, records.CredentialRecord, str]:
    """The first admin of an empty installation and its credential (the secret returned
    here once; `access_key_id`/`secret_access_key` when the operator chooses them).
    FAILED_PRECONDITION / ADMIN_EXISTS once the installation is set up (module docstring);
    `client_address` is kept in the installation record."""
    # Checked before anything is written: a refused setup leaves the installation as it was.
    check_id("user", user_id)
    if access_key_id:
        check_id("access key", access_key_id)
    if bool(access_key_id) != bool(secret_access_key):
        raise errors.InvalidArgument("give both the access key id and the secret, or neither")
    if secret_access_key and len(secret_access_key) < MIN_CHOSEN_SECRET_LENGTH:
        raise errors.InvalidArgument(
            f"a chosen secret access key must be at least {MIN_CHOSEN_SECRET_LENGTH} characters"
        )
    if iam.is_installed() or not iam.claim_installation(user_id, client_address):
        raise auth_errors.AdminExists(
            "this installation is set up already; log in with its admin's credentials",
            metadata={"group": ADMINS},
        )
    ensure_builtins(iam)
    user = iam.create_user(user_id, email=email)
    iam.add_group_member(ADMINS, user_id)
    credential, secret = iam.create_credentials(user_id, access_key_id, secret_access_key)
    return user, credential, secret
