"""Commits made from other commits: `quarry merge`, `revert` and `cherry-pick`."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from quarry import errors
from quarry.cli import output, style
from quarry.cli.base import (
    EXIT_FAILURE,
    Context,
    Subparsers,
    command,
    default_author,
    key_value,
    leaf,
)
from quarry.graveler.errors import already_merged
from quarry.graveler.model import MergeStrategy
from quarry.v1 import types_pb2


@command
def merge(args: argparse.Namespace, ctx: Context) -> int:
    try:
        response = ctx.client.merge(
            args.repo,
            args.source,
            args.destination,
            strategy=MergeStrategy.parse(args.strategy),
            message=args.message or "",
            committer=args.author or default_author(),
            metadata=dict(args.meta or []),
            squash=args.squash,
            allow_empty=args.allow_empty,
            dry_run=args.dry_run,
        )
    except errors.QuarryError as exc:
        if not already_merged(exc):
            raise
        # As git: merging what is already merged is not a failure.
        if ctx.json:
            output.print_json(
                {"up_to_date": True, "source": args.source, "destination": args.destination}
            )
        else:
            print("Already up to date.")
        return 0
    # A dry run that finds conflicts exits 1 (as `git merge` does on conflicts): scripts
    # can test it; the report is printed either way.
    code = EXIT_FAILURE if args.dry_run and response.conflicts else 0
    if ctx.json:
        output.print_json(response)
        return code
    summary = response.summary
    counts = f"{summary.added} added, {summary.removed} removed, {summary.changed} changed"
    if args.dry_run:
        print(f"Dry run: merging {args.source} into {args.destination} would make {counts}")
        for conflict in response.conflicts:
            print(f"{style.mark('!')} {output.shown(conflict.path, one_line=True)}")
        if response.conflicts:
            total = len(response.conflicts) + response.more_conflicts
            more = (
                f" ({response.more_conflicts} more not listed)" if response.more_conflicts else ""
            )
            print(style.paint(f"{total} conflict(s){more}", "red"))
        return code
    short = style.commit_id(output.short_id(response.commit.id))
    print(f"[{args.destination} {short}] {output.shown(response.commit.message)}")
    print(f" {counts} (attempts: {response.attempts})")
    return 0


def register_merge(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = leaf(common, sub, "merge", merge, "merge a ref into a branch (three-way)")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("source", metavar="SOURCE_REF")
    p.add_argument("destination", metavar="DEST_BRANCH")
    p.add_argument(
        "--strategy",
        choices=["source-wins", "dest-wins"],
        default=None,
        help="resolve conflicts for one side (default: conflicts fail)",
    )
    p.add_argument("-m", "--message", default="")
    p.add_argument("--author", metavar="A")
    p.add_argument("--meta", action="append", type=key_value, metavar="K=V")
    p.add_argument("--squash", action="store_true", help="one parent: the destination")
    p.add_argument("--allow-empty", action="store_true")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="report the summary and conflicts without committing (exit 1 on conflicts)",
    )


def _print_new_commit(branch: str, commit: types_pb2.Commit, ctx: Context) -> None:
    if ctx.json:
        output.print_json(commit)
    else:
        short = style.commit_id(output.short_id(commit.id))
        print(f"[{branch} {short}] {output.shown(commit.message)}")


@command
def revert(args: argparse.Namespace, ctx: Context) -> int:
    commit = ctx.client.revert(
        args.repo,
        args.branch,
        args.ref,
        args.parent,
        args.message or "",
        args.author or default_author(),
    )
    _print_new_commit(args.branch, commit, ctx)
    return 0


@command
def cherry_pick(args: argparse.Namespace, ctx: Context) -> int:
    commit = ctx.client.cherry_pick(
        args.repo, args.branch, args.ref, args.parent, args.message or "", args.author or ""
    )
    _print_new_commit(args.branch, commit, ctx)
    return 0


def _register_onto_branch(
    sub: Subparsers,
    common: argparse.ArgumentParser,
    name: str,
    handler: Callable[[argparse.Namespace], int],
    help_text: str,
) -> None:
    p = leaf(common, sub, name, handler, help_text)
    p.add_argument("repo", metavar="REPO")
    p.add_argument("branch", metavar="BRANCH")
    p.add_argument("ref", metavar="REF")
    p.add_argument(
        "--parent",
        type=int,
        default=0,
        metavar="N",
        help="for a merge commit: the parent (1-based) to compare against",
    )
    p.add_argument("-m", "--message", default="")
    p.add_argument("--author", metavar="A")


def register_revert(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    _register_onto_branch(
        sub, common, "revert", revert, "commit the inverse of a commit onto a branch"
    )


def register_cherry_pick(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    _register_onto_branch(
        sub, common, "cherry-pick", cherry_pick, "commit a commit's change onto a branch"
    )


COMMANDS = {"merge": register_merge, "revert": register_revert, "cherry-pick": register_cherry_pick}
