"""`quarry setup`: the first admin of an empty installation (Auth/Setup, like `lakefs setup`),
its credentials stored in `$QUARRY_HOME/credentials.json` (mode 0600) for the CLI, the
Python client and Spark. `quarry up` runs the same on first start (first_start_setup).

Safety rule: setup never overwrites an existing credentials file (another admin's key would
be lost) and never prints the secret except once, right after it is created.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TextIO

from quarry import errors
from quarry.cli import output
from quarry.cli.base import CliError, Context, Subparsers, command
from quarry.client import Client, Credentials, write_credentials
from quarry.client.credentials import credentials_path

ADMIN_EXISTS = "ADMIN_EXISTS"
# How long `quarry setup` waits for a branch-manager that is still starting.
SETUP_WAIT_SECONDS = 30.0


def _stored_or_refuse(home: Path) -> Path:
    path = credentials_path(home)
    if path.exists():
        raise CliError(
            "CREDENTIALS_FILE_EXISTS",
            f"{path} exists already; move it away first (it may be the only copy of a key)",
        )
    return path


def run_setup(
    client: Client, home: Path, user_id: str = "admin", access_key_id: str = "", secret: str = ""
) -> Credentials:
    """Auth/Setup, then the credentials written to `home` (0600). Raises AdminExists
    (FAILED_PRECONDITION / ADMIN_EXISTS) once the installation has an admin."""
    _stored_or_refuse(home)
    reply = client.setup(user_id, access_key_id, secret)
    credentials = Credentials(reply.credentials.access_key_id, reply.credentials.secret_access_key)
    write_credentials(credentials, home)
    return credentials


def first_start_setup(client: Client, home: Path, out: TextIO | None = None) -> None:
    """What `quarry up` does once the services are SERVING: with no credentials file, create
    the admin and store its credentials; if an admin exists already, say how to get some.
    Never fails `quarry up` (the services run either way)."""
    out = out if out is not None else sys.stdout
    path = credentials_path(home)
    if path.exists():
        print(f"  credentials: {path}", file=out)
        return
    given = _credentials_from_environment()
    try:
        if given is not None:
            # The operator chose the admin's key (QUARRY_ACCESS_KEY_ID / _SECRET_ACCESS_KEY):
            # the admin gets exactly that key, and nothing is written (the env holds it).
            client.setup("admin", given.access_key_id, given.secret_access_key)
            print(
                f"  admin user created with access key id {given.access_key_id} "
                f"(from QUARRY_ACCESS_KEY_ID)",
                file=out,
            )
            return
        credentials = run_setup(client, home)
    except errors.Unimplemented:
        return  # no Auth service: this installation runs without authentication
    except errors.QuarryError as exc:
        if exc.reason == ADMIN_EXISTS:
            print(
                f"  this installation has an admin already, and {path} does not exist: set "
                "QUARRY_ACCESS_KEY_ID and QUARRY_SECRET_ACCESS_KEY, or have an admin run "
                "`quarry auth credentials create USER`",
                file=out,
            )
        else:
            print(f"  admin setup failed: {exc.reason}: {exc.message}", file=out)
        return
    print(
        f"  admin user created; access key id {credentials.access_key_id}, credentials "
        f"stored in {path} (mode 0600)",
        file=out,
    )


def _credentials_from_environment() -> Credentials | None:
    import os

    key_id = os.environ.get("QUARRY_ACCESS_KEY_ID", "")
    secret = os.environ.get("QUARRY_SECRET_ACCESS_KEY", "")
    return Credentials(key_id, secret) if key_id and secret else None


def wait_for_branch_manager(settings: object, wait_seconds: float) -> errors.QuarryError | None:
    """Wait until branch-manager answers its health check as SERVING, for at most
    `wait_seconds`; None once it does, else why not. Setup is the first call made to
    services started a moment before (`quarry up`, the docs' `quarry serve ... &` lines):
    it waits for them rather than failing on a port not bound yet."""
    from quarry.runtime.server import service_dependency
    from quarry.runtime.tls import channel_security

    branch_manager = service_dependency(
        "branch-manager",
        settings.branch_manager_address,  # type: ignore[attr-defined]
        security=channel_security(settings),
    )
    deadline = time.monotonic() + wait_seconds
    try:
        while True:
            try:
                branch_manager.probe(2.0)
                return None
            except errors.QuarryError as exc:
                if time.monotonic() > deadline:
                    return exc
                time.sleep(0.2)
    finally:
        branch_manager.close()


@command
def cmd_setup(args: argparse.Namespace, ctx: Context) -> int:
    home = Path(ctx.settings.home)
    _stored_or_refuse(home)  # before any wait: nothing to wait for then
    unreachable = wait_for_branch_manager(ctx.settings, SETUP_WAIT_SECONDS)
    if unreachable is not None:
        raise unreachable
    credentials = run_setup(
        ctx.client, home, args.user_id, args.access_key_id or "", args.secret_access_key or ""
    )
    path = credentials_path(home)
    if ctx.json:
        output.print_json(
            {
                "user_id": args.user_id,
                "access_key_id": credentials.access_key_id,
                "secret_access_key": credentials.secret_access_key,
                "credentials_file": str(path),
            }
        )
        return 0
    print(f"Created admin user {args.user_id}; credentials stored in {path} (mode 0600)")
    print(f"  access key id:     {credentials.access_key_id}")
    print(f"  secret access key: {credentials.secret_access_key}  (shown this once)")
    return 0


def register_setup(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    text = "create the first admin user and store its credentials in QUARRY_HOME"
    parser = sub.add_parser("setup", help=text, description=text, parents=[common])
    parser.add_argument(
        "--user-id", default="admin", metavar="USER", help="the admin's user id (default: admin)"
    )
    parser.add_argument(
        "--access-key-id",
        metavar="KEY",
        help="choose the access key id (with --secret-access-key; default: a new random one)",
    )
    parser.add_argument(
        "--secret-access-key",
        metavar="SECRET",
        help="choose the secret (with --access-key-id; default: a new random one)",
    )
    parser.set_defaults(func=cmd_setup)


COMMANDS = {"setup": register_setup}
