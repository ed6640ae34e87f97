"""The errors of identity and access. Each carries its gRPC code and an ErrorInfo reason.

UNAUTHENTICATED reasons say exactly why a token or a login was refused, so an operator can
tell an expired token from a forged one; PERMISSION_DENIED names the action and resource.
"""

from __future__ import annotations

from quarry import errors

# The bases live in quarry.errors (clients rebuild them by code); the same classes here.
Unauthenticated = errors.Unauthenticated


class TokenMissing(Unauthenticated):
    reason = "TOKEN_MISSING"


class TokenMalformed(Unauthenticated):
    reason = "TOKEN_MALFORMED"


class TokenExpired(Unauthenticated):
    reason = "TOKEN_EXPIRED"


class TokenInvalidSignature(Unauthenticated):
    reason = "TOKEN_INVALID_SIGNATURE"


class TokenAlgorithm(Unauthenticated):
    reason = "TOKEN_ALGORITHM"


class TokenTypeUnknown(Unauthenticated):
    reason = "TOKEN_TYPE_UNKNOWN"


class TokenNotYetValid(Unauthenticated):
    """A token issued (`iat`) in the future, past the allowed clock skew."""

    reason = "TOKEN_NOT_YET_VALID"


class TokenLifetimeExceeded(Unauthenticated):
    """A token whose `exp - iat` is longer than any token Quarry issues."""

    reason = "TOKEN_LIFETIME_EXCEEDED"


class PrincipalUnknown(Unauthenticated):
    """A well-signed token of a user that no longer exists."""

    reason = "PRINCIPAL_UNKNOWN"


class CredentialRevoked(Unauthenticated):
    """A well-signed token issued against a credential that was deleted since."""

    reason = "CREDENTIAL_REVOKED"


class InvalidCredentials(Unauthenticated):
    """Login with an unknown access key id or a wrong secret (one answer for both)."""

    reason = "INVALID_CREDENTIALS"


PermissionDenied = errors.PermissionDenied


class ServicePrincipalRequired(PermissionDenied):
    """An internal RPC called by a user (even an admin): only the suite's services may."""

    reason = "SERVICE_PRINCIPAL_REQUIRED"


class InvalidPolicy(errors.InvalidArgument):
    reason = "INVALID_POLICY"


class UnknownAction(errors.InvalidArgument):
    reason = "UNKNOWN_ACTION"


class InvalidIamId(errors.InvalidArgument):
    reason = "INVALID_IAM_ID"


class OnePrincipalRequired(errors.InvalidArgument):
    """AttachPolicy / DetachPolicy naming neither or both of a user and a group."""

    reason = "ONE_PRINCIPAL_REQUIRED"


class ConflictingIds(errors.InvalidArgument):
    """A request naming its user, group or policy twice, by `id` and by `<kind>_id`, with
    two different ids (quarry.auth.request_ids)."""

    reason = "CONFLICTING_IDS"


class UserNotFound(errors.NotFound):
    reason = "USER_NOT_FOUND"


class GroupNotFound(errors.NotFound):
    reason = "GROUP_NOT_FOUND"


class PolicyNotFound(errors.NotFound):
    reason = "POLICY_NOT_FOUND"


class CredentialsNotFound(errors.NotFound):
    reason = "CREDENTIALS_NOT_FOUND"


class UserExists(errors.AlreadyExists):
    reason = "USER_EXISTS"


class GroupExists(errors.AlreadyExists):
    reason = "GROUP_EXISTS"


class PolicyExists(errors.AlreadyExists):
    reason = "POLICY_EXISTS"


class PolicyChanged(errors.Aborted):
    """UpdatePolicy raced another update or a delete of the same policy: read and retry."""

    reason = "POLICY_CHANGED"


class AdminExists(errors.FailedPrecondition):
    """setup_admin on an installation that already has an admin."""

    reason = "ADMIN_EXISTS"
