"""History: `quarry commit`, `log` and `diff`."""

from __future__ import annotations

import argparse
import datetime as _dt
import re
import sys
import time

from quarry.cli import output, style
from quarry.cli.base import (
    Context,
    Subparsers,
    UsageError,
    command,
    count_at_least_one,
    default_author,
    key_value,
    leaf,
)
from quarry.v1 import types_pb2


@command
def commit(args: argparse.Namespace, ctx: Context) -> int:
    args.message = args.message or ""
    if not args.message.strip() and not args.allow_empty_message:
        # As lakectl: a commit says why (--allow-empty-message when it truly need not).
        raise UsageError("a commit needs a message: -m MESSAGE (or --allow-empty-message)")
    reserved = sorted(k for k, _ in args.meta or [] if k.startswith(RESERVED_METADATA_PREFIX))
    if reserved:
        raise UsageError(
            f"metadata keys starting with {RESERVED_METADATA_PREFIX!r} are Quarry's own "
            f"(merge bases, reverts): {', '.join(reserved)}"
        )
    response = ctx.client.commit(
        args.repo,
        args.branch,
        args.message,
        args.author or default_author(),
        dict(args.meta or []),
        args.allow_empty,
    )
    if ctx.json:
        output.print_json(response)
        return 0
    summary = response.summary
    short = style.commit_id(output.short_id(response.commit.id))
    print(f"[{args.branch} {short}] {output.shown(response.commit.message)}")
    print(f" {summary.added} added, {summary.removed} removed, {summary.changed} changed")
    return 0


def register_commit(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = leaf(common, sub, "commit", commit, "commit a branch's staged changes")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("branch", metavar="BRANCH")
    p.add_argument(
        "-m", "--message", default=None, help="why (required unless --allow-empty-message)"
    )
    p.add_argument(
        "--author",
        metavar="A",
        help="the committer recorded in the commit (default: the authenticated user)",
    )
    p.add_argument(
        "--meta",
        action="append",
        type=key_value,
        metavar="K=V",
        help="commit metadata (repeatable)",
    )
    p.add_argument("--allow-empty", action="store_true")
    p.add_argument("--allow-empty-message", action="store_true", help="commit with an empty -m ''")


def _print_commit(c: types_pb2.Commit, oneline: bool) -> None:
    if oneline:
        first = c.message.splitlines()[0] if c.message else ""
        print(f"{style.commit_id(output.short_id(c.id))} {output.shown(first)}")
        return
    print(style.commit_id(f"commit {output.short_id(c.id)}"))
    if len(c.parents) > 1:
        print("Merge:  " + " ".join(output.short_id(p) for p in c.parents))
    print(f"Author: {output.shown(c.committer or '-', one_line=True)}")
    print(f"Date:   {output.timestamp_text(c.creation_time)}")
    if c.metadata:
        print(f"Meta:   {output.metadata_text(c.metadata)}")
    print()
    for line in (c.message or "").splitlines() or [""]:
        print(f"    {output.shown(line)}".rstrip())
    print()


@command
def log(args: argparse.Namespace, ctx: Context) -> int:
    commits = ctx.client.iter_log(
        args.repo,
        args.ref,
        first_parent=args.first_parent,
        limit=args.n,
        objects=args.paths or (),
        prefixes=args.prefixes or (),
        since=args.since,
    )
    if ctx.json:
        output.print_json_array(commits)
        return 0
    for c in commits:
        _print_commit(c, args.oneline)
    return 0


def register_log(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = leaf(common, sub, "log", log, "show commit history")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("ref", metavar="REF")
    p.add_argument("--first-parent", action="store_true")
    p.add_argument(
        "-n", type=count_at_least_one, default=None, metavar="N", help="at most N commits"
    )
    p.add_argument("--oneline", action="store_true", help="one short line per commit")
    p.add_argument(
        "--path",
        action="append",
        dest="paths",
        metavar="PATH",
        help="only commits that changed this object (repeatable; `lakectl log --objects`)",
    )
    p.add_argument(
        "--prefix",
        action="append",
        dest="prefixes",
        metavar="PREFIX",
        help="only commits that changed something under PREFIX (repeatable; `lakectl log --prefixes`)",
    )
    p.add_argument(
        "--since",
        type=since_time,
        metavar="WHEN",
        help="only commits made at or after WHEN: an ISO date or time (local time unless "
        "it names a zone), or an age such as 3d, 12h, 30m",
    )


# Commit metadata keys Quarry writes itself (quarry.merge.bases, quarry.revert, ...).
RESERVED_METADATA_PREFIX = "quarry."

# --since's bound: the Timestamp range ends in year 9999.
SINCE_MAX_SECONDS = 253_402_300_800

_AGE = re.compile(r"(\d+)([dhm])")


def since_time(text: str) -> float:
    """Epoch seconds of `--since`: `2026-11-01`, `2026-11-01T10:00`, `...+02:00`, or an
    age (`3d`, `12h`, `30m`) before now."""
    age = _AGE.fullmatch(text.strip())
    if age:
        unit = {"d": 86400, "h": 3600, "m": 60}[age.group(2)]
        return max(0.0, time.time() - int(age.group(1)) * unit)  # older than 1970: all
    try:
        parsed = _dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a date or time (2026-11-01, 2026-11-01T10:00) nor an age (3d, 12h)"
        ) from None
    try:
        when = parsed.timestamp()  # a naive time is local, as git takes it
    except (OverflowError, OSError, ValueError):
        when = -1.0
    if not 0 <= when < SINCE_MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} is before 1970 or after 9999")
    return when


@command
def diff(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client
    if args.uncommitted:
        if args.right:
            raise UsageError(
                "diff --uncommitted takes one branch: quarry diff REPO BRANCH --uncommitted"
            )
        changes = client.iter_uncommitted(args.repo, args.left, prefix=args.prefix)
    else:
        if not args.right:
            raise UsageError("diff needs LEFT and RIGHT refs (or BRANCH --uncommitted)")
        changes = client.iter_diff(
            args.repo, args.left, args.right, prefix=args.prefix, three_dot=args.three_dot
        )
    if ctx.json:
        output.print_json_array(changes)
        return 0
    shown = 0
    for change in changes:
        mark = style.mark(output.CHANGE_MARKS.get(change.type, "?"))
        print(f"{mark} {output.shown(change.path, one_line=True)}")
        shown += 1
    if shown == 0 and sys.stderr.isatty():
        print("no changes", file=sys.stderr)
    return 0


def register_diff(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = leaf(
        common, sub, "diff", diff, "changes between two refs, or a branch's uncommitted changes"
    )
    p.add_argument("repo", metavar="REPO")
    p.add_argument("left", metavar="LEFT|BRANCH")
    p.add_argument("right", metavar="RIGHT", nargs="?")
    p.add_argument("--prefix", default="", metavar="P")
    p.add_argument("--uncommitted", action="store_true", help="uncommitted changes of BRANCH")
    p.add_argument(
        "--three-dot",
        action="store_true",
        help="changes on RIGHT since the merge base (! = changed on both sides)",
    )


COMMANDS = {"commit": register_commit, "log": register_log, "diff": register_diff}
