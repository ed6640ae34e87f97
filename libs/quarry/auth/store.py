"""The IAM store: users, groups, policies, credentials and their relationships in the KV
`auth` partition, modeled as docs/architecture.md §12 does.

One item per entity, relationships as auxiliary keys (no reverse index: the keyspace is
small, so "members of a group" and "who has this policy" are a scan and a filter):

  | key                                    | value (quarry.storage.v1) |
  |----------------------------------------|---------------------------|
  | iam/users/<user>                       | UserRecord                |
  | iam/groups/<group>                     | GroupRecord               |
  | iam/policies/<policy>                  | PolicyRecord              |
  | iam/credentials/<access-key-id>        | CredentialRecord (hash)   |
  | iam/user_credentials/<user>/<key-id>   | CredentialLink            |
  | iam/user_groups/<user>/<group>         | MembershipRecord          |
  | iam/user_policies/<user>/<policy>      | AttachmentRecord          |
  | iam/group_policies/<group>/<policy>    | AttachmentRecord          |
  | iam/installed                          | InstallationRecord        |

Lists are prefix scans, paged by id, by count and by encoded bytes (quarry.paging's
PageBudget, as every other listing: a page ends before the response would pass
max_response_bytes). A listing skips and counts a record it cannot decode
(quarry.graveler.records: DATA_LOSS / CORRUPT_RECORD only for a call that needs that very
record), and reads relationships from their KEYS (both ids are in the key), never from their
values, so one corrupt membership or attachment breaks no listing, no delete and no
authorization decision. Creation is
`SetIf absent` (ALREADY_EXISTS). There are no transactions, so the order of writes is the
safety argument:

  * Deleting an entity prunes its auxiliary keys FIRST and the entity LAST: a crash in
    between leaves the entity with fewer relationships, never a relationship pointing at a
    missing entity. A retried delete finishes the job.
  * A credential is usable only through its entity item. Creation writes the user's link
    before the credential; deletion removes the credential before the link. So a usable
    credential is always listed under its user (never an invisible key nobody can revoke).
  * Secrets are never stored: only keys.hash_secret's salted scrypt digest.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from quarry import errors
from quarry.auth import errors as auth_errors
from quarry.auth import keys
from quarry.auth.convert import encoded_size
from quarry.auth.policy import Policy, parse_policy
from quarry.config import Settings
from quarry.graveler.iterators import decode_page_token, encode_page_token
from quarry.graveler.records import decode_or_skip, decode_record, skips_corrupt_records
from quarry.kv import store as kv
from quarry.kv.partitions import AUTH_PARTITION
from quarry.paging import PageBudget
from quarry.storage.v1 import auth_records_pb2 as records

if TYPE_CHECKING:
    from quarry.auth.sigv4_secrets import SecretSealer

USERS = b"iam/users/"
GROUPS = b"iam/groups/"
POLICIES = b"iam/policies/"
CREDENTIALS = b"iam/credentials/"
USER_CREDENTIALS = b"iam/user_credentials/"
USER_GROUPS = b"iam/user_groups/"
USER_POLICIES = b"iam/user_policies/"
GROUP_POLICIES = b"iam/group_policies/"
# The once-only Setup record (bootstrap.setup_admin): not under any listed prefix.
INSTALLED = b"iam/installed"

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
# Letters, digits and _.@+=,- (lakeFS-like ids, emails work): never "/" (key separator),
# "*" or "?" (policy wildcards), "$" "{" "}" (the ${user} variable).
_ID = re.compile(r"^[A-Za-z0-9_.@+=,-]{1,128}$")
_NEW_KEY_ATTEMPTS = 5

R = TypeVar("R", bound=Message)
# (name the page token continues after, key of the record, its stored bytes or None when
# it vanished meanwhile): one candidate item of a listing page.
Candidate = tuple[str, bytes, "bytes | None"]


def check_id(kind: str, value: str) -> str:
    if not isinstance(value, str) or not _ID.match(value):
        raise auth_errors.InvalidIamId(
            f"invalid {kind} id {value!r}: 1-128 characters of letters, digits and _.@+=,-",
            metadata={"kind": kind, "id": str(value)[:200]},
        )
    return value


def _key(prefix: bytes, *ids: str) -> bytes:
    return prefix + "/".join(ids).encode()


def _prefix_end(prefix: bytes) -> bytes:
    # Every prefix here ends with "/"; the next byte value bounds the scan.
    return prefix[:-1] + bytes([prefix[-1] + 1])


class IamStore:
    """IAM entities and relationships over one KV store (local or the gateway)."""

    def __init__(
        self,
        store: kv.Store,
        clock: Callable[[], float] = time.time,
        hash_cost: int = keys.SCRYPT_N,
        max_response_bytes: int = Settings.max_response_bytes,
        sealer: SecretSealer | None = None,
    ):
        """`sealer`: when given, new credentials also keep their secret sealed with it, for
        AWS Signature V4 (quarry.auth.sigv4_secrets)."""
        self._kv = store
        self._sealer = sealer
        self._clock = clock
        self._hash_cost = hash_cost
        self._max_response_bytes = max_response_bytes
        self._decoy = keys.decoy_hash(n=hash_cost)

    # ---- installation -----------------------------------------------------------------

    def is_installed(self) -> bool:
        """Whether Setup has happened: the installation record exists (its bytes are not
        decoded: even a corrupt record means "installed", so corruption never reopens
        Setup). An installation set up before the record existed has users but no record:
        the record is written for it here (set-if-absent, `migrated`), so from then on only
        the record decides, and deleting users or emptying groups never reopens Setup."""
        if self._exists(INSTALLED):
            return True
        if not any(True for _ in self._scan(USERS, limit=1)):
            return False
        record = records.InstallationRecord(installed_at=self._now(), migrated=True)
        # A Setup or another migration may have written it meanwhile: installed either way.
        with contextlib.suppress(kv.PredicateFailed):
            self._kv.set_if(AUTH_PARTITION, INSTALLED, record.SerializeToString(), kv.ABSENT)
        return True

    def claim_installation(self, admin_user_id: str, client_address: str = "") -> bool:
        """Write the installation record if there is none (one atomic set-if-absent): True
        for the one caller that wrote it, False for everyone else, however many race."""
        record = records.InstallationRecord(
            admin_user_id=admin_user_id, installed_at=self._now(), client_address=client_address
        )
        try:
            self._kv.set_if(AUTH_PARTITION, INSTALLED, record.SerializeToString(), kv.ABSENT)
        except kv.PredicateFailed:
            return False
        return True

    def installation(self) -> records.InstallationRecord | None:
        """The installation record, None before Setup (CorruptRecord if it is corrupt)."""
        try:
            got = self._kv.get(AUTH_PARTITION, INSTALLED)
        except kv.KeyNotFound:
            return None
        return _decode(kv.KeyValue(INSTALLED, got.value), records.InstallationRecord)

    # ---- users ------------------------------------------------------------------------

    def create_user(self, user_id: str, email: str = "") -> records.UserRecord:
        record = records.UserRecord(
            id=check_id("user", user_id), email=email, created_at=self._now()
        )
        self._insert(
            _key(USERS, user_id),
            record,
            auth_errors.UserExists(f"user {user_id!r} already exists", metadata={"user": user_id}),
        )
        return record

    def get_user(self, user_id: str) -> records.UserRecord:
        return self._get(
            _key(USERS, check_id("user", user_id)),
            records.UserRecord,
            auth_errors.UserNotFound(f"no user {user_id!r}", metadata={"user": user_id}),
        )

    def user_exists(self, user_id: str) -> bool:
        return self._exists(_key(USERS, user_id))

    @skips_corrupt_records
    def list_users(
        self, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[records.UserRecord], str]:
        return self._page(records.UserRecord, page_size, page_token, self._entities(USERS))

    def delete_user(self, user_id: str) -> None:
        """Credentials (each: entity, then link), memberships, attachments, then the user.
        Never deletes anything of another user."""
        self.get_user(user_id)
        prefix = _key(USER_CREDENTIALS, user_id) + b"/"
        for access_key_id in self._names(prefix):
            self._kv.delete(AUTH_PARTITION, _key(CREDENTIALS, access_key_id))
            self._kv.delete(AUTH_PARTITION, _key(USER_CREDENTIALS, user_id, access_key_id))
        self._delete_prefix(_key(USER_GROUPS, user_id) + b"/")
        self._delete_prefix(_key(USER_POLICIES, user_id) + b"/")
        self._kv.delete(AUTH_PARTITION, _key(USERS, user_id))

    # ---- credentials ------------------------------------------------------------------

    def create_credentials(
        self, user_id: str, access_key_id: str = "", secret: str = ""
    ) -> tuple[records.CredentialRecord, str]:
        """A new access key for the user and its secret: the only time the secret exists
        outside the caller's hands. Only its hash is stored. `access_key_id` and `secret`
        chosen by the caller (setup with given keys, like `lakefs setup`) are used as given;
        a chosen id already in use is refused (ALREADY_EXISTS), never taken over."""
        self.get_user(user_id)
        chosen = access_key_id
        if chosen:
            check_id("access key", chosen)
        if secret and len(secret) < keys.MIN_CHOSEN_SECRET_LENGTH:
            raise errors.InvalidArgument(
                f"a chosen secret access key must be at least {keys.MIN_CHOSEN_SECRET_LENGTH} "
                "characters"
            )
        secret = secret or keys.new_secret()
        hashed = keys.hash_secret(secret, n=self._hash_cost)
        for _ in range(1 if chosen else _NEW_KEY_ATTEMPTS):
            access_key_id = chosen or keys.new_access_key_id()
            record = records.CredentialRecord(
                access_key_id=access_key_id,
                user_id=user_id,
                secret_hash=hashed,
                created_at=self._now(),
            )
            if self._sealer is not None:
                record.sealed_secret = self._sealer.seal(access_key_id, secret)
            # Link first: a usable credential is always listed under its user.
            link = records.CredentialLink(user_id=user_id, access_key_id=access_key_id)
            self._kv.set(
                AUTH_PARTITION,
                _key(USER_CREDENTIALS, user_id, access_key_id),
                link.SerializeToString(),
            )
            try:
                self._kv.set_if(
                    AUTH_PARTITION,
                    _key(CREDENTIALS, access_key_id),
                    record.SerializeToString(),
                    kv.ABSENT,
                )
            except kv.PredicateFailed:
                # Another credential has this id (1 in 36^15): drop our link, try another.
                self._kv.delete(AUTH_PARTITION, _key(USER_CREDENTIALS, user_id, access_key_id))
                if chosen:
                    raise errors.AlreadyExists(
                        f"access key id {chosen!r} is already in use",
                        metadata={"access_key_id": chosen},
                    ) from None
                continue
            return record, secret
        raise errors.Aborted("could not find a free access key id; retry")

    def get_credentials(self, access_key_id: str) -> records.CredentialRecord:
        return self._get(
            _key(CREDENTIALS, check_id("access key", access_key_id)),
            records.CredentialRecord,
            auth_errors.CredentialsNotFound(
                f"no credentials {access_key_id!r}", metadata={"access_key_id": access_key_id}
            ),
        )

    def credentials_exist(self, access_key_id: str) -> bool:
        return self._exists(_key(CREDENTIALS, access_key_id))

    def get_user_credentials(self, user_id: str, access_key_id: str) -> records.CredentialRecord:
        """The user's credentials `access_key_id`. The same NOT_FOUND whether the key does
        not exist or belongs to someone else: a user who may manage only their own
        credentials never learns which access key ids are live."""
        missing = auth_errors.CredentialsNotFound(
            f"user {user_id!r} has no credentials {access_key_id!r}",
            metadata={"user": user_id, "access_key_id": access_key_id},
        )
        try:
            record = self.get_credentials(access_key_id)
        except auth_errors.CredentialsNotFound:
            raise missing from None
        if record.user_id != user_id:
            raise missing
        return record

    @skips_corrupt_records
    def list_credentials(
        self, user_id: str, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[records.CredentialRecord], str]:
        self.get_user(user_id)
        return self._page(
            records.CredentialRecord,
            page_size,
            page_token,
            self._related(_key(USER_CREDENTIALS, user_id) + b"/", CREDENTIALS),
        )

    def delete_credentials(self, user_id: str, access_key_id: str) -> None:
        """The credential first (it stops working at once), then the user's link. Never
        touches a credential of another user."""
        link = _key(USER_CREDENTIALS, check_id("user", user_id), access_key_id)
        try:
            self.get_user_credentials(user_id, access_key_id)
        except auth_errors.CredentialsNotFound:
            if not self._exists(link):
                raise
            # A previous delete stopped between the credential and its link: finish it.
        else:
            self._kv.delete(AUTH_PARTITION, _key(CREDENTIALS, access_key_id))
        self._kv.delete(AUTH_PARTITION, link)

    def authenticate(self, access_key_id: str, secret: str) -> records.CredentialRecord:
        """The credential whose secret this is; InvalidCredentials (the same answer for an
        unknown key and a wrong secret) otherwise."""
        refused = auth_errors.InvalidCredentials("unknown access key id or wrong secret access key")
        if not isinstance(access_key_id, str) or not _ID.match(access_key_id):
            raise refused
        try:
            record = self.get_credentials(access_key_id)
        except auth_errors.CredentialsNotFound:
            # Hash anyway, so an unknown key id takes as long as a wrong secret.
            keys.secret_matches(secret, self._decoy)
            raise refused from None
        if not keys.secret_matches(secret, record.secret_hash):
            raise refused
        if not self.user_exists(record.user_id):
            raise refused
        return record

    # ---- groups -----------------------------------------------------------------------

    def create_group(self, group_id: str, description: str = "") -> records.GroupRecord:
        record = records.GroupRecord(
            id=check_id("group", group_id), description=description, created_at=self._now()
        )
        self._insert(
            _key(GROUPS, group_id),
            record,
            auth_errors.GroupExists(
                f"group {group_id!r} already exists", metadata={"group": group_id}
            ),
        )
        return record

    def get_group(self, group_id: str) -> records.GroupRecord:
        return self._get(
            _key(GROUPS, check_id("group", group_id)),
            records.GroupRecord,
            auth_errors.GroupNotFound(f"no group {group_id!r}", metadata={"group": group_id}),
        )

    @skips_corrupt_records
    def list_groups(
        self, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[records.GroupRecord], str]:
        return self._page(records.GroupRecord, page_size, page_token, self._entities(GROUPS))

    def delete_group(self, group_id: str) -> None:
        """Memberships of the group, its attachments, then the group. Never touches a
        membership of another group (memberships found by their keys, values unread)."""
        self.get_group(group_id)
        for user_id in self._members_of(group_id):
            self._kv.delete(AUTH_PARTITION, _key(USER_GROUPS, user_id, group_id))
        self._delete_prefix(_key(GROUP_POLICIES, group_id) + b"/")
        self._kv.delete(AUTH_PARTITION, _key(GROUPS, group_id))

    def add_group_member(self, group_id: str, user_id: str) -> None:
        self.get_group(group_id)
        self.get_user(user_id)
        record = records.MembershipRecord(user_id=user_id, group_id=group_id)
        self._kv.set(
            AUTH_PARTITION, _key(USER_GROUPS, user_id, group_id), record.SerializeToString()
        )

    def remove_group_member(self, group_id: str, user_id: str) -> None:
        key = _key(USER_GROUPS, check_id("user", user_id), check_id("group", group_id))
        self._get(
            key,
            records.MembershipRecord,
            errors.NotFound(
                f"user {user_id!r} is not a member of group {group_id!r}",
                metadata={"user": user_id, "group": group_id},
            ),
        )
        self._kv.delete(AUTH_PARTITION, key)

    @skips_corrupt_records
    def list_user_groups(
        self, user_id: str, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[records.GroupRecord], str]:
        self.get_user(user_id)
        return self._page(
            records.GroupRecord,
            page_size,
            page_token,
            self._related(_key(USER_GROUPS, user_id) + b"/", GROUPS),
        )

    @skips_corrupt_records
    def list_group_members(
        self, group_id: str, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[records.UserRecord], str]:
        """Members by user id: a scan of every membership key, filtered (no reverse index)."""
        self.get_group(group_id)

        def candidates(after: str, chunk: int) -> Iterator[Candidate]:
            members = (u for u in self._members_of(group_id) if u > after)
            return self._fetched(members, USERS, chunk)

        return self._page(records.UserRecord, page_size, page_token, candidates)

    def _members_of(self, group_id: str) -> Iterator[str]:
        """The user ids of the group's memberships, by user id, from the keys alone."""
        for name in self._names(USER_GROUPS):
            user_id, _, group = name.partition("/")
            if group == group_id:
                yield user_id

    # ---- policies ---------------------------------------------------------------------

    def create_policy(self, policy_id: str, document: str) -> records.PolicyRecord:
        check_id("policy", policy_id)
        parse_policy(policy_id, document)
        record = records.PolicyRecord(id=policy_id, document=document, created_at=self._now())
        self._insert(
            _key(POLICIES, policy_id),
            record,
            auth_errors.PolicyExists(
                f"policy {policy_id!r} already exists", metadata={"policy": policy_id}
            ),
        )
        return record

    def get_policy(self, policy_id: str) -> records.PolicyRecord:
        return self._get(
            _key(POLICIES, check_id("policy", policy_id)),
            records.PolicyRecord,
            auth_errors.PolicyNotFound(f"no policy {policy_id!r}", metadata={"policy": policy_id}),
        )

    @skips_corrupt_records
    def list_policies(
        self, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[records.PolicyRecord], str]:
        return self._page(records.PolicyRecord, page_size, page_token, self._entities(POLICIES))

    def update_policy(self, policy_id: str, document: str) -> records.PolicyRecord:
        """Replace the document of an existing policy (validated as create_policy does); its
        id, creation time and attachments stay. The write is conditional on the record read:
        it never recreates a policy deleted meanwhile (PolicyNotFound when it is missing,
        PolicyChanged when another update or a delete came in between), never overwrites
        another update unseen."""
        key = _key(POLICIES, check_id("policy", policy_id))
        parse_policy(policy_id, document)
        try:
            got = self._kv.get(AUTH_PARTITION, key)
        except kv.KeyNotFound:
            raise auth_errors.PolicyNotFound(
                f"no policy {policy_id!r}", metadata={"policy": policy_id}
            ) from None
        current = _decode(kv.KeyValue(key, got.value), records.PolicyRecord)
        record = records.PolicyRecord(
            id=policy_id, created_at=current.created_at, document=document
        )
        try:
            self._kv.set_if(
                AUTH_PARTITION, key, record.SerializeToString(), kv.Equals(got.predicate)
            )
        except kv.PredicateFailed:
            raise auth_errors.PolicyChanged(
                f"policy {policy_id!r} was changed or deleted meanwhile; read it and retry",
                metadata={"policy": policy_id},
            ) from None
        return record

    def delete_policy(self, policy_id: str) -> None:
        """Every attachment of the policy (users' and groups'), then the policy."""
        self.get_policy(policy_id)
        for prefix in (USER_POLICIES, GROUP_POLICIES):
            for name in self._names(prefix):  # <principal>/<policy>: the key says it all
                if name.rpartition("/")[2] == policy_id:
                    self._kv.delete(AUTH_PARTITION, prefix + name.encode())
        self._kv.delete(AUTH_PARTITION, _key(POLICIES, policy_id))

    def attach_user_policy(self, user_id: str, policy_id: str) -> None:
        self.get_user(user_id)
        self.get_policy(policy_id)
        self._attach(USER_POLICIES, "user", user_id, policy_id)

    def attach_group_policy(self, group_id: str, policy_id: str) -> None:
        self.get_group(group_id)
        self.get_policy(policy_id)
        self._attach(GROUP_POLICIES, "group", group_id, policy_id)

    def detach_user_policy(self, user_id: str, policy_id: str) -> None:
        self._detach(
            USER_POLICIES, "user", check_id("user", user_id), check_id("policy", policy_id)
        )

    def detach_group_policy(self, group_id: str, policy_id: str) -> None:
        self._detach(
            GROUP_POLICIES, "group", check_id("group", group_id), check_id("policy", policy_id)
        )

    def attach_policy(self, policy_id: str, user_id: str = "", group_id: str = "") -> None:
        """attach_user_policy or attach_group_policy, whichever one principal is named;
        OnePrincipalRequired (nothing written) for neither or both."""
        if _one_principal("attach", policy_id, user_id, group_id) == "user":
            self.attach_user_policy(user_id, policy_id)
        else:
            self.attach_group_policy(group_id, policy_id)

    def detach_policy(self, policy_id: str, user_id: str = "", group_id: str = "") -> None:
        """detach_user_policy or detach_group_policy, as attach_policy."""
        if _one_principal("detach", policy_id, user_id, group_id) == "user":
            self.detach_user_policy(user_id, policy_id)
        else:
            self.detach_group_policy(group_id, policy_id)

    @skips_corrupt_records
    def list_user_policies(
        self, user_id: str, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[records.PolicyRecord], str]:
        self.get_user(user_id)
        return self._page(
            records.PolicyRecord,
            page_size,
            page_token,
            self._related(_key(USER_POLICIES, user_id) + b"/", POLICIES),
        )

    @skips_corrupt_records
    def list_group_policies(
        self, group_id: str, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[records.PolicyRecord], str]:
        self.get_group(group_id)
        return self._page(
            records.PolicyRecord,
            page_size,
            page_token,
            self._related(_key(GROUP_POLICIES, group_id) + b"/", POLICIES),
        )

    @skips_corrupt_records
    def list_effective_policies(
        self, user_id: str, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[records.PolicyRecord], str]:
        """effective_policy_records, paged (a corrupt policy skipped and counted: this is a
        listing, not an authorization decision)."""
        policy_ids = self._effective_policy_ids(user_id)

        def candidates(after: str, chunk: int) -> Iterator[Candidate]:
            return self._fetched((p for p in policy_ids if p > after), POLICIES, chunk)

        return self._page(records.PolicyRecord, page_size, page_token, candidates)

    def effective_policy_records(self, user_id: str) -> list[records.PolicyRecord]:
        """The user's own attachments and its groups' attachments, each policy once, by id.
        UserNotFound when the user does not exist. A corrupt policy record among them is
        DATA_LOSS / CORRUPT_RECORD (never skipped here: skipping a Deny would widen what
        the user may do), for this user's decisions only."""
        return self._batch(POLICIES, self._effective_policy_ids(user_id), records.PolicyRecord)

    def _effective_policy_ids(self, user_id: str) -> list[str]:
        self.get_user(user_id)
        policy_ids = set(self._names(_key(USER_POLICIES, user_id) + b"/"))
        for group_id in self._names(_key(USER_GROUPS, user_id) + b"/"):
            policy_ids.update(self._names(_key(GROUP_POLICIES, group_id) + b"/"))
        return sorted(policy_ids)

    def effective_policies(self, user_id: str) -> list[Policy]:
        return [parse_policy(r.id, r.document) for r in self.effective_policy_records(user_id)]

    def _attach(self, prefix: bytes, kind: str, principal: str, policy_id: str) -> None:
        record = records.AttachmentRecord(
            principal_kind=kind, principal_id=principal, policy_id=policy_id
        )
        self._kv.set(AUTH_PARTITION, _key(prefix, principal, policy_id), record.SerializeToString())

    def _detach(self, prefix: bytes, kind: str, principal: str, policy_id: str) -> None:
        key = _key(prefix, principal, policy_id)
        self._get(
            key,
            records.AttachmentRecord,
            errors.NotFound(
                f"policy {policy_id!r} is not attached to {kind} {principal!r}",
                metadata={kind: principal, "policy": policy_id},
            ),
        )
        self._kv.delete(AUTH_PARTITION, key)

    # ---- KV helpers -------------------------------------------------------------------

    def _now(self) -> Timestamp:
        stamp = Timestamp()
        stamp.FromNanoseconds(int(self._clock() * 1e9))
        return stamp

    def _insert(self, key: bytes, record: Message, exists: Exception) -> None:
        try:
            self._kv.set_if(AUTH_PARTITION, key, record.SerializeToString(), kv.ABSENT)
        except kv.PredicateFailed:
            raise exists from None

    def _get(self, key: bytes, cls: type[R], missing: Exception) -> R:
        try:
            got = self._kv.get(AUTH_PARTITION, key)
        except kv.KeyNotFound:
            raise missing from None
        return _decode(kv.KeyValue(key, got.value), cls)

    def _exists(self, key: bytes) -> bool:
        try:
            self._kv.get(AUTH_PARTITION, key)
        except kv.KeyNotFound:
            return False
        return True

    def _batch(self, prefix: bytes, ids: list[str], cls: type[R]) -> list[R]:
        """The records of `ids` in order, skipping any that vanished meanwhile (a
        relationship whose entity is being deleted is never shown as a dangling item)."""
        if not ids:
            return []
        item_keys = [_key(prefix, i) for i in ids]
        found = self._kv.batch_get([(AUTH_PARTITION, k) for k in item_keys])
        return [
            _decode(kv.KeyValue(k, got.value), cls)
            for k, got in zip(item_keys, found, strict=True)
            if got is not None
        ]

    def _scan(
        self, prefix: bytes, after: str = "", limit: int | None = None
    ) -> Iterator[kv.KeyValue]:
        start = prefix + after.encode() + b"\x00" if after else prefix
        batch = min(limit, kv.DEFAULT_SCAN_BATCH_SIZE) if limit else kv.DEFAULT_SCAN_BATCH_SIZE
        iterator = self._kv.scan(AUTH_PARTITION, start, _prefix_end(prefix), batch)
        try:
            yield from iterator
        finally:
            iterator.close()

    def _names(self, prefix: bytes) -> Iterator[str]:
        """The keys under `prefix`, without it (ids joined by "/"); values are never read."""
        for item in self._scan(prefix):
            yield item.key[len(prefix) :].decode()

    def _delete_prefix(self, prefix: bytes) -> None:
        item_keys = [item.key for item in self._scan(prefix)]
        if item_keys:
            self._kv.batch_delete([(AUTH_PARTITION, k) for k in item_keys])

    def _page(
        self,
        cls: type[R],
        page_size: int,
        page_token: str,
        candidates: Callable[[str, int], Iterator[Candidate]],
    ) -> tuple[list[R], str]:
        """One listing page: the records of `candidates(after, chunk)` (in name order) that
        fit the page's budget, by count and by encoded bytes (quarry.paging). A corrupt one is
        skipped and counted (the caller runs in a listing scope), a vanished one left out.
        The token continues after the last candidate this page consumed, so a skipped record
        is counted by one page only; records are decoded only up to the cut."""
        budget = PageBudget.for_response(
            _page_size(page_size), self._max_response_bytes, size_of=encoded_size
        )
        after = decode_page_token(page_token).get("after", "")
        found: list[R] = []
        consumed = after
        for name, key, value in candidates(after, budget.max_items + 1):
            if value is not None:
                record = decode_or_skip(cls, AUTH_PARTITION, key, value, _check_record)
                if record is not None:
                    if not budget.admit(record):
                        return found, encode_page_token(after=consumed)
                    found.append(record)
            consumed = name
        return found, ""

    def _entities(self, prefix: bytes) -> Callable[[str, int], Iterator[Candidate]]:
        """Candidates of an entity listing: the records under `prefix`, named by id."""

        def candidates(after: str, chunk: int) -> Iterator[Candidate]:
            for item in self._scan(prefix, after, chunk):
                yield item.key[len(prefix) :].decode(), item.key, item.value

        return candidates

    def _related(self, prefix: bytes, target: bytes) -> Callable[[str, int], Iterator[Candidate]]:
        """Candidates of a relationship listing: the entities under `target` named by the
        last id of each key under `prefix` (the relationship's value is never read)."""

        def candidates(after: str, chunk: int) -> Iterator[Candidate]:
            names = (item.key[len(prefix) :].decode() for item in self._scan(prefix, after, chunk))
            return self._fetched(names, target, chunk)

        return candidates

    def _fetched(self, ids: Iterator[str], target: bytes, chunk: int) -> Iterator[Candidate]:
        """(id, key, stored bytes or None) of each id's record under `target`, read with one
        batch_get per `chunk` ids, lazily."""
        batch: list[str] = []
        for record_id in ids:
            batch.append(record_id)
            if len(batch) == chunk:
                yield from self._fetch(batch, target)
                batch = []
        if batch:
            yield from self._fetch(batch, target)

    def _fetch(self, ids: list[str], target: bytes) -> Iterator[Candidate]:
        item_keys = [_key(target, i) for i in ids]
        found = self._kv.batch_get([(AUTH_PARTITION, k) for k in item_keys])
        for record_id, key, got in zip(ids, item_keys, found, strict=True):
            yield record_id, key, None if got is None else got.value


def _one_principal(verb: str, policy_id: str, user_id: str, group_id: str) -> str:
    """ "user" or "group": the kind of the one principal an attachment request names."""
    if bool(user_id) == bool(group_id):
        raise auth_errors.OnePrincipalRequired(
            f"{verb} policy {policy_id!r}: name exactly one of a user and a group, not "
            f"{'both' if user_id else 'neither'}",
            metadata={"policy": policy_id, "user": user_id, "group": group_id},
        )
    return "user" if user_id else "group"


def _page_size(page_size: int) -> int:
    if page_size < 0:
        raise errors.InvalidArgument(f"page_size must be >= 0, got {page_size}")
    return min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def _check_record(record: Message, key: bytes) -> str | None:
    """What a stored IAM entity must hold: the id its key names (protobuf parses many
    byte strings without complaint, so garbage could otherwise pass as an empty record)."""
    named = key.rpartition(b"/")[2].decode("utf-8", "replace")
    if isinstance(record, records.CredentialRecord):
        held = record.access_key_id
    elif isinstance(record, (records.UserRecord, records.GroupRecord, records.PolicyRecord)):
        held = record.id
    else:
        return None
    return None if held == named else f"it holds id {held!r}, its key names {named!r}"


def _decode(item: kv.KeyValue, cls: type[R]) -> R:
    """The record at `item` (DATA_LOSS / CORRUPT_RECORD when it cannot be read)."""
    return decode_record(cls, AUTH_PARTITION, item.key, item.value, _check_record)
