"""`quarry auth policies create NAME --file POLICY.json | update NAME --file POLICY.json |
list | show | delete | attach | detach` (`--user U` or `--group G`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quarry.cli import output
from quarry.cli.base import Context, Subparsers, command, confirm, group, leaf


@command
def policies_create(args: argparse.Namespace, ctx: Context) -> int:
    """The document is sent as written; the server validates it (INVALID_POLICY naming the
    statement and field)."""
    _send_document(args, ctx, ctx.client.create_policy, "Created")
    return 0


@command
def policies_update(args: argparse.Namespace, ctx: Context) -> int:
    """Replaces the policy's document (it must exist); validated by the server as create."""
    _send_document(args, ctx, ctx.client.update_policy, "Updated")
    return 0


def _send_document(
    args: argparse.Namespace, ctx: Context, send: Callable[[str, str], Any], done: str
) -> None:
    policy = send(args.name, Path(args.file).read_text())
    if ctx.json:
        output.print_json(policy)
    else:
        print(f"{done} policy {policy.id}")


@command
def policies_list(args: argparse.Namespace, ctx: Context) -> int:
    if args.user:
        policies = list(ctx.client.iter_user_policies(args.user, effective=args.effective))
    elif args.group:
        policies = list(ctx.client.iter_group_policies(args.group))
    else:
        policies = list(ctx.client.iter_policies())
    output.listing(
        policies, ctx.json, ("ID", "CREATED"), lambda p: (p.id, output.timestamp_text(p.created_at))
    )
    return 0


@command
def policies_show(args: argparse.Namespace, ctx: Context) -> int:
    policy = ctx.client.get_policy(args.name)
    if ctx.json:
        output.print_json(policy)
        return 0
    output.fields([("id", policy.id), ("created", output.timestamp_text(policy.created_at))])
    print(policy.document)
    return 0


@command
def policies_delete(args: argparse.Namespace, ctx: Context) -> int:
    """Never deletes without --yes or a "y" typed on a terminal (confirm)."""
    if not args.yes:
        confirm(f"Delete policy {args.name!r} and detach it everywhere?", "--yes")
    ctx.client.delete_policy(args.name)
    if ctx.json:
        output.print_json({"deleted": args.name})
    else:
        print(f"Deleted policy {args.name}")
    return 0


@command
def policies_attach(args: argparse.Namespace, ctx: Context) -> int:
    ctx.client.attach_policy(args.name, user=args.user or "", group=args.group or "")
    target = f"user {args.user}" if args.user else f"group {args.group}"
    if ctx.json:
        output.print_json({"policy": args.name, "attached_to": target})
    else:
        print(f"Attached {args.name} to {target}")
    return 0


@command
def policies_detach(args: argparse.Namespace, ctx: Context) -> int:
    ctx.client.detach_policy(args.name, user=args.user or "", group=args.group or "")
    target = f"user {args.user}" if args.user else f"group {args.group}"
    if ctx.json:
        output.print_json({"policy": args.name, "detached_from": target})
    else:
        print(f"Detached {args.name} from {target}")
    return 0


def _principal(parser: argparse.ArgumentParser, required: bool) -> None:
    whom = parser.add_mutually_exclusive_group(required=required)
    whom.add_argument("--user", metavar="USER")
    whom.add_argument("--group", metavar="GROUP")


def register(auth: Subparsers, common: argparse.ArgumentParser) -> None:
    policies = group(
        auth, "policies", "create, update, list, show, delete, attach and detach policies"
    )
    p = leaf(common, policies, "create", policies_create, "create a policy from a JSON file")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--file", required=True, metavar="POLICY.json")
    p = leaf(common, policies, "update", policies_update, "replace a policy's document from a file")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--file", required=True, metavar="POLICY.json")
    p = leaf(common, policies, "list", policies_list, "list policies (of a user or group)")
    _principal(p, required=False)
    p.add_argument("--effective", action="store_true", help="with --user: its groups' policies too")
    p = leaf(common, policies, "show", policies_show, "show a policy and its document")
    p.add_argument("name", metavar="NAME")
    p = leaf(common, policies, "delete", policies_delete, "delete a policy")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    for name, handler, text in (
        ("attach", policies_attach, "attach a policy to a user or a group"),
        ("detach", policies_detach, "detach a policy from a user or a group"),
    ):
        p = leaf(common, policies, name, handler, text)
        p.add_argument("name", metavar="NAME")
        _principal(p, required=True)
