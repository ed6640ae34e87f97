"""The IAM store on the memory KV: the seed's modeling, paging, creation races, pruning order
(with a crash injected at every delete step), and secrets never stored in plaintext."""

from __future__ import annotations

import pytest

from quarry import errors
from quarry.auth import errors as auth_errors
from quarry.auth import keys
from quarry.auth.policy import document
from quarry.auth.store import IamStore
from quarry.kv import store as kv
from quarry.kv.memory import MemoryStore
from quarry.kv.partitions import AUTH_PARTITION
from quarry.storage.v1 import auth_records_pb2 as records

FAST_HASH = 2**10  # scrypt cost for tests; the default is exercised in test_secret_hash
ALLOW_ALL = document({"Effect": "Allow", "Action": "fs:*", "Resource": "*"})


@pytest.fixture
def backend():
    return MemoryStore()


@pytest.fixture
def iam(backend):
    return IamStore(backend, hash_cost=FAST_HASH)


def all_keys(backend) -> list[bytes]:
    return [item.key for item in backend.scan(AUTH_PARTITION)]


def populate(iam: IamStore) -> None:
    for user in ("alice", "bob", "carol"):
        iam.create_user(user)
        iam.create_credentials(user)
    for group in ("eng", "ops"):
        iam.create_group(group)
    for policy in ("p1", "p2"):
        iam.create_policy(policy, ALLOW_ALL)
    iam.add_group_member("eng", "alice")
    iam.add_group_member("eng", "bob")
    iam.add_group_member("ops", "bob")
    iam.attach_user_policy("bob", "p1")
    iam.attach_user_policy("alice", "p2")
    iam.attach_group_policy("eng", "p1")
    iam.attach_group_policy("ops", "p2")


def test_layout_is_the_seeds_one_item_per_entity_and_auxiliary_keys(iam, backend):
    populate(iam)
    found = {key.decode() for key in all_keys(backend)}
    akid = iam.list_credentials("bob")[0][0].access_key_id
    expected_present = {
        "iam/users/bob",
        "iam/groups/eng",
        "iam/policies/p1",
        f"iam/credentials/{akid}",
        f"iam/user_credentials/bob/{akid}",
        "iam/user_groups/bob/eng",
        "iam/user_groups/bob/ops",
        "iam/user_policies/bob/p1",
        "iam/group_policies/eng/p1",
    }
    assert expected_present <= found
    # No reverse index (the seed: a scan and a filter is enough for a small keyspace).
    assert not any(k.startswith("iam/group_users/") for k in found)
    stored = records.MembershipRecord.FromString(
        backend.get(AUTH_PARTITION, b"iam/user_groups/bob/eng").value
    )
    assert (stored.user_id, stored.group_id) == ("bob", "eng")


def test_creation_is_if_absent(iam):
    iam.create_user("alice")
    iam.create_group("eng")
    iam.create_policy("p", ALLOW_ALL)
    with pytest.raises(auth_errors.UserExists):
        iam.create_user("alice", email="other@example.com")
    with pytest.raises(auth_errors.GroupExists):
        iam.create_group("eng")
    with pytest.raises(auth_errors.PolicyExists):
        iam.create_policy("p", ALLOW_ALL)
    assert iam.get_user("alice").email == ""  # the first one stays


@pytest.mark.parametrize("bad", ["", "a/b", "x*", "q?", "${user}", "é", "a" * 129])
def test_ids_are_checked(iam, bad):
    with pytest.raises(auth_errors.InvalidIamId) as caught:
        iam.create_user(bad)
    assert caught.value.code.name == "INVALID_ARGUMENT"


def test_relationships_need_existing_entities(iam):
    iam.create_user("alice")
    iam.create_group("eng")
    with pytest.raises(auth_errors.GroupNotFound):
        iam.add_group_member("nope", "alice")
    with pytest.raises(auth_errors.UserNotFound):
        iam.add_group_member("eng", "nobody")
    with pytest.raises(auth_errors.PolicyNotFound):
        iam.attach_user_policy("alice", "nope")
    with pytest.raises(auth_errors.UserNotFound):
        iam.create_credentials("nobody")
    with pytest.raises(errors.NotFound):
        iam.remove_group_member("eng", "alice")
    with pytest.raises(errors.NotFound):
        iam.detach_user_policy("alice", "nope")


def test_lists_page_by_id(iam):
    ids = [f"user{i:02d}" for i in range(23)]
    for user in reversed(ids):
        iam.create_user(user)
    seen, token, pages = [], "", 0
    while True:
        page, token = iam.list_users(page_size=5, page_token=token)
        seen.extend(u.id for u in page)
        pages += 1
        assert len(page) <= 5
        if not token:
            break
    assert seen == ids
    assert pages == 5
    # Exactly a full last page: no empty extra page.
    iam.create_user("user23")
    page, token = iam.list_users(page_size=12, page_token=iam.list_users(page_size=12)[1])
    assert len(page) == 12 and token == ""


def test_relationship_lists_page_and_resolve_entities(iam):
    populate(iam)
    members, token = iam.list_group_members("eng", page_size=1)
    assert [m.id for m in members] == ["alice"] and token
    members, token = iam.list_group_members("eng", page_size=1, page_token=token)
    assert [m.id for m in members] == ["bob"] and token == ""
    assert [g.id for g in iam.list_user_groups("bob")[0]] == ["eng", "ops"]
    assert [p.id for p in iam.list_user_policies("bob")[0]] == ["p1"]
    assert [p.id for p in iam.list_group_policies("ops")[0]] == ["p2"]
    assert [p.id for p in iam.effective_policy_records("bob")] == ["p1", "p2"]
    assert [p.id for p in iam.effective_policy_records("alice")] == ["p1", "p2"]
    assert iam.effective_policy_records("carol") == []


def test_bad_page_token_is_invalid_argument(iam):
    with pytest.raises(errors.InvalidArgument):
        iam.list_users(page_token="not-a-token!")


def test_delete_prunes_every_relationship(iam, backend):
    populate(iam)
    iam.delete_user("bob")
    iam.delete_group("eng")
    iam.delete_policy("p2")
    remaining = {k.decode() for k in all_keys(backend)}
    assert not any("bob" in k for k in remaining)
    assert not any("/eng" in k for k in remaining)
    assert not any(k.endswith("/p2") for k in remaining)
    assert [p.id for p in iam.effective_policy_records("alice")] == []
    # Alice keeps her own credential and nothing of hers was touched.
    assert len(iam.list_credentials("alice")[0]) == 1


class Crash(Exception):
    pass


class CrashingStore(kv.Store):
    """Deletes fail from the `crash_at`-th one on: a process dying in the middle of a
    multi-key delete."""

    def __init__(self, inner: kv.Store, crash_at: int):
        self.inner, self.crash_at, self.deletes = inner, crash_at, 0

    def _tick(self, n: int = 1) -> None:
        if self.deletes + n > self.crash_at:
            raise Crash
        self.deletes += n

    def delete(self, partition, key):
        self._tick()
        self.inner.delete(partition, key)

    def delete_if(self, partition, key, predicate):
        self._tick()
        self.inner.delete_if(partition, key, predicate)

    def batch_delete(self, items):
        # A batch is not atomic: apply what fits before the crash, then crash.
        allowed = max(0, self.crash_at - self.deletes)
        self.inner.batch_delete(items[:allowed])
        self._tick(len(items))

    def get(self, partition, key):
        return self.inner.get(partition, key)

    def set(self, partition, key, value):
        self.inner.set(partition, key, value)

    def set_if(self, partition, key, value, predicate):
        self.inner.set_if(partition, key, value, predicate)

    def scan(self, partition, start=b"", end=None, batch_size=kv.DEFAULT_SCAN_BATCH_SIZE):
        return self.inner.scan(partition, start, end, batch_size)

    def batch_get(self, items):
        return self.inner.batch_get(items)

    def batch_set(self, items):
        self.inner.batch_set(items)


def dangling(backend) -> list[str]:
    """Relationships naming an entity that does not exist, and usable credentials that are
    not listed under their user: what a crash must never leave behind."""
    keys_ = {k.decode() for k in all_keys(backend)}
    problems = []

    def need(key: str, because: str) -> None:
        if key not in keys_:
            problems.append(f"{because} but {key} is missing")

    for key in keys_:
        parts = key.split("/")
        if parts[1] == "user_groups":
            need(f"iam/users/{parts[2]}", key)
            need(f"iam/groups/{parts[3]}", key)
        elif parts[1] == "user_policies":
            need(f"iam/users/{parts[2]}", key)
            need(f"iam/policies/{parts[3]}", key)
        elif parts[1] == "group_policies":
            need(f"iam/groups/{parts[2]}", key)
            need(f"iam/policies/{parts[3]}", key)
        elif parts[1] == "user_credentials":
            need(f"iam/users/{parts[2]}", key)
        elif parts[1] == "credentials":
            record = records.CredentialRecord.FromString(
                backend.get(AUTH_PARTITION, key.encode()).value
            )
            need(f"iam/users/{record.user_id}", key)
            need(f"iam/user_credentials/{record.user_id}/{parts[2]}", key)
    return problems


def link_of(store, user: str) -> str:
    prefix = f"iam/user_credentials/{user}/".encode()
    return next(i.key for i in store.scan(AUTH_PARTITION, prefix) if i.key.startswith(prefix))[
        len(prefix) :
    ].decode()


@pytest.mark.parametrize("entity", ["user", "group", "policy", "credentials"])
def test_a_crash_at_any_step_of_a_delete_leaves_nothing_dangling(entity):
    """Crash after the 0th, 1st, 2nd, ... delete: whatever was done, no relationship names
    a missing entity; a retried delete then finishes the job."""
    delete = {
        "user": lambda s: s.delete_user("bob"),
        "group": lambda s: s.delete_group("eng"),
        "policy": lambda s: s.delete_policy("p1"),
        "credentials": lambda s: s.delete_credentials("bob", link_of(s._kv, "bob")),
    }[entity]
    crash_at, crashed_somewhere = 0, False
    while True:
        backend = MemoryStore()
        populate(IamStore(backend, hash_cost=FAST_HASH))
        crashing = IamStore(CrashingStore(backend, crash_at), hash_cost=FAST_HASH)
        try:
            delete(crashing)
        except Crash:
            crashed_somewhere = True
            assert dangling(backend) == [], f"after a crash at delete #{crash_at}"
            delete(IamStore(backend, hash_cost=FAST_HASH))  # the retry completes
            assert dangling(backend) == []
            crash_at += 1
            continue
        break
    assert crashed_somewhere and crash_at >= 2


def test_a_crash_while_creating_credentials_leaves_no_invisible_key():
    """The link is written before the credential: a crash in between leaves a link to
    nothing (harmless, not listed), never a usable key missing from the user's list."""

    class CrashOnCredential(CrashingStore):
        def set_if(self, partition, key, value, predicate):
            if key.startswith(b"iam/credentials/"):
                raise Crash
            self.inner.set_if(partition, key, value, predicate)

    backend = MemoryStore()
    IamStore(backend, hash_cost=FAST_HASH).create_user("bob")
    with pytest.raises(Crash):
        IamStore(CrashOnCredential(backend, 10**6), hash_cost=FAST_HASH).create_credentials("bob")
    assert dangling(backend) == []
    assert IamStore(backend).list_credentials("bob")[0] == []


def test_secrets_are_never_stored_in_plaintext(iam, backend):
    secrets_ = [
        iam.create_credentials(user)[1]
        for user in (iam.create_user(u).id for u in ("alice", "bob"))
    ]
    for secret in secrets_:
        assert len(secret) == keys.SECRET_LENGTH
        for item in backend.scan(AUTH_PARTITION):
            for blob in (item.key, item.value):
                assert secret.encode() not in blob
                assert secret[:12].encode() not in blob  # not even a fragment


def test_authenticate(iam):
    iam.create_user("alice")
    record, secret = iam.create_credentials("alice")
    assert record.access_key_id.startswith("AKIAQ") and len(record.access_key_id) == 20
    assert iam.authenticate(record.access_key_id, secret).user_id == "alice"
    for key_id, guess in [
        (record.access_key_id, secret[:-1] + ("y" if secret.endswith("x") else "x")),
        (record.access_key_id, ""),
        ("AKIAQNOSUCHKEY000000", secret),
        ("../../etc", secret),
    ]:
        with pytest.raises(auth_errors.InvalidCredentials):
            iam.authenticate(key_id, guess)
    iam.delete_credentials("alice", record.access_key_id)
    with pytest.raises(auth_errors.InvalidCredentials):
        iam.authenticate(record.access_key_id, secret)


def test_an_unknown_key_costs_the_same_scrypt_as_a_wrong_secret(backend, monkeypatch):
    """Safety rule: whether an access key id exists must not show in how long a login takes.
    An unknown key id is checked against a decoy with the stored hashes' cost parameters
    (one scrypt, as a wrong secret costs); making the store computes no scrypt."""
    calls: list[tuple[int, int, int]] = []
    real = keys._scrypt

    def counted(secret, salt, n, r, p):
        calls.append((n, r, p))
        return real(secret, salt, n, r, p)

    monkeypatch.setattr(keys, "_scrypt", counted)
    iam = IamStore(backend, hash_cost=FAST_HASH)
    assert calls == []
    iam.create_user("alice")
    record, secret = iam.create_credentials("alice")
    calls.clear()
    with pytest.raises(auth_errors.InvalidCredentials):
        iam.authenticate(record.access_key_id, "wrong-" + secret)
    wrong_secret = list(calls)
    calls.clear()
    with pytest.raises(auth_errors.InvalidCredentials):
        iam.authenticate("AKIAQNOSUCHKEY000000", secret)
    assert calls == wrong_secret == [(FAST_HASH, keys.SCRYPT_R, keys.SCRYPT_P)]


def test_a_credential_outliving_its_user_does_not_log_in(iam, backend):
    """A credential created while its user was being deleted (a race the store cannot
    exclude without transactions) must not log in as a user that no longer exists."""
    iam.create_user("ghost")
    record, secret = iam.create_credentials("ghost")
    backend.delete(AUTH_PARTITION, b"iam/users/ghost")
    with pytest.raises(auth_errors.InvalidCredentials):
        iam.authenticate(record.access_key_id, secret)


def test_credentials_of_another_user_are_not_found_or_deleted(iam):
    iam.create_user("alice")
    iam.create_user("mallory")
    record, _ = iam.create_credentials("alice")
    with pytest.raises(auth_errors.CredentialsNotFound):
        iam.delete_credentials("mallory", record.access_key_id)
    assert iam.credentials_exist(record.access_key_id)


def test_another_users_key_and_no_key_are_the_same_not_found(iam):
    """A user who may manage only their own credentials must not learn which access key
    ids exist (the message and metadata differed)."""
    iam.create_user("alice")
    iam.create_user("mallory")
    record, _ = iam.create_credentials("alice")
    answers = []
    for key_id in (record.access_key_id, "AKIAQNOSUCHKEY000001"):
        for call in (iam.get_user_credentials, iam.delete_credentials):
            with pytest.raises(auth_errors.CredentialsNotFound) as missing:
                call("mallory", key_id)
            answers.append((missing.value.message.replace(key_id, "K"), missing.value.metadata))
    for message, metadata in answers:
        assert message == answers[0][0] and set(metadata) == set(answers[0][1])


def test_secret_hash_is_salted_scrypt():
    first, second = keys.hash_secret("s3cret"), keys.hash_secret("s3cret")
    assert first.algorithm == "scrypt" and first.n == keys.SCRYPT_N
    assert first.salt != second.salt and first.digest != second.digest
    assert keys.secret_matches("s3cret", first) and keys.secret_matches("s3cret", second)
    assert not keys.secret_matches("s3cres", first)
    assert not keys.secret_matches("s3cret", records.SecretHash())


def test_corrupt_record_is_data_loss(iam, backend):
    backend.set(AUTH_PARTITION, b"iam/users/broken", b"\xff\xff\xff")
    with pytest.raises(errors.DataLoss):
        iam.get_user("broken")
