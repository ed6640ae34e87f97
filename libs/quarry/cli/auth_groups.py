"""`quarry auth groups create | list | members | delete | add-member | remove-member`."""

from __future__ import annotations

import argparse

from quarry.cli import output
from quarry.cli.auth_users import USER_COLUMNS, user_row
from quarry.cli.base import Context, Subparsers, command, confirm, group, leaf


@command
def groups_create(args: argparse.Namespace, ctx: Context) -> int:
    created = ctx.client.create_group(args.group, args.description)
    if ctx.json:
        output.print_json(created)
    else:
        print(f"Created group {created.id}")
    return 0


@command
def groups_list(args: argparse.Namespace, ctx: Context) -> int:
    output.listing(
        list(ctx.client.iter_groups()),
        ctx.json,
        ("ID", "DESCRIPTION", "CREATED"),
        lambda g: (g.id, g.description or "-", output.timestamp_text(g.created_at)),
    )
    return 0


@command
def groups_members(args: argparse.Namespace, ctx: Context) -> int:
    users = list(ctx.client.iter_group_members(args.group))
    output.listing(users, ctx.json, USER_COLUMNS, user_row)
    return 0


@command
def groups_delete(args: argparse.Namespace, ctx: Context) -> int:
    """Never deletes without --yes or a "y" typed on a terminal (confirm)."""
    if not args.yes:
        confirm(f"Delete group {args.group!r} with its memberships and attachments?", "--yes")
    ctx.client.delete_group(args.group)
    if ctx.json:
        output.print_json({"deleted": args.group})
    else:
        print(f"Deleted group {args.group}")
    return 0


@command
def groups_add_member(args: argparse.Namespace, ctx: Context) -> int:
    ctx.client.add_group_member(args.group, args.user)
    if not ctx.json:
        print(f"Added {args.user} to {args.group}")
    else:
        output.print_json({"group": args.group, "added": args.user})
    return 0


@command
def groups_remove_member(args: argparse.Namespace, ctx: Context) -> int:
    ctx.client.remove_group_member(args.group, args.user)
    if not ctx.json:
        print(f"Removed {args.user} from {args.group}")
    else:
        output.print_json({"group": args.group, "removed": args.user})
    return 0


def register(auth: Subparsers, common: argparse.ArgumentParser) -> None:
    groups = group(auth, "groups", "create, list and delete groups; manage their members")
    p = leaf(common, groups, "create", groups_create, "create a group")
    p.add_argument("group", metavar="GROUP", help="the new group's id")
    p.add_argument("--description", default="", metavar="TEXT")
    leaf(common, groups, "list", groups_list, "list groups")
    p = leaf(common, groups, "members", groups_members, "list a group's members")
    p.add_argument("group", metavar="GROUP", help="the group's id")
    p = leaf(common, groups, "delete", groups_delete, "delete a group")
    p.add_argument("group", metavar="GROUP", help="the group's id")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    for name, handler, text in (
        ("add-member", groups_add_member, "add a user to a group"),
        ("remove-member", groups_remove_member, "remove a user from a group"),
    ):
        p = leaf(common, groups, name, handler, text)
        p.add_argument("group", metavar="GROUP", help="the group's id")
        p.add_argument("user", metavar="USER", help="the user's id")
