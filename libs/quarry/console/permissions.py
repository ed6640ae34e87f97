"""Which write controls a page shows: the user's own effective policies (Auth/WhoAmI with
include_effective_policies, the user's own token) evaluated with the servers' evaluator
(quarry.auth.policy.decide).

This only hides buttons; it never grants anything. The servers decide every call (a forged
form from a user without the permission gets PERMISSION_DENIED from them). When the policies
cannot be read (or were truncated), every write control is hidden: fail closed."""

from __future__ import annotations

import time
from typing import Any

from quarry import errors
from quarry.auth import policy as policies

CACHE_SECONDS = 30.0


def _effective(session: Any, client: Any) -> list[policies.Policy] | None:
    cached = session.cache.get("policies")
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    found: list[policies.Policy] | None
    try:
        me = client.whoami(include_effective_policies=True)
        found = [policies.parse_policy(p.id, p.document) for p in me.effective_policies]
        if me.effective_policies_truncated:
            found = None
    except errors.QuarryError:
        found = None
    session.cache["policies"] = (time.monotonic() + CACHE_SECONDS, found)
    return found


def can(session: Any, client: Any, action: str, resource: str) -> bool:
    """Whether the user's policies allow `action` on `resource` (an ARN from
    quarry.auth.policy: repository_arn, branch_arn, ...)."""
    found = _effective(session, client)
    if found is None:
        return False
    decision, _ = policies.decide(found, action, [resource], session.user_id)
    return decision is policies.Decision.ALLOW


def require(session: Any, client: Any, action: str, resource: str) -> None:
    """A confirmation page's check: PERMISSION_DENIED (403) for a user whose policies do not
    allow the action it confirms, instead of a form the server would refuse."""
    if session is None or not can(session, client, action, resource):
        raise errors.PermissionDenied(
            f"{action} on {resource} is not allowed for you",
            metadata={"action": action, "resource": resource},
        )
