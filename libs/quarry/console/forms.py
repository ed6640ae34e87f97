"""What the console's write forms share: required fields, and the confirmation step every
deletion goes through.

Safety rule: nothing is deleted on one click or one forged request. Every post was checked
for the session's CSRF token before its page ran (quarry.console.app); a deletion must also
come from its confirmation page (`confirmed`: the post names the thing deleted, or for a
repository the user types its name), and the servers then decide with the user's token.
"""

from __future__ import annotations

from quarry import errors
from quarry.console.app import Context
from quarry.console.http import Response


class ConfirmationRequired(errors.InvalidArgument):
    reason = "CONFIRMATION_REQUIRED"


class MissingField(errors.InvalidArgument):
    reason = "FORM_FIELD_MISSING"


def required(ctx: Context, *names: str) -> list[str]:
    """The stripped values of form fields that must not be empty (FORM_FIELD_MISSING, 400,
    naming the first empty one)."""
    values = []
    for name in names:
        value = ctx.request.field(name).strip()
        if not value:
            raise MissingField(f"the form needs a value for {name!r}")
        values.append(value)
    return values


def confirm_page(  # noqa: PLR0913 — what one confirmation page says and posts
    ctx: Context,
    *,
    title: str,
    action: str,
    name: str,
    fields: dict[str, str],
    detail: str,
    cancel: str,
    button: str = "Delete permanently",
) -> Response:
    """The confirmation step of a deletion: a page that says what goes and posts `fields`
    plus `confirm=<name>` (and the CSRF token) to `action`."""
    return ctx.render(
        "confirm.html",
        title=title,
        action=action,
        confirm_name=name,
        fields=fields,
        detail=detail,
        cancel=cancel,
        button=button,
    )


def confirmed(ctx: Context, name: str) -> None:
    """The guard of every deletion but a repository's (which needs its name typed): the post
    must come from the confirmation page, which names the thing deleted (`confirm=<name>`).
    A post without it, or naming another thing (a forged or stale form), deletes nothing:
    CONFIRMATION_REQUIRED (400)."""
    if not name or ctx.request.field("confirm") != name:
        raise ConfirmationRequired(
            f"deleting {name!r} needs the form of its confirmation page (confirm={name!r})"
        )
