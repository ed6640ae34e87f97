"""The Auth service's calls of quarry.client.Client (quarry.v1.Auth, served by branch-manager):
the session (login, whoami, token, setup) and users, credentials, groups, memberships and
policies. Each returns the resource the response holds; `iter_*` follow page tokens.

Safety rule: a secret access key is only ever returned to the caller (create_credentials,
setup); nothing here logs or stores one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from quarry import errors

# Loaded so from_rpc_error rebuilds the auth errors by reason (InvalidCredentials, ...).
from quarry.auth import errors as _auth_errors  # noqa: F401
from quarry.client.calls import RpcCalls
from quarry.client.credentials import Credentials
from quarry.client.session import TokenSource
from quarry.v1 import auth_pb2 as pb


class AuthCalls(RpcCalls):
    """Auth RPC wrappers; the stubs and token source are set by Client.__init__."""

    _auth: Any  # AuthStub over the intercepted branch-manager channel
    _auth_open: Any  # AuthStub over the plain channel: the open RPCs (Login, Setup)
    _token_source: TokenSource | None

    # ---- session ----

    def login(self, credentials: Credentials) -> pb.LoginResponse:
        """Auth/Login: (token, expires_at) for `credentials` (the client's own session
        logs in by itself; this is for callers who want a token for other credentials)."""
        return self._unary(
            self._auth_open.Login,
            "Auth/Login",
            pb.LoginRequest(
                access_key_id=credentials.access_key_id,
                secret_access_key=credentials.secret_access_key,
            ),
        )

    def token(self) -> str:
        """The bearer token this client sends (logging in first if needed);
        UNAUTHENTICATED / NO_CREDENTIALS when it has neither credentials nor a token."""
        from quarry.client.session import HOW_TO_GET_CREDENTIALS, NoCredentials

        if self._token_source is None:
            raise NoCredentials(f"no credentials: {HOW_TO_GET_CREDENTIALS}")
        return self._token_source.token()

    def check_permission(self, action: str, resource: str, *, every_under: bool = False) -> None:
        """Return if the caller may do `action` on `resource` (with `every_under`: on every
        resource starting with it); PermissionDenied otherwise. Unimplemented from a server
        with auth off (everything is allowed there)."""
        request = pb.CheckPermissionRequest(
            action=action, resource=resource, every_under=every_under
        )
        self._unary(self._auth.CheckPermission, "Auth/CheckPermission", request)

    def whoami(self, include_effective_policies: bool = False) -> pb.WhoAmIResponse:
        """The caller; with `include_effective_policies`, its own effective policies too."""
        request = pb.WhoAmIRequest(include_effective_policies=include_effective_policies)
        return self._unary(self._auth.WhoAmI, "Auth/WhoAmI", request)

    def setup(
        self, user_id: str = "admin", access_key_id: str = "", secret_access_key: str = ""
    ) -> pb.SetupResponse:
        """Auth/Setup (open): the first admin and its credentials, the secret returned once;
        FAILED_PRECONDITION / ADMIN_EXISTS once there is an admin."""
        if bool(access_key_id) != bool(secret_access_key):
            raise errors.InvalidArgument(
                "give both an access key id and a secret access key, or neither"
            )
        return self._unary(
            self._auth_open.Setup,
            "Auth/Setup",
            pb.SetupRequest(
                user_id=user_id, access_key_id=access_key_id, secret_access_key=secret_access_key
            ),
        )

    # ---- users ----

    def create_user(self, user_id: str, email: str = "") -> pb.User:
        request = pb.CreateUserRequest(user_id=user_id, email=email)
        return self._unary(self._auth.CreateUser, "Auth/CreateUser", request).user

    def get_user(self, user_id: str) -> pb.User:
        request = pb.GetUserRequest(user_id=user_id)
        return self._unary(self._auth.GetUser, "Auth/GetUser", request).user

    def iter_users(self, page_size: int = 0) -> Iterator[pb.User]:
        for page in self._pages(self._list, method="ListUsers", page_size=page_size):
            yield from page.users

    def delete_user(self, user_id: str) -> None:
        request = pb.DeleteUserRequest(user_id=user_id)
        self._unary(self._auth.DeleteUser, "Auth/DeleteUser", request)

    # ---- credentials ----

    def create_credentials(self, user_id: str) -> pb.CreateCredentialsResponse:
        """`.credentials` (key id, owner) and `.secret_access_key`, returned this once."""
        request = pb.CreateCredentialsRequest(user_id=user_id)
        return self._unary(self._auth.CreateCredentials, "Auth/CreateCredentials", request)

    def iter_credentials(self, user_id: str, page_size: int = 0) -> Iterator[pb.Credentials]:
        pages = self._pages(
            self._list, method="ListCredentials", user_id=user_id, page_size=page_size
        )
        for page in pages:
            yield from page.credentials

    def delete_credentials(self, user_id: str, access_key_id: str) -> None:
        request = pb.DeleteCredentialsRequest(user_id=user_id, access_key_id=access_key_id)
        self._unary(self._auth.DeleteCredentials, "Auth/DeleteCredentials", request)

    # ---- groups ----

    def create_group(self, group_id: str, description: str = "") -> pb.Group:
        request = pb.CreateGroupRequest(group_id=group_id, description=description)
        return self._unary(self._auth.CreateGroup, "Auth/CreateGroup", request).group

    def get_group(self, group_id: str) -> pb.Group:
        request = pb.GetGroupRequest(group_id=group_id)
        return self._unary(self._auth.GetGroup, "Auth/GetGroup", request).group

    def iter_groups(self, page_size: int = 0) -> Iterator[pb.Group]:
        for page in self._pages(self._list, method="ListGroups", page_size=page_size):
            yield from page.groups

    def delete_group(self, group_id: str) -> None:
        request = pb.DeleteGroupRequest(group_id=group_id)
        self._unary(self._auth.DeleteGroup, "Auth/DeleteGroup", request)

    def add_group_member(self, group_id: str, user_id: str) -> None:
        request = pb.AddGroupMemberRequest(group_id=group_id, user_id=user_id)
        self._unary(self._auth.AddGroupMember, "Auth/AddGroupMember", request)

    def remove_group_member(self, group_id: str, user_id: str) -> None:
        request = pb.RemoveGroupMemberRequest(group_id=group_id, user_id=user_id)
        self._unary(self._auth.RemoveGroupMember, "Auth/RemoveGroupMember", request)

    def iter_group_members(self, group_id: str, page_size: int = 0) -> Iterator[pb.User]:
        pages = self._pages(
            self._list, method="ListGroupMembers", group_id=group_id, page_size=page_size
        )
        for page in pages:
            yield from page.users

    def iter_user_groups(self, user_id: str, page_size: int = 0) -> Iterator[pb.Group]:
        pages = self._pages(
            self._list, method="ListUserGroups", user_id=user_id, page_size=page_size
        )
        for page in pages:
            yield from page.groups

    # ---- policies ----

    def create_policy(self, policy_id: str, document: str) -> pb.Policy:
        """INVALID_ARGUMENT / INVALID_POLICY naming the statement and field of a bad one."""
        request = pb.CreatePolicyRequest(policy_id=policy_id, document=document)
        return self._unary(self._auth.CreatePolicy, "Auth/CreatePolicy", request).policy

    def get_policy(self, policy_id: str) -> pb.Policy:
        request = pb.GetPolicyRequest(policy_id=policy_id)
        return self._unary(self._auth.GetPolicy, "Auth/GetPolicy", request).policy

    def iter_policies(self, page_size: int = 0) -> Iterator[pb.Policy]:
        for page in self._pages(self._list, method="ListPolicies", page_size=page_size):
            yield from page.policies

    def update_policy(self, policy_id: str, document: str) -> pb.Policy:
        """Replace the document of an existing policy (NOT_FOUND when there is none; validated
        as create_policy). Takes effect at once on branch-manager; the other services see it
        when their permission cache expires (QUARRY_AUTH_CACHE_SECONDS)."""
        request = pb.UpdatePolicyRequest(policy_id=policy_id, document=document)
        return self._unary(self._auth.UpdatePolicy, "Auth/UpdatePolicy", request).policy

    def delete_policy(self, policy_id: str) -> None:
        request = pb.DeletePolicyRequest(policy_id=policy_id)
        self._unary(self._auth.DeletePolicy, "Auth/DeletePolicy", request)

    def attach_policy(self, policy_id: str, *, user: str = "", group: str = "") -> None:
        """Attach to exactly one of `user` or `group`."""
        self._attachment("Attach", policy_id, user, group)

    def detach_policy(self, policy_id: str, *, user: str = "", group: str = "") -> None:
        """Detach from exactly one of `user` or `group`."""
        self._attachment("Detach", policy_id, user, group)

    def _attachment(self, verb: str, policy_id: str, user: str, group: str) -> None:
        if bool(user) == bool(group):
            raise errors.InvalidArgument(f"{verb.lower()} a policy to a user or a group, not both")
        method = f"{verb}Policy"
        request = getattr(pb, f"{method}Request")(policy_id=policy_id, user_id=user, group_id=group)
        self._unary(getattr(self._auth, method), f"Auth/{method}", request)

    def iter_user_policies(self, user_id: str, effective: bool = False) -> Iterator[pb.Policy]:
        """The policies attached to the user; with `effective`, its groups' too."""
        method = "ListEffectivePolicies" if effective else "ListUserPolicies"
        pages = self._pages(self._list, method=method, user_id=user_id)
        for page in pages:
            yield from page.policies

    def iter_group_policies(self, group_id: str) -> Iterator[pb.Policy]:
        for page in self._pages(self._list, method="ListGroupPolicies", group_id=group_id):
            yield from page.policies

    def list_page(self, method: str, **fields: Any) -> Any:
        """One page of an Auth List* call by its name (e.g. `list_page("ListUsers",
        page_size=50, page_token=t)`): the whole response, `.next_page_token` included (the
        console's paged admin pages)."""
        return self._list(method, **fields)

    def _list(self, method: str, **fields: Any) -> Any:
        request = getattr(pb, f"{method}Request")(**fields)
        return self._unary(getattr(self._auth, method), f"Auth/{method}", request)


__all__ = ["AuthCalls"]
