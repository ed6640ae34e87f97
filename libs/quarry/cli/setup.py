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
from collections.abc import Callable
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


def wait_for_branch_manager(
    settings: object, wait_seconds: float, say: Callable[[str], None] | None = None
) -> str:
    """Wait while the branch-manager is starting -- its port refuses connections, or it
    answers NOT_SERVING (its dependencies not up yet) -- for at most `wait_seconds`; ""
    once it is SERVING, else the last answer. Setup is the first call made to services
    started a moment before (`quarry up`, the docs' `quarry serve ... &` lines). Any other
    answer -- a TLS failure, a name that does not resolve, a timeout -- is not waited out:
    the call that follows reports it as every command does. `say` is told once that it
    waits."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from quarry.cli.base import CONNECTION_REFUSED
    from quarry.runtime.channels import open_channel
    from quarry.runtime.tls import channel_security

    address = settings.branch_manager_address  # type: ignore[attr-defined]
    channel = open_channel(address, traced=False, security=channel_security(settings))
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + wait_seconds
    told = False
    try:
        while True:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0)
            except grpc.RpcError as error:
                details = (error.details() or "") if hasattr(error, "details") else ""
                starting = (
                    error.code() == grpc.StatusCode.UNAVAILABLE
                    and CONNECTION_REFUSED in details.lower()
                )
                last = f"the branch-manager at {address} does not answer ({details})"
            else:
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return ""
                starting = True
                last = f"the branch-manager at {address} is starting (NOT_SERVING)"
            if not starting or time.monotonic() > deadline:
                return last
            if say is not None and not told:
                say(f"waiting for the branch-manager at {address} to start...")
                told = True
            time.sleep(0.2)
    finally:
        channel.close()


@command
def cmd_setup(args: argparse.Namespace, ctx: Context) -> int:
    home = Path(ctx.settings.home)
    _stored_or_refuse(home)  # before any wait: nothing to wait for then
    # A branch-manager still starting is waited for (within --timeout); whatever else it
    # answers, the setup call below reports as any command would.
    wait = min(SETUP_WAIT_SECONDS, float(getattr(args, "timeout", SETUP_WAIT_SECONDS)))
    wait_for_branch_manager(ctx.settings, wait, say=lambda text: print(text, file=sys.stderr))
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
