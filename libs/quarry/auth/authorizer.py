"""The authorizer: is this principal still valid, and may it do this action on these
resources?

A user's effective policies (its own attachments and its groups') are cached per user for
`cache_seconds`, and so are "does this user exist" and "does this access key exist", so a
steady stream of calls by one user costs no KV read. The price is the cache lifetime: a
deleted user, a revoked credential or a detached policy takes effect within it (and at once
on this process after `invalidate`).

Safety rule: nothing here allows by default. An unknown user, a revoked credential, a
matching Deny or the absence of any matching Allow is a refusal; only a service principal
(holder of a token minted with the signing key) skips policy evaluation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from quarry.auth import errors as auth_errors
from quarry.auth.policy import (
    Decision,
    Policy,
    allows_everywhere,
    allows_under,
    decide,
    wildcard_match,
)
from quarry.auth.store import IamStore
from quarry.auth.tokens import Principal
from quarry.lru import TTLCache

DEFAULT_CACHE_SECONDS = 5.0
# Allowed (action, resource) pairs remembered per cached policy snapshot; cleared when it
# would grow past this (object paths make the resources of a hot path many).
ALLOWED_MAX = 4096


# Users and access keys remembered, each (the least recently used go first): a process
# serving many users stays bounded.
CACHE_MAX_ITEMS = 10_000


@dataclass(frozen=True)
class _Cached:
    exists: bool
    policies: tuple[Policy, ...] = ()
    # (action, resource) pairs these policies allow: decide() is a pure function of the
    # policies and the request, so its ALLOW holds for as long as this snapshot does (and
    # goes with it). Refusals are not remembered: they are decided again, and named.
    allowed: set[tuple[str, str]] = field(default_factory=set, compare=False)
    # The policies narrowed to the statements whose actions match, by action: a statement
    # for another action matches no resource, so decide() gives the same answer on these,
    # and a batch's 1,000 resources are matched against few statements, not all.
    by_action: dict[str, tuple[Policy, ...]] = field(default_factory=dict, compare=False)
    # allows_everywhere(policies, action), by action (as pure a function of the snapshot).
    everywhere: dict[str, bool] = field(default_factory=dict, compare=False)
    # allows_under(policies, action, prefix), by (action, prefix): asked on every staging
    # call of a user who may not import everywhere (quarry.auth.checks.check_import).
    under: dict[tuple[str, str], bool] = field(default_factory=dict, compare=False)

    def policies_for(self, action: str) -> tuple[Policy, ...]:
        narrowed = self.by_action.get(action)
        if narrowed is None:
            narrowed = tuple(
                Policy(
                    policy.id,
                    tuple(
                        statement
                        for statement in policy.statements
                        if any(wildcard_match(pattern, action) for pattern in statement.actions)
                    ),
                )
                for policy in self.policies
            )
            self.by_action[action] = narrowed
        return narrowed


class Authorizer:
    def __init__(
        self,
        iam: IamStore,
        cache_seconds: float = DEFAULT_CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._iam = iam
        # Each entry ages from the moment its read began: a change made during a slow
        # read still takes effect within cache_seconds.
        self._users = TTLCache(cache_seconds, CACHE_MAX_ITEMS, clock)
        self._keys = TTLCache(cache_seconds, CACHE_MAX_ITEMS, clock)

    def check_principal(self, principal: Principal) -> None:
        """PrincipalUnknown for a user that no longer exists; CredentialRevoked for a token
        issued against an access key that was deleted (or now belongs to someone else)."""
        if not principal.is_service:
            self._checked_user(principal)

    def _checked_user(self, principal: Principal) -> _Cached:
        """check_principal of a user principal; its cached entry (policies) when it passes."""
        cached = self._user(principal.id)
        if not cached.exists:
            raise auth_errors.PrincipalUnknown(
                f"user {principal.id!r} of this token does not exist (any more)",
                metadata={"principal": str(principal)},
            )
        if principal.access_key_id and not self._key_of(principal).exists:
            raise auth_errors.CredentialRevoked(
                f"access key {principal.access_key_id!r} of this token was revoked",
                metadata={"principal": str(principal), "access_key_id": principal.access_key_id},
            )
        return cached

    def authorize(self, principal: Principal, action: str, resources: Sequence[str]) -> None:
        """Return if allowed; PermissionDenied naming the action and resource otherwise.
        Checks the principal first (check_principal), whoever called before."""
        if principal.is_service:
            return
        # The principal's check and its policies from one look-up of its cache entry.
        cached = self._checked_user(principal)
        # Only single-resource requests are remembered: a batch names many distinct objects
        # (PutObjects: 1,000 a message) that would never repeat.
        single = (action, resources[0]) if len(resources) == 1 else None
        if single is not None and single in cached.allowed:
            return
        policies = cached.policies_for(action)
        decision, resource = decide(policies, action, resources, principal.id)
        if decision is Decision.ALLOW:
            if single is not None:
                if len(cached.allowed) >= ALLOWED_MAX:
                    cached.allowed.clear()
                cached.allowed.add(single)
            return
        why = "an explicit Deny" if decision is Decision.DENY else "no policy allows it"
        raise auth_errors.PermissionDenied(
            f"{principal} may not {action} on {resource} ({why})",
            metadata={
                "principal": str(principal),
                "action": action,
                "resource": resource,
                "decision": decision.value,
            },
        )

    def allows_everywhere(self, principal: Principal, action: str) -> bool:
        """Whether `principal` may do `action` on every resource whatever it is (an Allow on
        "*" naming the action, no Deny naming it): a caller may then skip working out which
        resources a large request would have to be authorized on. False is no refusal: the
        caller then authorizes the resources themselves. Checks the principal first."""
        if principal.is_service:
            return True
        cached = self._checked_user(principal)
        answer = cached.everywhere.get(action)
        if answer is None:
            answer = allows_everywhere(cached.policies_for(action), action)
            cached.everywhere[action] = answer
        return answer

    def allows_under(self, principal: Principal, action: str, prefix: str) -> bool:
        """Whether `principal` may do `action` on every resource starting with `prefix`
        (quarry.auth.policy.allows_under; a service always). Checks the principal first."""
        if principal.is_service:
            return True
        cached = self._checked_user(principal)
        answer = cached.under.get((action, prefix))
        if answer is None:
            if len(cached.under) >= ALLOWED_MAX:
                cached.under.clear()
            answer = allows_under(cached.policies_for(action), action, prefix, principal.id)
            cached.under[(action, prefix)] = answer
        return answer

    def effective_policies(self, user_id: str) -> tuple[Policy, ...]:
        return self._user(user_id).policies

    def invalidate(self, user_id: str | None = None) -> None:
        """Forget cached answers (all, or one user's): IAM changes made through this process
        take effect here at once."""
        if user_id is None:
            self._users.clear()
            self._keys.clear()
        else:
            self._users.pop(user_id)

    def _user(self, user_id: str) -> _Cached:
        cached: _Cached | None = self._users.get(user_id)
        if cached is not None:
            return cached
        read_at = self._users.now()
        try:
            loaded = _Cached(True, tuple(self._iam.effective_policies(user_id)))
        except (auth_errors.UserNotFound, auth_errors.InvalidIamId):
            loaded = _Cached(False)
        self._users.put(user_id, loaded, read_at=read_at)
        return loaded

    def _key_of(self, principal: Principal) -> _Cached:
        key_id = principal.access_key_id
        cached: _Cached | None = self._keys.get(key_id)
        if cached is not None:
            return cached
        read_at = self._keys.now()
        try:
            record = self._iam.get_credentials(key_id)
            loaded = _Cached(record.user_id == principal.id)
        except (auth_errors.CredentialsNotFound, auth_errors.InvalidIamId):
            loaded = _Cached(False)
        self._keys.put(key_id, loaded, read_at=read_at)
        return loaded


class ServicesOnlyAuthorizer(Authorizer):
    """The authorizer of a service that holds no IAM store (the range-writer): it serves
    only the suite's services, so any user principal is refused before anything is read.

    Safety rule: never allows a user, whatever the rule of the method says."""

    def __init__(self) -> None:  # no IAM store, no cache
        pass

    def check_principal(self, principal: Principal) -> None:
        if not principal.is_service:
            raise auth_errors.ServicePrincipalRequired(
                "this service is internal: only Quarry's own services may call it",
                metadata={"principal": str(principal)},
            )

    def authorize(self, principal: Principal, action: str, resources: Sequence[str]) -> None:
        self.check_principal(principal)

    def allows_everywhere(self, principal: Principal, action: str) -> bool:
        self.check_principal(principal)
        return True

    def allows_under(self, principal: Principal, action: str, prefix: str) -> bool:
        self.check_principal(principal)
        return True

    def invalidate(self, user_id: str | None = None) -> None:
        pass
