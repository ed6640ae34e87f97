"""`quarry auth credentials create USER | list USER | delete USER KEY | env`."""

from __future__ import annotations

import argparse
import shlex
import sys

from quarry.cli import output
from quarry.cli.base import EXIT_FAILURE, Context, Subparsers, command, confirm, group, leaf
from quarry.client.credentials import ACCESS_KEY_ENV, SECRET_KEY_ENV, load_credentials
from quarry.config import load_settings


@command
def credentials_create(args: argparse.Namespace, ctx: Context) -> int:
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
        return 0
    print(f"Created credentials for {args.user}")
    print(f"  access key id:     {key_id}")
    print(f"  secret access key: {created.secret_access_key}  (shown this once)")
    return 0


@command
def credentials_list(args: argparse.Namespace, ctx: Context) -> int:
    output.listing(
        list(ctx.client.iter_credentials(args.user)),
        ctx.json,
        ("ACCESS KEY ID", "USER", "CREATED"),
        lambda c: (c.access_key_id, c.user_id, output.timestamp_text(c.created_at)),
    )
    return 0


@command
def credentials_delete(args: argparse.Namespace, ctx: Context) -> int:
    """Never deletes without --yes or a "y" typed on a terminal (confirm)."""
    if not args.yes:
        confirm(f"Delete access key {args.key!r} of {args.user!r}?", "--yes")
    ctx.client.delete_credentials(args.user, args.key)
    if ctx.json:
        output.print_json({"deleted": args.key})
    else:
        print(f"Deleted access key {args.key} of {args.user}")
    return 0


def credentials_env(args: argparse.Namespace) -> int:
    """The CLI's own credentials (the environment's, else $QUARRY_HOME/credentials.json) as
    shell `export` lines for S3 tools: `eval "$(quarry auth credentials env)"`, as
    `aws configure export-credentials --format env` does. Prints a secret, so only to the
    user's own stdout; nothing is sent anywhere."""
    found = load_credentials()
    if found is None:
        print(
            f"quarry: NO_CREDENTIALS: set {ACCESS_KEY_ENV} and {SECRET_KEY_ENV}, or run "
            "`quarry setup` / `quarry up` (they write $QUARRY_HOME/credentials.json)",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    variables = {
        "AWS_ACCESS_KEY_ID": found.access_key_id,
        "AWS_SECRET_ACCESS_KEY": found.secret_access_key,
        # The region the s3-gateway answers GetBucketLocation with (tools without one refuse).
        "AWS_DEFAULT_REGION": load_settings().s3_gateway_region,
    }
    if getattr(args, "json", False):
        output.print_json(variables)
        return 0
    for name, value in variables.items():
        print(f"export {name}={shlex.quote(value)}")
    return 0


def register(auth: Subparsers, common: argparse.ArgumentParser) -> None:
    creds = group(auth, "credentials", "create, list and delete a user's access keys")
    p = leaf(common, creds, "create", credentials_create, "create an access key (secret once)")
    p.add_argument("user", metavar="USER")
    p = leaf(common, creds, "list", credentials_list, "list a user's access keys")
    p.add_argument("user", metavar="USER")
    leaf(
        common,
        creds,
        "env",
        credentials_env,
        "print the CLI's own credentials as AWS_* export lines for S3 tools (the s3-gateway)",
    )
    p = leaf(common, creds, "delete", credentials_delete, "delete an access key")
    p.add_argument("user", metavar="USER")
    p.add_argument("key", metavar="KEY")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
