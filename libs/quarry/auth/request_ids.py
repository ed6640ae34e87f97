"""THE one place an Auth request's user, group or policy id is read.

The contract (docs/api.md) names the id of CreateUser/GetUser/DeleteUser,
CreateGroup/GetGroup/DeleteGroup and CreatePolicy/GetPolicy/UpdatePolicy/DeletePolicy `id`;
their requests kept the older `user_id` / `group_id` / `policy_id` too (clients use them).
`requested_id` decides which id such a request names, and BOTH sides of a call ask it: the
declaration table's resource functions (what the caller is authorized on, before the
servicer runs) and the servicer (what it acts on).

Safety rule: it must never let a request be authorized on one id and acted on with another.
So it is the only reader of these fields (the declarations and the servicer never read them
themselves), it is a pure function of the request (the same answer on every call), and a
request naming two DIFFERENT ids is refused (INVALID_ARGUMENT / CONFLICTING_IDS) — never
resolved by preferring one field, which is what a oneof would do silently.
"""

from __future__ import annotations

from typing import Any

from quarry.auth.errors import ConflictingIds

# Request message (full name) → the older field its `id` field is another name for.
ID_ALIASES: dict[str, str] = {
    "quarry.v1.CreateUserRequest": "user_id",
    "quarry.v1.GetUserRequest": "user_id",
    "quarry.v1.DeleteUserRequest": "user_id",
    "quarry.v1.CreateGroupRequest": "group_id",
    "quarry.v1.GetGroupRequest": "group_id",
    "quarry.v1.DeleteGroupRequest": "group_id",
    "quarry.v1.CreatePolicyRequest": "policy_id",
    "quarry.v1.GetPolicyRequest": "policy_id",
    "quarry.v1.UpdatePolicyRequest": "policy_id",
    "quarry.v1.DeletePolicyRequest": "policy_id",
}

_QUOTED = 200  # ids quoted in an error are cut here (a huge id must not blow the trailers)


def requested_id(request: Any, field: str) -> str:
    """The id `request` names in `field` ("user_id", "group_id" or "policy_id").

    For a request of ID_ALIASES whose alias is `field`: `id` or `field`, whichever is set;
    both may be set to the same id; two different ids raise ConflictingIds. Neither gives ""
    as before, which every IAM operation refuses (INVALID_ARGUMENT / INVALID_IAM_ID, after
    the authorization check, as an empty `user_id` always was). Any other request: `field`.
    """
    legacy: str = getattr(request, field)
    if ID_ALIASES.get(request.DESCRIPTOR.full_name) != field:
        return legacy
    named: str = request.id
    if named and legacy and named != legacy:
        kind = field.removesuffix("_id")
        raise ConflictingIds(
            f"{request.DESCRIPTOR.name} names two different {kind} ids: id "
            f"{named[:_QUOTED]!r} and {field} {legacy[:_QUOTED]!r}; set one of the two "
            "fields, or both to the same id",
            metadata={"id": named[:_QUOTED], field: legacy[:_QUOTED]},
        )
    return named or legacy
