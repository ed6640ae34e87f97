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

Lists are prefix scans, paged by id (page tokens as every other listing). Creation is
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

import re
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from google.protobuf.message import DecodeError, Message
from google.protobuf.timestamp_pb2 import Timestamp

from quarry import errors
from quarry.auth import errors as auth_errors
from quarry.auth import keys
from quarry.auth.policy import Policy, parse_policy
from quarry.graveler.iterators import decode_page_token, encode_page_token
from quarry.graveler.records import CorruptRecord
from quarry.kv import store as kv
from quarry.kv.partitions import AUTH_PARTITION
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

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
# Letters, digits and _.@+=,- (lakeFS-like ids, emails work): never "/" (key separator),
# "*" or "?" (policy wildcards), "$" "{" "}" (the ${user} variable).
_ID = re.compile(r"^[A-Za-z0-9_.@+=,-]{1,128}$")
_NEW_KEY_ATTEMPTS = 5

R = TypeVar("R", bound=Message)


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
        sealer: SecretSealer | None = None,
    ):
        """`sealer`: when given, new credentials also keep their secret sealed with it, for
        AWS Signature V4 (quarry.auth.sigv4_secrets)."""
        self._kv = store
        self._sealer = sealer
        self._clock = clock
        self._hash_cost = hash_cost
        self._decoy = keys.hash_secret(keys.new_secret(), n=hash_cost)

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

    def list_users(
        self, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[records.UserRecord], str]:
        return self._page(USERS, records.UserRecord, page_size, page_token)

    def delete_user(self, user_id: str) -> None:
        """Credentials (each: entity, then link), memberships, attachments, then the user.
        Never deletes anything of another user."""
        self.get_user(user_id)
        prefix = _key(USER_CREDENTIALS, user_id) + b"/"
        for link in self._scan_values(prefix, records.CredentialLink):
            self._kv.delete(AUTH_PARTITION, _key(CREDENTIALS, link.access_key_id))
            self._kv.delete(AUTH_PARTITION, _key(USER_CREDENTIALS, user_id, link.access_key_id))
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
        record = self.get_credentials(access_key_id)
        if record.user_id != user_id:
            raise auth_errors.CredentialsNotFound(
                f"user {user_id!r} has no credentials {access_key_id!r}",
                metadata={"user": user_id, "access_key_id": access_key_id},
            )
        return record

    def list_credentials(
        self, user_id: str, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[records.CredentialRecord], str]:
        self.get_user(user_id)
        links, token = self._page(
            _key(USER_CREDENTIALS, user_id) + b"/", records.CredentialLink, page_size, page_token
        )
        found = self._batch(
            CREDENTIALS, [link.access_key_id for link in links], records.CredentialRecord
        )
        return found, token

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

    def list_groups(
        self, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[records.GroupRecord], str]:
        return self._page(GROUPS, records.GroupRecord, page_size, page_token)

    def delete_group(self, group_id: str) -> None:
        """Memberships of the group, its attachments, then the group."""
        self.get_group(group_id)
        for membership in self._memberships_of(group_id):
            self._kv.delete(AUTH_PARTITION, _key(USER_GROUPS, membership.user_id, group_id))
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

    def list_user_groups(
        self, user_id: str, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[records.GroupRecord], str]:
        self.get_user(user_id)
        memberships, token = self._page(
            _key(USER_GROUPS, user_id) + b"/", records.MembershipRecord, page_size, page_token
        )
        return self._batch(GROUPS, [m.group_id for m in memberships], records.GroupRecord), token

    def list_group_members(
        self, group_id: str, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[records.UserRecord], str]:
        """Members by user id: a scan of every membership, filtered (no reverse index)."""
        self.get_group(group_id)
        size = _page_size(page_size)
        after = decode_page_token(page_token).get("after", "")
        member_ids = [m.user_id for m in self._memberships_of(group_id) if m.user_id > after]
        page = member_ids[:size]
        token = encode_page_token(after=page[-1]) if len(member_ids) > size else ""
        return self._batch(USERS, page, records.UserRecord), token

    def _memberships_of(self, group_id: str) -> Iterator[records.MembershipRecord]:
        for membership in self._scan_values(USER_GROUPS, records.MembershipRecord):
            if membership.group_id == group_id:
                yield membership

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

    def list_policies(
        self, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[records.PolicyRecord], str]:
        return self._page(POLICIES, records.PolicyRecord, page_size, page_token)

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
            for item in self._scan(prefix):
                attachment = _decode(item, records.AttachmentRecord)
                if attachment.policy_id == policy_id:
                    self._kv.delete(AUTH_PARTITION, item.key)
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

    def list_user_policies(
        self, user_id: str, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[records.PolicyRecord], str]:
        self.get_user(user_id)
        return self._attached(_key(USER_POLICIES, user_id) + b"/", page_size, page_token)

    def list_group_policies(
        self, group_id: str, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[records.PolicyRecord], str]:
        self.get_group(group_id)
        return self._attached(_key(GROUP_POLICIES, group_id) + b"/", page_size, page_token)

    def effective_policy_records(self, user_id: str) -> list[records.PolicyRecord]:
        """The user's own attachments and its groups' attachments, each policy once, by id.
        UserNotFound when the user does not exist."""
        self.get_user(user_id)
        policy_ids = {
            a.policy_id
            for a in self._scan_values(
                _key(USER_POLICIES, user_id) + b"/", records.AttachmentRecord
            )
        }
        for membership in self._scan_values(
            _key(USER_GROUPS, user_id) + b"/", records.MembershipRecord
        ):
            policy_ids.update(
                a.policy_id
                for a in self._scan_values(
                    _key(GROUP_POLICIES, membership.group_id) + b"/", records.AttachmentRecord
                )
            )
        return self._batch(POLICIES, sorted(policy_ids), records.PolicyRecord)

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

    def _attached(
        self, prefix: bytes, page_size: int, page_token: str
    ) -> tuple[list[records.PolicyRecord], str]:
        attachments, token = self._page(prefix, records.AttachmentRecord, page_size, page_token)
        return self._batch(
            POLICIES, [a.policy_id for a in attachments], records.PolicyRecord
        ), token

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

    def _scan_values(self, prefix: bytes, cls: type[R]) -> Iterator[R]:
        for item in self._scan(prefix):
            yield _decode(item, cls)

    def _delete_prefix(self, prefix: bytes) -> None:
        item_keys = [item.key for item in self._scan(prefix)]
        if item_keys:
            self._kv.batch_delete([(AUTH_PARTITION, k) for k in item_keys])

    def _page(
        self, prefix: bytes, cls: type[R], page_size: int, page_token: str
    ) -> tuple[list[R], str]:
        size = _page_size(page_size)
        after = decode_page_token(page_token).get("after", "")
        found: list[R] = []
        last = ""
        for item in self._scan(prefix, after, size + 1):
            if len(found) == size:
                return found, encode_page_token(after=last)
            found.append(_decode(item, cls))
            last = item.key[len(prefix) :].decode()
        return found, ""


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


def _decode(item: kv.KeyValue, cls: type[R]) -> R:
    record = cls()
    try:
        record.ParseFromString(item.value)
    except DecodeError:
        raise CorruptRecord(
            f"stored {cls.__name__} at {item.key!r} cannot be decoded",
            partition=AUTH_PARTITION,
            key=item.key,
            record=cls.__name__,
        ) from None
    return record
