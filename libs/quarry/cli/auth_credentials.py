"""`quarry auth credentials create USER | list USER | delete USER KEY`."""

from __future__ import annotations

import argparse

from quarry.cli import output
from quarry.cli.base import Context, Subparsers, command, confirm, group, leaf


@command
def credentials_create(args: argparse.Namespace, ctx: Context) -> None:
    """Prints the secret this once: the server keeps only its hash."""
    created = ctx.client.create_credentials(args.user)
    key_id = created.credentials.access_key_id
    if ctx.json:
        output.print_json(
            {
                "user_id": args.user,
                "access_key_id": key_id,
                "secret_access_key": created.secret_access_key,
            }
        )
        return
    print(f"Created credentials for {args.user}")
    print(f"  access key id:     {key_id}")
    print(f"  secret access key: {created.secret_access_key}  (shown this once)")


@command
def credentials_list(args: argparse.Namespace, ctx: Context) -> None:
    found = list(ctx.client.iter_credentials(args.user))
    if ctx.json:
        output.print_json(found)
        return
    output.table(
        ["ACCESS KEY ID", "USER", "CREATED"],
        [(c.access_key_id, c.user_id, output.timestamp_text(c.created_at)) for c in found],
    )


@command
def credentials_delete(args: argparse.Namespace, ctx: Context) -> None:
    """Never deletes without --yes or a "y" typed on a terminal (confirm)."""
    if not args.yes:
        confirm(f"Delete access key {args.key!r} of {args.user!r}?", "--yes")
    ctx.client.delete_credentials(args.user, args.key)
    if ctx.json:
        output.print_json({"deleted": args.key})
    else:
        print(f"Deleted access key {args.key} of {args.user}")


def register(auth: Subparsers, common: argparse.ArgumentParser) -> None:
    creds = group(auth, "credentials", "create, list and delete a user's access keys")
    p = leaf(common, creds, "create", credentials_create, "create an access key (secret once)")
    p.add_argument("user", metavar="USER")
    p = leaf(common, creds, "list", credentials_list, "list a user's access keys")
    p.add_argument("user", metavar="USER")
    p = leaf(common, creds, "delete", credentials_delete, "delete an access key")
    p.add_argument("user", metavar="USER")
    p.add_argument("key", metavar="KEY")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
