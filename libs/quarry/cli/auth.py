"""`quarry auth token [--service NAME] | whoami | users | credentials | groups | policies`.

The resources have a module each (auth_users, auth_credentials, auth_groups, auth_policies)
whose `register` adds its actions under `quarry auth`; this module holds the session
commands and builds the `auth` group.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from quarry.cli import auth_credentials, auth_groups, auth_policies, auth_users, output
from quarry.cli.base import CliError, Context, Subparsers, command, group, leaf

SIGNING_KEY_ENV = "QUARRY_AUTH_SIGNING_KEY"
SIGNING_KEY_FILE = "signing.key"


def signing_key(settings: object) -> str:
    """The suite's signing key as the services read it: `auth_signing_key`, else the file
    `auth_signing_key_file` (default `$QUARRY_HOME/signing.key`)."""
    key = getattr(settings, "auth_signing_key", None)
    if key is None:  # settings without the auth fields: read the variable itself
        key = os.environ.get(SIGNING_KEY_ENV, "")
    if key:
        return key
    path = Path(
        getattr(settings, "auth_signing_key_file", "") or Path(settings.home) / SIGNING_KEY_FILE  # type: ignore[attr-defined]
    )
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        raise CliError(
            "NO_SIGNING_KEY",
            f"no signing key: set {SIGNING_KEY_ENV} or create {path} (quarry up does)",
        ) from None


@command
def auth_token(args: argparse.Namespace, ctx: Context) -> int:
    """A bearer token: the current credentials' (Auth/Login), or with --service a service
    token minted locally from the signing key (for operators who hold the key)."""
    if args.service:
        from quarry.auth.tokens import TokenAuthority

        try:
            authority = TokenAuthority(signing_key(ctx.settings))
        except ValueError as exc:
            raise CliError("INVALID_SIGNING_KEY", str(exc)) from None
        token, _ = authority.issue_service_token(args.service)
    else:
        token = ctx.client.token()
    if ctx.json:
        output.print_json({"token": token})
    else:
        print(token)
    return 0


@command
def auth_whoami(args: argparse.Namespace, ctx: Context) -> int:
    me = ctx.client.whoami()
    if ctx.json:
        output.print_json(me)
        return 0
    fields = [("kind", me.principal_kind), ("id", me.principal_id)]
    if me.HasField("user"):
        fields += [("email", me.user.email or "-")]
        fields += [("created", output.timestamp_text(me.user.created_at))]
    output.fields(fields)
    return 0


def register_auth(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    auth = group(sub, "auth", "tokens, users, credentials, groups and policies")
    p = leaf(common, auth, "token", auth_token, "print a bearer token (grpcurl -H ...)")
    p.add_argument(
        "--service", metavar="NAME", help="mint a service token from the local signing key"
    )
    leaf(common, auth, "whoami", auth_whoami, "show who the current credentials are")
    for module in (auth_users, auth_credentials, auth_groups, auth_policies):
        module.register(auth, common)


COMMANDS = {"auth": register_auth}
