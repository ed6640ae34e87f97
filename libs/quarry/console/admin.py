"""The console's admin pages: users, groups, policies and credentials, listed and edited
with the Auth RPCs called with the signed-in user's token (the servers decide every call;
the controls shown follow the user's own policies, quarry.console.permissions).

Safety rules: every edit is a form post carrying the session's CSRF token (checked by
quarry.console.app before a page runs); every destructive one (deleting a user, group,
policy or credentials, removing a member, detaching a policy) only from its confirmation
page (quarry.console.forms.confirmed), never on one click or a forged request. A new secret
access key is shown once, in the answer to the post that made it (never stored, logged or
shown again; the page is not cached)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from quarry.auth import policy
from quarry.console.app import Context, Route, route
from quarry.console.forms import confirm_page, confirmed, required
from quarry.console.http import Response, redirect
from quarry.console.permissions import can, require

SMALL_PAGE = 50
DETAIL_PAGE = 100  # a user's groups / a group's members ... shown on one page


def _can(ctx: Context, action: str, resource: str) -> bool:
    return ctx.session is not None and can(ctx.session, ctx.client, action, resource)


def _user_url(user: str, tail: str = "") -> str:
    return f"/admin/users/{quote(user, safe='')}{tail}"


def _group_url(group: str, tail: str = "") -> str:
    return f"/admin/groups/{quote(group, safe='')}{tail}"


def _admin_list(ctx: Context, method: str, field: str, title: str, **fields: Any) -> Response:
    page = ctx.client.list_page(
        method, page_size=SMALL_PAGE, page_token=ctx.request.arg("page"), **fields
    )
    subject = fields.get("user_id", "")
    return ctx.render(
        "admin.html",
        title=title,
        kind=field,
        items=getattr(page, field),
        next_page=page.next_page_token,
        subject=subject,
        can_create={
            "users": _can(ctx, "auth:CreateUser", policy.user_arn("*")),
            "groups": _can(ctx, "auth:CreateGroup", policy.group_arn("*")),
            "policies": _can(ctx, "auth:CreatePolicy", policy.policy_arn("*")),
            "credentials": bool(subject)
            and _can(ctx, "auth:CreateCredentials", policy.user_arn(subject)),
        }[field],
        can_delete={
            "users": _can(ctx, "auth:DeleteUser", policy.user_arn("*")),
            "groups": _can(ctx, "auth:DeleteGroup", policy.group_arn("*")),
            "policies": _can(ctx, "auth:DeletePolicy", policy.policy_arn("*")),
            "credentials": bool(subject)
            and _can(ctx, "auth:DeleteCredentials", policy.user_arn(subject)),
        }[field],
    )


# ---- users ------------------------------------------------------------------------------


def users(ctx: Context, params: dict[str, str]) -> Response:
    return _admin_list(ctx, "ListUsers", "users", "Users")


def create_user(ctx: Context, params: dict[str, str]) -> Response:
    (user_id,) = required(ctx, "user_id")
    ctx.client.create_user(user_id, ctx.request.field("email").strip())
    return redirect(_user_url(user_id))


def user_detail(ctx: Context, params: dict[str, str]) -> Response:
    user = ctx.client.get_user(params["user"])
    arn = policy.user_arn(user.id)
    groups = ctx.client.list_page("ListUserGroups", user_id=user.id, page_size=DETAIL_PAGE)
    attached = ctx.client.list_page("ListUserPolicies", user_id=user.id, page_size=DETAIL_PAGE)
    keys = ctx.client.list_page("ListCredentials", user_id=user.id, page_size=DETAIL_PAGE)
    return ctx.render(
        "admin_user.html",
        user=user,
        groups=groups.groups,
        policies=attached.policies,
        credentials=keys.credentials,
        more=bool(groups.next_page_token or attached.next_page_token or keys.next_page_token),
        can_delete=_can(ctx, "auth:DeleteUser", arn),
        can_attach=_can(ctx, "auth:AttachPolicy", arn),
        can_detach=_can(ctx, "auth:DetachPolicy", arn),
        can_create_credentials=_can(ctx, "auth:CreateCredentials", arn),
        can_delete_credentials=_can(ctx, "auth:DeleteCredentials", arn),
    )


def confirm_delete_user(ctx: Context, params: dict[str, str]) -> Response:
    user = ctx.client.get_user(params["user"])
    require(ctx.session, ctx.client, "auth:DeleteUser", policy.user_arn(user.id))
    return confirm_page(
        ctx,
        title=f"Delete user {user.id}?",
        action=_user_url(user.id, "/delete"),
        name=user.id,
        fields={},
        detail="The user, its credentials, group memberships and policy attachments are "
        "removed; its commits stay.",
        cancel=_user_url(user.id),
    )


def delete_user(ctx: Context, params: dict[str, str]) -> Response:
    confirmed(ctx, params["user"])
    ctx.client.delete_user(params["user"])
    return redirect("/admin/users")


# ---- credentials ------------------------------------------------------------------------


def credentials(ctx: Context, params: dict[str, str]) -> Response:
    user = params["user"]
    return _admin_list(
        ctx, "ListCredentials", "credentials", f"Credentials of {user}", user_id=user
    )


def create_credentials(ctx: Context, params: dict[str, str]) -> Response:
    """The new key pair, its secret shown this once (the answer to the post itself: no
    redirect to a page that could show it again)."""
    made = ctx.client.create_credentials(params["user"])
    return ctx.render(
        "credentials_created.html",
        user_id=made.credentials.user_id or params["user"],
        access_key_id=made.credentials.access_key_id,
        secret_access_key=made.secret_access_key,
    )


def confirm_delete_credentials(ctx: Context, params: dict[str, str]) -> Response:
    user, key = params["user"], ctx.request.arg("key")
    require(ctx.session, ctx.client, "auth:DeleteCredentials", policy.user_arn(user))
    return confirm_page(
        ctx,
        title=f"Delete credentials {key} of {user}?",
        action=_user_url(user, "/credentials/delete"),
        name=key,
        fields={"key": key},
        detail="Signing in or signing requests with this access key stops working; tokens "
        "already issued for it run until they expire.",
        cancel=_user_url(user),
    )


def delete_credentials(ctx: Context, params: dict[str, str]) -> Response:
    key = ctx.request.field("key")
    confirmed(ctx, key)
    ctx.client.delete_credentials(params["user"], key)
    return redirect(_user_url(params["user"]))


# ---- policies attached to a user or a group --------------------------------------------


def _principal(params: dict[str, str]) -> tuple[str, dict[str, str], str]:
    """(its page, the attach_policy/detach_policy keyword, its kind) of the user or group."""
    if "user" in params:
        return _user_url(params["user"]), {"user": params["user"]}, "user"
    return _group_url(params["group"]), {"group": params["group"]}, "group"


def attach_policy(ctx: Context, params: dict[str, str]) -> Response:
    (policy_id,) = required(ctx, "policy")
    page, principal, _ = _principal(params)
    ctx.client.attach_policy(policy_id, **principal)
    return redirect(page)


def confirm_detach_policy(ctx: Context, params: dict[str, str]) -> Response:
    page, principal, kind = _principal(params)
    policy_id = ctx.request.arg("policy")
    subject = next(iter(principal.values()))
    arn = policy.user_arn(subject) if kind == "user" else policy.group_arn(subject)
    require(ctx.session, ctx.client, "auth:DetachPolicy", arn)
    return confirm_page(
        ctx,
        title=f"Detach policy {policy_id} from {kind} {next(iter(principal.values()))}?",
        action=page + "/policies/detach",
        name=policy_id,
        fields={"policy": policy_id},
        detail=f"The {kind} loses what this policy allows (the policy itself stays).",
        cancel=page,
        button="Detach",
    )


def detach_policy(ctx: Context, params: dict[str, str]) -> Response:
    page, principal, _ = _principal(params)
    policy_id = ctx.request.field("policy")
    confirmed(ctx, policy_id)
    ctx.client.detach_policy(policy_id, **principal)
    return redirect(page)


# ---- groups -----------------------------------------------------------------------------


def groups(ctx: Context, params: dict[str, str]) -> Response:
    return _admin_list(ctx, "ListGroups", "groups", "Groups")


def create_group(ctx: Context, params: dict[str, str]) -> Response:
    (group_id,) = required(ctx, "group_id")
    ctx.client.create_group(group_id, ctx.request.field("description").strip())
    return redirect(_group_url(group_id))


def group_detail(ctx: Context, params: dict[str, str]) -> Response:
    group_id = params["group"]
    group = ctx.client.get_group(group_id)
    arn = policy.group_arn(group.id)
    members = ctx.client.list_page("ListGroupMembers", group_id=group.id, page_size=DETAIL_PAGE)
    attached = ctx.client.list_page("ListGroupPolicies", group_id=group.id, page_size=DETAIL_PAGE)
    return ctx.render(
        "admin_group.html",
        group=group,
        members=members.users,
        policies=attached.policies,
        more=bool(members.next_page_token or attached.next_page_token),
        can_delete=_can(ctx, "auth:DeleteGroup", arn),
        can_add=_can(ctx, "auth:AddGroupMember", arn),
        can_remove=_can(ctx, "auth:RemoveGroupMember", arn),
        can_attach=_can(ctx, "auth:AttachPolicy", arn),
        can_detach=_can(ctx, "auth:DetachPolicy", arn),
    )


def confirm_delete_group(ctx: Context, params: dict[str, str]) -> Response:
    group = params["group"]
    require(ctx.session, ctx.client, "auth:DeleteGroup", policy.group_arn(group))
    return confirm_page(
        ctx,
        title=f"Delete group {group}?",
        action=_group_url(group, "/delete"),
        name=group,
        fields={},
        detail="Its members lose what the group's policies allowed them (users and policies stay).",
        cancel=_group_url(group),
    )


def delete_group(ctx: Context, params: dict[str, str]) -> Response:
    confirmed(ctx, params["group"])
    ctx.client.delete_group(params["group"])
    return redirect("/admin/groups")


def add_member(ctx: Context, params: dict[str, str]) -> Response:
    (user_id,) = required(ctx, "user")
    ctx.client.add_group_member(params["group"], user_id)
    return redirect(_group_url(params["group"]))


def confirm_remove_member(ctx: Context, params: dict[str, str]) -> Response:
    group, user = params["group"], ctx.request.arg("user")
    require(ctx.session, ctx.client, "auth:RemoveGroupMember", policy.group_arn(group))
    return confirm_page(
        ctx,
        title=f"Remove {user} from group {group}?",
        action=_group_url(group, "/members/remove"),
        name=user,
        fields={"user": user},
        detail="The user loses what the group's policies allowed (the user stays).",
        cancel=_group_url(group),
        button="Remove",
    )


def remove_member(ctx: Context, params: dict[str, str]) -> Response:
    user = ctx.request.field("user")
    confirmed(ctx, user)
    ctx.client.remove_group_member(params["group"], user)
    return redirect(_group_url(params["group"]))


# ---- policies ---------------------------------------------------------------------------


def policies_page(ctx: Context, params: dict[str, str]) -> Response:
    return _admin_list(ctx, "ListPolicies", "policies", "Policies")


def create_policy(ctx: Context, params: dict[str, str]) -> Response:
    """A policy from its JSON document (the servers validate it: INVALID_POLICY naming the
    statement and field of a bad one)."""
    policy_id, document = required(ctx, "policy_id", "document")
    ctx.client.create_policy(policy_id, document)
    return redirect("/admin/policies")


def confirm_delete_policy(ctx: Context, params: dict[str, str]) -> Response:
    policy_id = ctx.request.arg("policy")
    found = ctx.client.get_policy(policy_id)
    require(ctx.session, ctx.client, "auth:DeletePolicy", policy.policy_arn(found.id))
    return confirm_page(
        ctx,
        title=f"Delete policy {found.id}?",
        action="/admin/policies/delete",
        name=found.id,
        fields={"policy": found.id},
        detail="Every user and group it is attached to loses what it allows.",
        cancel="/admin/policies",
    )


def delete_policy(ctx: Context, params: dict[str, str]) -> Response:
    policy_id = ctx.request.field("policy")
    confirmed(ctx, policy_id)
    ctx.client.delete_policy(policy_id)
    return redirect("/admin/policies")


ROUTES: list[Route] = [
    route("GET", "/admin/users", "users", users),
    route("POST", "/admin/users", "create_user", create_user),
    route("GET", "/admin/users/{user}", "user", user_detail),
    route("GET", "/admin/users/{user}/delete", "confirm_delete_user", confirm_delete_user),
    route("POST", "/admin/users/{user}/delete", "delete_user", delete_user),
    route("GET", "/admin/users/{user}/credentials", "credentials", credentials),
    route("POST", "/admin/users/{user}/credentials", "create_credentials", create_credentials),
    route(
        "GET",
        "/admin/users/{user}/credentials/delete",
        "confirm_delete_credentials",
        confirm_delete_credentials,
    ),
    route(
        "POST", "/admin/users/{user}/credentials/delete", "delete_credentials", delete_credentials
    ),
    route("POST", "/admin/users/{user}/policies", "attach_user_policy", attach_policy),
    route(
        "GET",
        "/admin/users/{user}/policies/detach",
        "confirm_detach_user_policy",
        confirm_detach_policy,
    ),
    route("POST", "/admin/users/{user}/policies/detach", "detach_user_policy", detach_policy),
    route("GET", "/admin/groups", "groups", groups),
    route("POST", "/admin/groups", "create_group", create_group),
    route("GET", "/admin/groups/{group}", "group", group_detail),
    route("GET", "/admin/groups/{group}/delete", "confirm_delete_group", confirm_delete_group),
    route("POST", "/admin/groups/{group}/delete", "delete_group", delete_group),
    route("POST", "/admin/groups/{group}/members", "add_member", add_member),
    route(
        "GET",
        "/admin/groups/{group}/members/remove",
        "confirm_remove_member",
        confirm_remove_member,
    ),
    route("POST", "/admin/groups/{group}/members/remove", "remove_member", remove_member),
    route("POST", "/admin/groups/{group}/policies", "attach_group_policy", attach_policy),
    route(
        "GET",
        "/admin/groups/{group}/policies/detach",
        "confirm_detach_group_policy",
        confirm_detach_policy,
    ),
    route("POST", "/admin/groups/{group}/policies/detach", "detach_group_policy", detach_policy),
    route("GET", "/admin/policies", "policies", policies_page),
    route("POST", "/admin/policies", "create_policy", create_policy),
    route("GET", "/admin/policies/delete", "confirm_delete_policy", confirm_delete_policy),
    route("POST", "/admin/policies/delete", "delete_policy", delete_policy),
]
