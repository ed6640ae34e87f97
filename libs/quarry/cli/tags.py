"""`quarry tag create | list | show | delete`."""

from __future__ import annotations

import argparse

from quarry.cli import output
from quarry.cli.base import Context, Subparsers, command, group, leaf


@command
def tag_create(args: argparse.Namespace, ctx: Context) -> int:
    tag = ctx.client.create_tag(args.repo, args.name, args.ref)
    if ctx.json:
        output.print_json(tag)
    else:
        print(f"Created tag {tag.name} at {output.short_id(tag.commit_id)}")
    return 0


@command
def tag_list(args: argparse.Namespace, ctx: Context) -> int:
    output.listing(
        list(ctx.client.iter_tags(args.repo)),
        ctx.json,
        ("NAME", "COMMIT"),
        lambda t: (t.name, output.short_id(t.commit_id)),
    )
    return 0


@command
def tag_show(args: argparse.Namespace, ctx: Context) -> int:
    tag = ctx.client.get_tag(args.repo, args.name)
    if ctx.json:
        output.print_json(tag)
        return 0
    output.fields([("name", tag.name), ("commit", output.short_id(tag.commit_id))])
    return 0


@command
def tag_delete(args: argparse.Namespace, ctx: Context) -> int:
    ctx.client.delete_tag(args.repo, args.name)
    if ctx.json:
        output.print_json({"deleted": args.name})
    else:
        print(f"Deleted tag {args.name}")
    return 0


def register_tag(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    tag = group(sub, "tag", "create, list, show and delete tags")
    p = leaf(common, tag, "create", tag_create, "create a tag")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("name", metavar="NAME")
    p.add_argument("ref", metavar="REF")
    p = leaf(common, tag, "list", tag_list, "list tags")
    p.add_argument("repo", metavar="REPO")
    p = leaf(common, tag, "show", tag_show, "show a tag")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("name", metavar="NAME")
    p = leaf(common, tag, "delete", tag_delete, "delete a tag")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("name", metavar="NAME")


COMMANDS = {"tag": register_tag}
