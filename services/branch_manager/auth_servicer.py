"""Auth servicer (quarry.v1.Auth): proto ⇄ the IAM domain (quarry.auth), nothing else.

Branch-manager registers it (no sixth process). Authorization of every call is the
AuthInterceptor's job, by the declaration table; this servicer trusts it and only converts.
So the user, group or policy a request names is read with request_ids.requested_id, exactly
as the declarations read it, never from `id` or `*_id` directly: what is acted on is what
was authorized.
IAM changes made here invalidate this process's authorizer cache at once; other processes
see them within the cache lifetime.
"""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

from quarry import errors
from quarry.auth import errors as auth_errors
from quarry.auth.authorizer import Authorizer
from quarry.auth.bootstrap import setup_admin
from quarry.auth.convert import (
    credentials_to_proto,
    group_to_proto,
    policy_to_proto,
    user_to_proto,
)
from quarry.auth.interceptor import annotate_audit, current_principal
from quarry.auth.policy import ACTIONS, FlatStatement, document_of
from quarry.auth.request_ids import requested_id
from quarry.auth.sigv4_secrets import (
    Scope,
    SecretSealer,
    SignatureDoesNotMatch,
    scoped_signing_key,
    verify_signatures,
)
from quarry.auth.store import IamStore
from quarry.auth.throttle import LoginThrottle
from quarry.auth.tokens import DEFAULT_LIFETIME_SECONDS, TokenAuthority
from quarry.runtime.listing import listed
from quarry.v1 import auth_pb2 as pb
from quarry.v1 import auth_pb2_grpc

DEFAULT_ADMIN = "admin"
# WhoAmI's include_effective_policies answers at most this many (a message stays small).
MAX_OWN_POLICIES = 1000


def requested_document(request: pb.CreatePolicyRequest | pb.UpdatePolicyRequest) -> str:
    """The policy document of a create or update request (its JSON or its statements)."""
    statements = [FlatStatement(s.effect, tuple(s.actions), s.resource) for s in request.statements]
    return document_of(requested_id(request, "policy_id"), request.document, statements)


class AuthServicer(auth_pb2_grpc.AuthServicer):
    def __init__(
        self,
        iam: IamStore,
        tokens: TokenAuthority,
        authorizer: Authorizer,
        token_lifetime: float = DEFAULT_LIFETIME_SECONDS,
        login_throttle: LoginThrottle | None = None,
        sealer: SecretSealer | None = None,
    ):
        self._sealer = sealer  # None: VerifySignature refuses (no sealed secrets to open)
        self._iam = iam
        self._tokens = tokens
        self._authorizer = authorizer
        self._lifetime = token_lifetime
        self._login_throttle = login_throttle if login_throttle is not None else LoginThrottle()

    # ---- sessions ----

    def Login(self, request, context):
        # Before the scrypt: an unauthenticated caller must not spend the CPU freely.
        # The audit line names the key tried (a refused line too), never the secret.
        annotate_audit(access_key_id=request.access_key_id[:128])
        self._login_throttle.admit(request.access_key_id, context.peer() or "")
        credential = self._iam.authenticate(request.access_key_id, request.secret_access_key)
        annotate_audit(user=credential.user_id)
        token, expires_at = self._tokens.issue_user_token(
            credential.user_id, self._lifetime, access_key_id=credential.access_key_id
        )
        stamp = Timestamp()
        stamp.FromSeconds(int(expires_at))
        return pb.LoginResponse(token=token, expires_at=stamp)

    def Setup(self, request, context):
        # Open (no token exists yet); setup_admin succeeds once per installation.
        user, credential, secret = setup_admin(
            self._iam,
            request.user_id or DEFAULT_ADMIN,
            access_key_id=request.access_key_id,
            secret_access_key=request.secret_access_key,
            client_address=context.peer() or "",
        )
        # The audit line of this open call names what it created (never the secret).
        annotate_audit(created_user=user.id, created_access_key_id=credential.access_key_id)
        self._authorizer.invalidate()
        return pb.SetupResponse(
            user=user_to_proto(user),
            credentials=pb.SetupCredentials(
                access_key_id=credential.access_key_id, secret_access_key=secret
            ),
        )

    def VerifySignature(self, request, context):
        # Services only (declarations); the s3-gateway's SigV4 check, see sigv4_secrets.
        if self._sealer is None:
            raise SignatureDoesNotMatch("this Auth service keeps no sealed secrets")
        scope = Scope(request.date, request.region, request.service)
        # The audit line (the gateway is the caller) names the key the request was signed
        # with, refused or not; never the signature.
        annotate_audit(access_key_id=request.access_key_id[:128])
        credential = verify_signatures(
            self._iam,
            self._sealer,
            request.access_key_id,
            scope,
            [(s.string_to_sign, s.signature) for s in request.signed],
        )
        lifetime = self._lifetime
        if request.token_lifetime_seconds > 0:
            lifetime = min(lifetime, float(request.token_lifetime_seconds))
        token, expires_at = self._tokens.issue_user_token(
            credential.user_id, lifetime, access_key_id=credential.access_key_id
        )
        stamp = Timestamp()
        stamp.FromSeconds(int(expires_at))
        # The scope's derived key only after its signatures matched, only when asked.
        key = (
            scoped_signing_key(self._sealer, credential, scope) if request.want_signing_key else b""
        )
        return pb.VerifySignatureResponse(
            token=token, expires_at=stamp, user_id=credential.user_id, signing_key=key
        )

    def WhoAmI(self, request, context):
        principal = current_principal()
        if principal is None:
            raise auth_errors.TokenMissing("WhoAmI needs a bearer token")
        response = pb.WhoAmIResponse(principal_kind=principal.kind, principal_id=principal.id)
        if not principal.is_service:
            response.user.CopyFrom(user_to_proto(self._iam.get_user(principal.id)))
            if request.include_effective_policies:
                # The caller's own id only, never one from the request (declarations: WhoAmI
                # is open to any valid token, so it must never reveal another user's).
                self._own_policies(principal.id, response)
        return response

    def CheckPermission(self, request, context):
        """The caller's own permission, decided as the authorizer decides a call's: a
        service's always holds, a user's by its policies (PERMISSION_DENIED naming both)."""
        principal = current_principal()
        if principal is None:
            raise auth_errors.TokenMissing("CheckPermission needs a bearer token")
        if request.action not in ACTIONS:
            raise auth_errors.UnknownAction(
                f"{request.action!r} is not an action policies name",
                metadata={"action": request.action},
            )
        if not request.resource:
            raise errors.InvalidArgument("CheckPermission needs a resource")
        # A refusal is audited as the refused write it stands for (declarations:
        # audit_refusals): the action checked, not this method's.
        annotate_audit(action=request.action)
        if not request.every_under:
            self._authorizer.authorize(principal, request.action, (request.resource,))
        elif not self._authorizer.allows_under(principal, request.action, request.resource):
            raise auth_errors.PermissionDenied(
                f"{principal} may not {request.action} on every resource under "
                f"{request.resource} (no Allow covers them all, or a Deny may reach one)",
                metadata={
                    "principal": str(principal),
                    "action": request.action,
                    "resource": request.resource + "*",
                },
            )
        return pb.CheckPermissionResponse()

    def _own_policies(self, user_id: str, response: pb.WhoAmIResponse) -> None:
        token = ""
        while True:
            found, token = self._iam.list_effective_policies(user_id, 100, token)
            for record in found:
                if len(response.effective_policies) >= MAX_OWN_POLICIES:
                    response.effective_policies_truncated = True
                    return
                response.effective_policies.append(policy_to_proto(record))
            if not token:
                return

    # ---- users ----

    def CreateUser(self, request, context):
        return pb.CreateUserResponse(
            user=user_to_proto(
                self._iam.create_user(requested_id(request, "user_id"), request.email)
            )
        )

    def GetUser(self, request, context):
        user = self._iam.get_user(requested_id(request, "user_id"))
        return pb.GetUserResponse(user=user_to_proto(user))

    def ListUsers(self, request, context):
        return listed(
            pb.ListUsersResponse,
            "users",
            lambda: self._iam.list_users(request.page_size, request.page_token),
            user_to_proto,
        )

    def DeleteUser(self, request, context):
        user_id = requested_id(request, "user_id")
        self._iam.delete_user(user_id)
        self._authorizer.invalidate(user_id)
        return pb.DeleteUserResponse()

    # ---- credentials ----

    def CreateCredentials(self, request, context):
        record, secret = self._iam.create_credentials(request.user_id)
        return pb.CreateCredentialsResponse(
            credentials=credentials_to_proto(record), secret_access_key=secret
        )

    def GetCredentials(self, request, context):
        record = self._iam.get_user_credentials(request.user_id, request.access_key_id)
        return pb.GetCredentialsResponse(credentials=credentials_to_proto(record))

    def ListCredentials(self, request, context):
        return listed(
            pb.ListCredentialsResponse,
            "credentials",
            lambda: self._iam.list_credentials(
                request.user_id, request.page_size, request.page_token
            ),
            credentials_to_proto,
        )

    def DeleteCredentials(self, request, context):
        self._iam.delete_credentials(request.user_id, request.access_key_id)
        self._authorizer.invalidate()
        return pb.DeleteCredentialsResponse()

    # ---- groups ----

    def CreateGroup(self, request, context):
        return pb.CreateGroupResponse(
            group=group_to_proto(
                self._iam.create_group(requested_id(request, "group_id"), request.description)
            )
        )

    def GetGroup(self, request, context):
        group = self._iam.get_group(requested_id(request, "group_id"))
        return pb.GetGroupResponse(group=group_to_proto(group))

    def ListGroups(self, request, context):
        return listed(
            pb.ListGroupsResponse,
            "groups",
            lambda: self._iam.list_groups(request.page_size, request.page_token),
            group_to_proto,
        )

    def DeleteGroup(self, request, context):
        self._iam.delete_group(requested_id(request, "group_id"))
        self._authorizer.invalidate()
        return pb.DeleteGroupResponse()

    def AddGroupMember(self, request, context):
        self._iam.add_group_member(request.group_id, request.user_id)
        self._authorizer.invalidate(request.user_id)
        return pb.AddGroupMemberResponse()

    def RemoveGroupMember(self, request, context):
        self._iam.remove_group_member(request.group_id, request.user_id)
        self._authorizer.invalidate(request.user_id)
        return pb.RemoveGroupMemberResponse()

    def ListGroupMembers(self, request, context):
        return listed(
            pb.ListGroupMembersResponse,
            "users",
            lambda: self._iam.list_group_members(
                request.group_id, request.page_size, request.page_token
            ),
            user_to_proto,
        )

    def ListUserGroups(self, request, context):
        return listed(
            pb.ListUserGroupsResponse,
            "groups",
            lambda: self._iam.list_user_groups(
                request.user_id, request.page_size, request.page_token
            ),
            group_to_proto,
        )

    def CreatePolicy(self, request, context):
        record = self._iam.create_policy(
            requested_id(request, "policy_id"), requested_document(request)
        )
        return pb.CreatePolicyResponse(policy=policy_to_proto(record))

    def GetPolicy(self, request, context):
        policy = self._iam.get_policy(requested_id(request, "policy_id"))
        return pb.GetPolicyResponse(policy=policy_to_proto(policy))

    def ListPolicies(self, request, context):
        return listed(
            pb.ListPoliciesResponse,
            "policies",
            lambda: self._iam.list_policies(request.page_size, request.page_token),
            policy_to_proto,
        )

    def UpdatePolicy(self, request, context):
        record = self._iam.update_policy(
            requested_id(request, "policy_id"), requested_document(request)
        )
        # Every user the policy applies to (directly or through a group) decides anew.
        self._authorizer.invalidate()
        return pb.UpdatePolicyResponse(policy=policy_to_proto(record))

    def DeletePolicy(self, request, context):
        self._iam.delete_policy(requested_id(request, "policy_id"))
        self._authorizer.invalidate()
        return pb.DeletePolicyResponse()

    def AttachPolicyToUser(self, request, context):
        self._iam.attach_user_policy(request.user_id, request.policy_id)
        self._authorizer.invalidate(request.user_id)
        return pb.AttachPolicyToUserResponse()

    def DetachPolicyFromUser(self, request, context):
        self._iam.detach_user_policy(request.user_id, request.policy_id)
        self._authorizer.invalidate(request.user_id)
        return pb.DetachPolicyFromUserResponse()

    def AttachPolicyToGroup(self, request, context):
        self._iam.attach_group_policy(request.group_id, request.policy_id)
        self._authorizer.invalidate()
        return pb.AttachPolicyToGroupResponse()

    def DetachPolicyFromGroup(self, request, context):
        self._iam.detach_group_policy(request.group_id, request.policy_id)
        self._authorizer.invalidate()
        return pb.DetachPolicyFromGroupResponse()

    def AttachPolicy(self, request, context):
        self._iam.attach_policy(request.policy_id, request.user_id, request.group_id)
        # As AttachPolicyToUser / AttachPolicyToGroup: the user, or every member of the group.
        self._authorizer.invalidate(request.user_id or None)
        return pb.AttachPolicyResponse()

    def DetachPolicy(self, request, context):
        self._iam.detach_policy(request.policy_id, request.user_id, request.group_id)
        self._authorizer.invalidate(request.user_id or None)
        return pb.DetachPolicyResponse()

    def ListUserPolicies(self, request, context):
        return listed(
            pb.ListUserPoliciesResponse,
            "policies",
            lambda: self._iam.list_user_policies(
                request.user_id, request.page_size, request.page_token
            ),
            policy_to_proto,
        )

    def ListGroupPolicies(self, request, context):
        return listed(
            pb.ListGroupPoliciesResponse,
            "policies",
            lambda: self._iam.list_group_policies(
                request.group_id, request.page_size, request.page_token
            ),
            policy_to_proto,
        )

    def ListEffectivePolicies(self, request, context):
        return listed(
            pb.ListEffectivePoliciesResponse,
            "policies",
            lambda: self._iam.list_effective_policies(
                request.user_id, request.page_size, request.page_token
            ),
            policy_to_proto,
        )
