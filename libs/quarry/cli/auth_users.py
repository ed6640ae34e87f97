"""`quarry auth users create | list | show | delete`."""

from __future__ import annotations

import argparse
from typing import Any

from quarry.cli import output
from quarry.cli.base import Context, Subparsers, command, confirm, group, leaf

# A table of users (`auth users list`, `auth groups members`).
USER_COLUMNS = ("ID", "EMAIL", "CREATED")


def user_row(user: Any) -> tuple[str, str, str]:
    return (user.id, user.email or "-", output.timestamp_text(user.created_at))


@command
def users_create(args: argparse.Namespace, ctx: Context) -> int:
    user = ctx.client.create_user(args.user, args.email)
    if ctx.json:
        output.print_json(user)
    else:
        print(f"Created user {user.id}")
    return 0


@command
def users_list(args: argparse.Namespace, ctx: Context) -> int:
    output.listing(list(ctx.client.iter_users()), ctx.json, USER_COLUMNS, user_row)
    return 0


@command
def users_show(args: argparse.Namespace, ctx: Context) -> int:
    user = ctx.client.get_user(args.user)
    groups = [g.id for g in ctx.client.iter_user_groups(args.user)]
    policies = [p.id for p in ctx.client.iter_user_policies(args.user, effective=True)]
    if ctx.json:
        output.print_json({"user": user, "groups": groups, "effective_policies": policies})
        return 0
    output.fields(
        [
            ("id", user.id),
            ("email", user.email or "-"),
            ("created", output.timestamp_text(user.created_at)),
            ("groups", ", ".join(groups) or "-"),
            ("effective policies", ", ".join(policies) or "-"),
        ]
    )
    return 0


@command
def users_delete(args: argparse.Namespace, ctx: Context) -> int:
    """Never deletes without --yes or a "y" typed on a terminal (confirm)."""
    if not args.yes:
        confirm(f"Delete user {args.user!r} with its credentials and memberships?", "--yes")
    ctx.client.delete_user(args.user)
    if ctx.json:
        output.print_json({"deleted": args.user})
    else:
        print(f"Deleted user {args.user}")
    return 0


def register(auth: Subparsers, common: argparse.ArgumentParser) -> None:
    users = group(auth, "users", "create, list, show and delete users")
    p = leaf(common, users, "create", users_create, "create a user")
    p.add_argument("user", metavar="USER")
    p.add_argument("--email", default="", metavar="EMAIL")
    leaf(common, users, "list", users_list, "list users")
    p = leaf(common, users, "show", users_show, "show a user, its groups and policies")
    p.add_argument("user", metavar="USER")
    p = leaf(common, users, "delete", users_delete, "delete a user")
    p.add_argument("user", metavar="USER")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
