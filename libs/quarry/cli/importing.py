"""`quarry import`: zero-copy import of a lake into a branch (docs/import.md), like lakectl's.

    quarry import --from SOURCE --to quarry://REPO/BRANCH/PATH [--from ... --to ...]
                  [-m MESSAGE] [--no-wait]
    quarry import status REPO/ID
    quarry import cancel REPO/ID

Waiting draws a progress line (objects listed, objects/s) on a terminal; Ctrl-C asks
whether to cancel the import (the import runs in the committer: leaving the CLI does not
stop it). (`quarry store export` / `store import` dump and load the KV store itself.)
"""

from __future__ import annotations

import argparse
import sys
import time

from quarry.cli import output
from quarry.cli.base import CliError, Context, Subparsers, UsageError, command, progress_option
from quarry.cli.progress import Progress, human_bytes
from quarry.v1 import committer_pb2 as cm

POLL_SECONDS = 0.5
STATES = {
    cm.IMPORT_STATE_RUNNING: "RUNNING",
    cm.IMPORT_STATE_COMPLETED: "COMPLETED",
    cm.IMPORT_STATE_FAILED: "FAILED",
    cm.IMPORT_STATE_CANCELLED: "CANCELLED",
}


def _destinations(args: argparse.Namespace) -> tuple[str, str, list[tuple[str, str]]]:
    from quarry.spark.common import InvalidQuarryUri, parse_uri

    sources, targets = args.sources or [], args.targets or []
    if not sources or len(sources) != len(targets):
        raise UsageError(
            "give each --from SOURCE its --to quarry://REPO/BRANCH/PATH (at least one pair)"
        )
    pairs: list[tuple[str, str]] = []
    where: set[tuple[str, str]] = set()
    for source, target in zip(sources, targets, strict=True):
        try:
            uri = parse_uri(target)
        except InvalidQuarryUri as exc:
            raise CliError("INVALID_ARGUMENT", str(exc)) from None
        where.add((uri.repository, uri.ref))
        pairs.append((source, uri.path))
    if len(where) != 1:
        raise UsageError("every --to of one import names the same repository and branch")
    repository, branch = where.pop()
    return repository, branch, pairs


def _id(args: argparse.Namespace) -> tuple[str, str]:
    repository, _, import_id = args.id.rpartition("/")
    repository = args.repo or repository
    if not repository or not import_id:
        raise CliError("INVALID_ARGUMENT", "name the import as REPO/ID (or ID with --repo REPO)")
    return repository, import_id


def _show(status: cm.Import, json: bool) -> None:
    if json:
        output.print_json(status)
        return
    fields = [
        ("import", f"{status.repository}/{status.id}"),
        ("branch", status.branch),
        ("state", STATES.get(status.state, str(status.state))),
        ("sources", ", ".join(f"{s.uri} -> {s.destination_path or '/'}" for s in status.sources)),
        ("objects", f"{status.objects_listed:,} ({human_bytes(status.bytes_listed)})"),
        ("skipped", f"{status.objects_skipped:,}"),
        ("ranges written", f"{status.ranges_written:,}"),
    ]
    if status.error:
        fields.append(("error", status.error))
    if status.HasField("commit") and status.commit.id:
        fields.append(("commit", output.short_id(status.commit.id)))
    output.fields(fields)


def _ask_to_cancel() -> bool:
    if not sys.stdin.isatty():
        return False
    print("\nCancel the import? [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        answer = sys.stdin.readline()
    except KeyboardInterrupt:
        return True  # a second Ctrl-C: yes
    return answer.strip().lower() in ("y", "yes")


def _wait(ctx: Context, status: cm.Import, show_progress: bool) -> cm.Import:
    client = ctx.client
    bar = Progress("importing", unit="objects", enabled=True if show_progress else None)
    cancelled = False
    while status.state == cm.IMPORT_STATE_RUNNING:
        try:
            bar.update(status.objects_listed)
            time.sleep(POLL_SECONDS)
            status = client.get_import_status(status.repository, status.id)
        except KeyboardInterrupt:
            bar.clear()
            if cancelled or _ask_to_cancel():
                cancelled = True
                status = client.cancel_import(status.repository, status.id)
                continue
            print(
                f"\nThe import continues in the committer: "
                f"quarry import status {status.repository}/{status.id}",
                file=sys.stderr,
            )
            raise
    bar.update(status.objects_listed)
    bar.close()
    return status


@command
def start(args: argparse.Namespace, ctx: Context) -> int:
    repository, branch, pairs = _destinations(args)
    status = ctx.client.start_import(repository, branch, pairs, message=args.message or "")
    if args.no_wait:
        if ctx.json:
            output.print_json(status)
        else:
            # stdout is the id `quarry import status|cancel` take; the words go to stderr.
            print(f"import {repository}/{status.id} started", file=sys.stderr)
            print(f"{repository}/{status.id}")
        return 0
    print(f"import {repository}/{status.id} started", file=sys.stderr)
    status = _wait(ctx, status, args.progress)
    _show(status, ctx.json)
    return 0 if status.state == cm.IMPORT_STATE_COMPLETED else 1


@command
def show(args: argparse.Namespace, ctx: Context) -> int:
    repository, import_id = _id(args)
    _show(ctx.client.get_import_status(repository, import_id), ctx.json)
    return 0


@command
def cancel(args: argparse.Namespace, ctx: Context) -> int:
    repository, import_id = _id(args)
    _show(ctx.client.cancel_import(repository, import_id), ctx.json)
    return 0


def register_import(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    text = (
        "zero-copy import of a lake into a branch: list the sources and commit their "
        "objects, addresses kept (nothing is copied), in one commit that replaces "
        "everything under each destination path; staged changes stay staged"
    )
    parser = sub.add_parser("import", help=text, description=text, parents=[common])
    parser.add_argument(
        "--from",
        dest="sources",
        action="append",
        metavar="SOURCE",
        help="s3://bucket/prefix, file:///abs/dir or /abs/dir (repeat with --to)",
    )
    parser.add_argument(
        "--to",
        dest="targets",
        action="append",
        metavar="quarry://REPO/BRANCH/PATH",
        help="where the SOURCE's keys land (the import owns PATH)",
    )
    parser.add_argument("-m", "--message", help="commit message (default: Import from ...)")
    parser.add_argument(
        "--no-wait", action="store_true", help="print the import's id and return at once"
    )
    progress_option(parser)
    parser.set_defaults(func=start)
    actions = parser.add_subparsers(dest="import_action", metavar="ACTION")
    for name, handler, help_text in (
        ("status", show, "an import's state, objects listed and commit"),
        ("cancel", cancel, "stop a running import (the branch stays as it was)"),
    ):
        p = actions.add_parser(name, help=help_text, description=help_text, parents=[common])
        p.add_argument(
            "id", metavar="REPO/ID", help="the import: REPO/ID as StartImport printed it"
        )
        p.add_argument("--repo", help="the repository, when ID is given alone")
        p.set_defaults(func=handler)


COMMANDS = {"import": register_import}
