"""Authorization checks that need what the servicer knows (the declaration table checks
only what a request names): who the committer is, and whether staged addresses lie outside
the repository's storage namespace.

Both act on the principal of the call being served (interceptor.current_principal()); with
auth off there is none and the request is taken as it is.

Safety rules: a user never records another user as committer without
`auth:CommitAsOtherUser` (Admins have it); a user never stages an address outside the
repository's namespace without `fs:ImportFromStorage` on every place it points at. Neither check
is ever skipped for a user principal.
"""

from __future__ import annotations

from collections.abc import Iterable

from quarry.auth.authorizer import Authorizer
from quarry.auth.interceptor import current_principal
from quarry.auth.policy import storage_arn, user_arn
from quarry.graveler.reach import outside_namespace, place

COMMIT_AS_OTHER_USER = "auth:CommitAsOtherUser"
IMPORT_FROM_STORAGE = "fs:ImportFromStorage"


def committer_for(requested: str, authorizer: Authorizer | None) -> str:
    """The committer to record: the calling user when the request names none or names the
    caller; another user's id only when the caller may `auth:CommitAsOtherUser` on that user
    (PERMISSION_DENIED naming action and resource otherwise). A service (or no auth) keeps
    the request's value."""
    principal = current_principal()
    if principal is None or principal.is_service or authorizer is None:
        return requested
    if not requested or requested == principal.id:
        return principal.id
    authorizer.authorize(principal, COMMIT_AS_OTHER_USER, (user_arn(requested),))
    return requested


def check_import(
    authorizer: Authorizer | None,
    storage_namespace: str,
    entries: Iterable[tuple[str, str]],
) -> None:
    """`fs:ImportFromStorage` on the place (`arn:quarry:fs:::storage/<address>`, as an
    import's source) of every (path, physical address) of `entries` whose address a reader
    opens outside `storage_namespace`, for a user caller (PERMISSION_DENIED otherwise).
    Where an address points is decided by quarry.graveler.reach (outside_namespace: a local
    address by its real path, so a link inside the namespace pointing out is outside); an
    address with a `..`, `.` or empty segment is refused there (INVALID_PHYSICAL_ADDRESS)
    before any answer. A caller asks needs_namespace first (it skips users allowed the
    action everywhere). Where any caller's address may point at all is the domain's rule
    (AddressRules), checked when the entries are staged."""
    principal = current_principal()
    if principal is None or principal.is_service or authorizer is None:
        return
    outside = tuple(
        storage_arn(place(kind, where))
        for _, _, kind, where in outside_namespace(storage_namespace, entries)
    )
    if outside:
        authorizer.authorize(principal, IMPORT_FROM_STORAGE, outside)


def needs_namespace(authorizer: Authorizer | None, entries: Iterable[tuple[str, str]]) -> bool:
    """Whether check_import has anything to look at: a user call staging addresses, by a
    user not allowed the import on every object (Authorizer.allows_everywhere: an Allow on
    "*" naming it, no Deny naming it; then where each address points cannot change the
    answer, and the addresses themselves are checked when the entries are). Decided before
    any per-entry work or the repository's namespace is looked up."""
    principal = current_principal()
    if principal is None or principal.is_service or authorizer is None:
        return False
    if authorizer.allows_everywhere(principal, IMPORT_FROM_STORAGE):
        return False
    return any(address for _, address in entries)
