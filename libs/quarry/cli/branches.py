"""`quarry branch create | list | show | delete`, and what moves a branch's state without a
commit: `quarry reset` (hard reset to a ref) and `quarry discard` (drop uncommitted changes)."""

from __future__ import annotations

import argparse

from quarry import errors
from quarry.cli import output
from quarry.cli.base import Context, Subparsers, command, confirm, group, leaf
from quarry.client.branch_manager import maybe_dirty
from quarry.v1 import types_pb2


def _dirty_text(ctx: Context, repo: str, branch: types_pb2.Branch) -> str:
    """Whether the branch has uncommitted changes: a call only for a record that allows
    them (maybe_dirty)."""
    dirty = maybe_dirty(branch) and ctx.client.has_uncommitted(repo, branch.name)
    return "yes" if dirty else "no"


@command
def branch_create(args: argparse.Namespace, ctx: Context) -> int:
    branch = ctx.client.create_branch(args.repo, args.name, args.source or "")
    if ctx.json:
        output.print_json(branch)
    else:
        source = f" from {args.source}" if args.source else ""
        print(f"Created branch {branch.name}{source} at {output.short_id(branch.commit_id)}")
    return 0


@command
def branch_list(args: argparse.Namespace, ctx: Context) -> int:
    output.listing(
        list(ctx.client.iter_branches(args.repo)),
        ctx.json,
        ("NAME", "COMMIT", "UNCOMMITTED"),
        lambda b: (b.name, output.short_id(b.commit_id), _dirty_text(ctx, args.repo, b)),
    )
    return 0


@command
def branch_show(args: argparse.Namespace, ctx: Context) -> int:
    branch = ctx.client.get_branch(args.repo, args.name)
    if ctx.json:
        output.print_json(branch)
        return 0
    rows = [
        ("name", branch.name),
        ("commit", output.short_id(branch.commit_id)),
        ("uncommitted changes", _dirty_text(ctx, args.repo, branch)),
        ("staging token", branch.staging_token or "-"),
        ("sealed tokens", ", ".join(branch.sealed_tokens) or "-"),
    ]
    if branch.compacted_metarange_id:
        rows.append(("compacted metarange", branch.compacted_metarange_id))
    output.fields(rows)
    return 0


def _unsaved_work(ctx: Context, repo: str, name: str) -> list[str]:
    """What deleting branch `name` would lose: its staged changes, and commits the
    repository's default branch does not have (a dry-run merge into it must answer
    "already merged"; any other answer counts as unmerged)."""
    from quarry.graveler.errors import already_merged

    client = ctx.client
    branch = client.get_branch(repo, name)
    lost = []
    if maybe_dirty(branch) and client.has_uncommitted(repo, name):
        lost.append("uncommitted changes")
    default = client.get_repository(repo).default_branch
    if name != default:
        try:
            client.merge(repo, name, default, dry_run=True)
            lost.append(f"commits not merged into {default}")
        except errors.QuarryError as exc:
            if not already_merged(exc):
                lost.append(f"commits not merged into {default}")
    return lost


@command
def branch_delete(args: argparse.Namespace, ctx: Context) -> int:
    """Never deletes a branch holding uncommitted changes or commits its repository's
    default branch does not have, unless --force (or "y" typed on a terminal): that work
    would be lost. A branch fully merged and clean goes without asking, as `git branch -d`."""
    if not args.force:
        lost = _unsaved_work(ctx, args.repo, args.name)
        if lost:
            confirm(f"Branch {args.name!r} has {' and '.join(lost)}; delete it anyway?", "--force")
    ctx.client.delete_branch(args.repo, args.name)
    if ctx.json:
        output.print_json({"deleted": args.name})
    else:
        print(f"Deleted branch {args.name}")
    return 0


def register_branch(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    branch = group(sub, "branch", "create, list, show and delete branches")
    p = leaf(common, branch, "create", branch_create, "create a branch")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "--source", metavar="REF", help="where it starts (default: the repository's default branch)"
    )
    p = leaf(common, branch, "list", branch_list, "list branches")
    p.add_argument("repo", metavar="REPO")
    p = leaf(common, branch, "show", branch_show, "show a branch")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("name", metavar="NAME")
    p = leaf(common, branch, "delete", branch_delete, "delete a branch")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "--force",
        "--yes",
        "-y",
        action="store_true",
        help="delete even with uncommitted changes or commits the default branch lacks",
    )


# ---- reset and discard ---------------------------------------------------------------------


@command
def reset(args: argparse.Namespace, ctx: Context) -> int:
    branch = ctx.client.reset_branch(args.repo, args.branch, args.ref, args.force)
    if ctx.json:
        output.print_json(branch)
    else:
        print(
            f"Reset {args.repo}/{branch.name or args.branch} to {output.short_id(branch.commit_id)}"
        )
    return 0


def register_reset(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = leaf(common, sub, "reset", reset, "hard-reset a branch to a ref")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("branch", metavar="BRANCH")
    p.add_argument("ref", metavar="REF")
    p.add_argument("--force", action="store_true", help="also drop uncommitted changes")


@command
def discard(args: argparse.Namespace, ctx: Context) -> int:
    ctx.client.discard_changes(
        args.repo, args.branch, path=args.path or "", prefix=args.prefix or ""
    )
    what = (
        f"path {args.path}"
        if args.path
        else f"prefix {args.prefix}"
        if args.prefix
        else "everything"
    )
    if ctx.json:
        output.print_json({"discarded": what})
    else:
        print(f"Discarded uncommitted changes on {args.repo}/{args.branch} ({what})")
    return 0


def register_discard(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = leaf(common, sub, "discard", discard, "discard uncommitted changes of a branch")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("branch", metavar="BRANCH")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--path", metavar="P", help="one path only")
    scope.add_argument("--prefix", metavar="P", help="paths under a prefix only")


COMMANDS = {"branch": register_branch, "reset": register_reset, "discard": register_discard}
