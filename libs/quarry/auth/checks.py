"""Authorization checks that need what the servicer knows (the declaration table checks
only what a request names): who the committer is, and whether staged addresses lie outside
the repository's storage namespace.

Both act on the principal of the call being served (interceptor.current_principal()); with
auth off there is none and the request is taken as it is.

Safety rules: a user never records another user as committer without
`auth:CommitAsOtherUser` (Admins have it); a user never stages an address outside the
repository's namespace without `fs:ImportFromStorage` on every place it points at, nor one
inside it unless they may read every object of the repository or a Quarry service relays
the call (bytes it wrote for them). Neither check is ever skipped for a user principal.
"""

from __future__ import annotations

from collections.abc import Iterable

from quarry.auth import errors as auth_errors
from quarry.auth.authorizer import Authorizer
from quarry.auth.interceptor import current_principal
from quarry.auth.policy import object_arn, storage_arn, user_arn
from quarry.graveler.reach import place, reached

COMMIT_AS_OTHER_USER = "auth:CommitAsOtherUser"
IMPORT_FROM_STORAGE = "fs:ImportFromStorage"
READ_OBJECT = "fs:ReadObject"


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
    repository: str,
    storage_namespace: str,
    entries: Iterable[tuple[str, str]],
) -> None:
    """`fs:ImportFromStorage` on the place (`arn:quarry:fs:::storage/<address>`, as an
    import's source) of every (path, physical address) of `entries` whose address a reader
    opens outside `storage_namespace`, for a user caller (PERMISSION_DENIED otherwise).

    Inside the namespace too, for a user who may not read every object of `repository`
    (fs:ReadObject on all of `repository/REPO/object/`, quarry.auth.policy.allows_under),
    unless a Quarry service relays the call (Principal.relayed_by: the S3 gateway and the
    console stage only bytes they wrote for the user, or a copy of an object they read as
    the user). An entry is read wherever its address points: without this, a user allowed
    to write one path and list the others restaged another object's address (ListObjects
    shows it) under their own path and read the bytes a Deny keeps from them (tester hAK).

    Where an address points is decided by quarry.graveler.reach (a local address by its
    real path, so a link inside the namespace pointing out is outside); an address with a
    `..`, `.` or empty segment is refused there (INVALID_PHYSICAL_ADDRESS) before any
    answer. A caller asks needs_namespace first (it skips users allowed the action
    everywhere). Where any caller's address may point at all is the domain's rule
    (AddressRules), checked when the entries are staged."""
    principal = current_principal()
    if principal is None or principal.is_service or authorizer is None:
        return
    inside_too = not principal.relayed_by and not authorizer.allows_under(
        principal, READ_OBJECT, object_arn(repository, "")
    )
    places = tuple(
        storage_arn(place(one.kind, one.where))
        for one in reached(storage_namespace, entries)
        if inside_too or not one.inside
    )
    if not places:
        return
    try:
        authorizer.authorize(principal, IMPORT_FROM_STORAGE, places)
    except auth_errors.PermissionDenied as exc:
        if inside_too:  # say why an upload of one's own may need it
            raise auth_errors.PermissionDenied(
                f"{exc.message}: staging an address, even inside the repository's storage "
                f"namespace, needs it from a user who may not read every object of "
                f"{repository!r} (it could be another object's); upload through the S3 "
                "gateway or the console, which stage the bytes they store for you",
                metadata=exc.metadata,
            ) from None
        raise


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
