"""The authorizer: built-in groups mean what lakeFS's do, the cache serves repeated checks
without KV reads, and a revoked credential or deleted user stops working within the cache
lifetime."""

from __future__ import annotations

import pytest

from quarry.auth import authorizer as authorizer_module
from quarry.auth import errors as auth_errors
from quarry.auth.authorizer import Authorizer
from quarry.auth.bootstrap import (
    ADMINS,
    BUILTIN_GROUPS,
    DEVELOPERS,
    SUPER_USERS,
    VIEWERS,
    ensure_builtins,
    setup_admin,
)
from quarry.auth.policy import (
    branch_arn,
    document,
    kv_partition_arn,
    object_arn,
    repository_arn,
    user_arn,
)
from quarry.auth.store import IamStore
from quarry.auth.tokens import Principal
from quarry.kv.memory import MemoryStore
from support.counting import CountingStore

FAST_HASH = 2**10


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def counted():
    return CountingStore(MemoryStore())


@pytest.fixture
def iam(counted):
    store = IamStore(counted, hash_cost=FAST_HASH)
    ensure_builtins(store)
    return store


def user(iam, name, group=None) -> Principal:
    iam.create_user(name)
    if group:
        iam.add_group_member(group, name)
    return Principal("user", name)


def allowed(authorizer, principal, action, *resources) -> bool:
    try:
        authorizer.authorize(principal, action, resources)
    except auth_errors.PermissionDenied:
        return False
    return True


def test_builtin_groups_mean_what_lakefs_groups_mean(iam):
    authorizer = Authorizer(iam, cache_seconds=0)
    admin, superuser, developer, viewer, nobody = (
        user(iam, "admin", ADMINS),
        user(iam, "su", SUPER_USERS),
        user(iam, "dev", DEVELOPERS),
        user(iam, "viewer", VIEWERS),
        user(iam, "nobody"),
    )
    repo, obj, main = repository_arn("r"), object_arn("r", "a/b"), branch_arn("r", "main")
    cases = [
        # action, resource, admin, superuser, developer, viewer
        ("fs:ReadObject", obj, True, True, True, True),
        ("fs:ListObjects", repo, True, True, True, True),
        ("fs:WriteObject", obj, True, True, True, False),
        ("fs:CreateCommit", main, True, True, True, False),
        ("fs:CreateRepository", repo, True, True, False, False),
        ("fs:DeleteRepository", repo, True, True, False, False),
        ("fs:ImportFromStorage", obj, True, True, False, False),
        ("fs:SetBranchProtectionRules", repo, True, True, False, False),
        ("auth:CreateUser", user_arn("x"), True, False, False, False),
        ("auth:ListUsers", "*", True, False, False, False),
        ("retention:SetGarbageCollectionRules", repo, True, False, False, False),
        ("retention:GetGarbageCollectionRules", repo, True, True, True, False),
        ("kv:Read", kv_partition_arn(b"quarry"), True, False, False, False),
    ]
    for action, resource, *expected in cases:
        got = [
            allowed(authorizer, p, action, resource) for p in (admin, superuser, developer, viewer)
        ]
        assert got == expected, action
        assert not allowed(authorizer, nobody, action, resource)
    # Everyone but nobody manages their OWN credentials, and only their own.
    for principal in (superuser, developer, viewer):
        assert allowed(authorizer, principal, "auth:CreateCredentials", user_arn(principal.id))
        assert not allowed(authorizer, principal, "auth:CreateCredentials", user_arn("admin"))


def test_permission_denied_names_action_and_resource(iam):
    authorizer = Authorizer(iam, cache_seconds=0)
    viewer = user(iam, "viewer", VIEWERS)
    with pytest.raises(auth_errors.PermissionDenied) as caught:
        authorizer.authorize(viewer, "fs:WriteObject", [object_arn("r", "x")])
    assert caught.value.code.name == "PERMISSION_DENIED"
    assert "fs:WriteObject" in caught.value.message
    assert object_arn("r", "x") in caught.value.message
    assert caught.value.metadata["action"] == "fs:WriteObject"
    assert caught.value.metadata["decision"] == "no_grant"


def test_explicit_deny_overrides_a_group_grant(iam):
    authorizer = Authorizer(iam, cache_seconds=0)
    dev = user(iam, "dev", DEVELOPERS)
    iam.create_policy(
        "NoProd",
        document(
            {
                "Effect": "Deny",
                "Action": "fs:WriteObject",
                "Resource": "arn:quarry:fs:::repository/prod*",
            }
        ),
    )
    iam.attach_user_policy("dev", "NoProd")
    assert not allowed(authorizer, dev, "fs:WriteObject", object_arn("prod", "a"))
    assert allowed(authorizer, dev, "fs:WriteObject", object_arn("staging", "a"))


def test_services_pass_and_unknown_users_do_not(iam):
    authorizer = Authorizer(iam, cache_seconds=0)
    authorizer.authorize(Principal("service", "committer"), "auth:DeleteUser", ["*"])
    with pytest.raises(auth_errors.PrincipalUnknown):
        authorizer.authorize(Principal("user", "ghost"), "fs:ReadObject", ["*"])


def test_allowed_everywhere_follows_the_users_policies_and_refuses_unknown_users(iam):
    authorizer = Authorizer(iam, cache_seconds=0)
    admin = user(iam, "root", ADMINS)
    dev = user(iam, "dev2", DEVELOPERS)
    assert authorizer.allows_everywhere(admin, "fs:ImportFromStorage")
    assert not authorizer.allows_everywhere(dev, "fs:ImportFromStorage")  # no grant at all
    iam.create_policy(
        "NoImportIntoProd",
        document(
            {
                "Effect": "Deny",
                "Action": "fs:ImportFromStorage",
                "Resource": "arn:quarry:fs:::repository/prod/*",
            }
        ),
    )
    iam.attach_user_policy("root", "NoImportIntoProd")
    assert not authorizer.allows_everywhere(admin, "fs:ImportFromStorage")
    assert authorizer.allows_everywhere(Principal("service", "committer"), "fs:ImportFromStorage")
    with pytest.raises(auth_errors.PrincipalUnknown):
        authorizer.allows_everywhere(Principal("user", "ghost"), "fs:ImportFromStorage")


def test_the_cache_serves_repeated_checks_without_kv_reads(iam, counted):
    clock = Clock()
    authorizer = Authorizer(iam, cache_seconds=5, clock=clock)
    dev = user(iam, "dev", DEVELOPERS)
    record, _ = iam.create_credentials("dev")
    principal = Principal("user", "dev", record.access_key_id)
    counted.reset()
    authorizer.authorize(principal, "fs:ReadObject", [object_arn("r", "a")])
    first = counted.total()
    assert first > 0
    counted.reset()
    for i in range(50):
        authorizer.authorize(principal, "fs:WriteObject", [object_arn("r", f"p{i}")])
    assert counted.total() == 0
    clock.now += 5
    authorizer.authorize(principal, "fs:ReadObject", [object_arn("r", "a")])
    assert counted.total() == first  # expired: loaded again, the same reads
    assert dev.id == "dev"


def test_a_revoked_credential_stops_working_within_the_cache_lifetime(iam):
    clock = Clock()
    authorizer = Authorizer(iam, cache_seconds=5, clock=clock)
    user(iam, "dev", DEVELOPERS)
    record, _ = iam.create_credentials("dev")
    principal = Principal("user", "dev", record.access_key_id)
    authorizer.authorize(principal, "fs:ReadObject", ["*"])
    # Revoked by another process: this one only learns it when the cache expires.
    IamStore(iam._kv).delete_credentials("dev", record.access_key_id)
    clock.now += 4.9
    authorizer.authorize(principal, "fs:ReadObject", ["*"])
    clock.now += 0.1
    with pytest.raises(auth_errors.CredentialRevoked):
        authorizer.authorize(principal, "fs:ReadObject", ["*"])


def test_an_answer_ages_from_its_read_not_from_when_the_read_ended(iam, monkeypatch):
    """A user deleted while its policies were being read (a slow KV) still stops working
    cache_seconds after that read began: the read's duration never lengthens the window."""
    clock = Clock()
    authorizer = Authorizer(iam, cache_seconds=5, clock=clock)
    principal = user(iam, "dev", DEVELOPERS)
    read = iam.effective_policies

    def slow_read(user_id):
        policies = read(user_id)
        clock.now += 3  # the read took 3 s
        return policies

    monkeypatch.setattr(iam, "effective_policies", slow_read)
    authorizer.authorize(principal, "fs:ReadObject", ["*"])
    monkeypatch.setattr(iam, "effective_policies", read)
    IamStore(iam._kv).delete_user("dev")
    clock.now += 1.9  # 4.9 s after the read began: still the cached answer
    authorizer.authorize(principal, "fs:ReadObject", ["*"])
    clock.now += 0.1
    with pytest.raises(auth_errors.PrincipalUnknown):
        authorizer.authorize(principal, "fs:ReadObject", ["*"])


def test_the_cache_is_bounded(iam, counted, monkeypatch):
    """Users and access keys are remembered in bounded TTL caches (quarry.lru.TTLCache):
    past the bound the least recently used user is read again, never kept forever."""
    monkeypatch.setattr(authorizer_module, "CACHE_MAX_ITEMS", 2)
    authorizer = Authorizer(iam, cache_seconds=3600, clock=Clock())
    principals = [user(iam, name, VIEWERS) for name in ("a", "b", "c")]
    for principal in principals:
        authorizer.authorize(principal, "fs:ReadObject", ["*"])
    assert len(authorizer._users) == 2
    counted.reset()
    authorizer.authorize(principals[2], "fs:ReadObject", ["*"])  # still cached
    assert counted.total() == 0
    authorizer.authorize(principals[0], "fs:ReadObject", ["*"])  # evicted: read again
    assert counted.total() > 0


def test_a_deleted_user_stops_working_within_the_cache_lifetime(iam):
    clock = Clock()
    authorizer = Authorizer(iam, cache_seconds=5, clock=clock)
    principal = user(iam, "dev", DEVELOPERS)
    authorizer.authorize(principal, "fs:ReadObject", ["*"])
    IamStore(iam._kv).delete_user("dev")
    clock.now += 5
    with pytest.raises(auth_errors.PrincipalUnknown) as caught:
        authorizer.authorize(principal, "fs:ReadObject", ["*"])
    assert caught.value.code.name == "UNAUTHENTICATED"
    # Re-created under the same id: a fresh user with no grants, not the old one's rights.
    iam.create_user("dev")
    clock.now += 5
    assert not allowed(authorizer, principal, "fs:ReadObject", "*")


def test_a_credential_of_another_user_does_not_authenticate(iam):
    authorizer = Authorizer(iam, cache_seconds=0)
    user(iam, "alice", ADMINS)
    user(iam, "mallory")
    alice_key, _ = iam.create_credentials("alice")
    with pytest.raises(auth_errors.CredentialRevoked):
        authorizer.check_principal(Principal("user", "mallory", alice_key.access_key_id))


def test_setup_admin_once(iam):
    user_record, credential, secret = setup_admin(iam, "root")
    assert credential.user_id == "root" and len(secret) == 40
    assert iam.authenticate(credential.access_key_id, secret).user_id == "root"
    assert allowed(
        Authorizer(iam, cache_seconds=0),
        Principal("user", "root"),
        "auth:CreateUser",
        user_arn("x"),
    )
    with pytest.raises(auth_errors.AdminExists) as caught:
        setup_admin(iam, "second")
    assert caught.value.code.name == "FAILED_PRECONDITION"
    assert not iam.user_exists("second")
    assert user_record.id == "root"


def test_ensure_builtins_never_overwrites(iam):
    iam.detach_group_policy(VIEWERS, "FSReadAll")
    ensure_builtins(iam)
    assert [p.id for p in iam.list_group_policies(VIEWERS)[0]] == ["AuthManageOwnCredentials"]
    assert set(BUILTIN_GROUPS) <= {g.id for g in iam.list_groups()[0]}


def test_a_remembered_allow_ends_with_its_policy_snapshot(iam):
    """Allowed requests are remembered per cached policy snapshot: an explicit Deny attached
    later must refuse the very request allowed before, once the cache expires (another
    process) or at once after invalidate (this one), never stay allowed."""
    clock = Clock()
    authorizer = Authorizer(iam, cache_seconds=5, clock=clock)
    dev = user(iam, "dev", DEVELOPERS)
    resource = object_arn("prod", "a")
    for _ in range(3):
        assert allowed(authorizer, dev, "fs:WriteObject", resource)
    iam.create_policy(
        "NoProd",
        document({"Effect": "Deny", "Action": "fs:*", "Resource": "arn:quarry:fs:::*"}),
    )
    IamStore(iam._kv).attach_user_policy("dev", "NoProd")
    clock.now += 5
    assert not allowed(authorizer, dev, "fs:WriteObject", resource)
    iam.detach_user_policy("dev", "NoProd")
    authorizer.invalidate("dev")
    assert allowed(authorizer, dev, "fs:WriteObject", resource)
    iam.attach_user_policy("dev", "NoProd")
    authorizer.invalidate("dev")
    assert not allowed(authorizer, dev, "fs:WriteObject", resource)
