"""`quarry gc run` (a Spark job over a storage namespace) and the retention rules it keeps
(`gc set-rules | show-rules | delete-rules`)."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
from collections.abc import Callable
from typing import Any

from quarry import errors
from quarry.cli import output
from quarry.cli.base import (
    EXIT_FAILURE,
    CliError,
    Context,
    Subparsers,
    UsageError,
    command,
    fail,
    group,
    key_value,
    leaf,
)


def _non_negative(unit: str) -> Callable[[str], float]:
    """An option's number of `unit`: negative or NaN refused (for the grace period: a
    cutoff after the real time)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number of {unit}, got {text!r}") from None
        if not value >= 0:  # negative or NaN
            raise argparse.ArgumentTypeError(f"{unit} must be a number, not negative")
        return value

    return parse


_days = _non_negative("days")
_hours = _non_negative("hours")


def _branch_days(text: str) -> tuple[str, float]:
    branch, value = key_value(text)
    return branch, _days(value)


def _gc_rules(args: argparse.Namespace, base: Any) -> Any:
    """`base` (a RetentionRules) with a rules file and the day flags applied on top."""
    from quarry.retention import RetentionRules

    rules = base
    if args.rules:
        with open(args.rules, encoding="utf-8") as fh:
            rules = RetentionRules.from_json(fh.read())
    return RetentionRules(
        args.retention_days if args.retention_days is not None else rules.default_retention_days,
        {**rules.branch_retention_days, **dict(args.branch_retention or [])},
    )


@command
def gc_set_rules(args: argparse.Namespace, ctx: Context) -> int:
    from quarry.retention import RetentionRules

    if not (args.rules or args.retention_days is not None or args.branch_retention):
        raise UsageError("give --rules FILE, --retention-days or --branch-retention")
    rules = _gc_rules(args, RetentionRules())
    ctx.client.set_gc_rules(args.repo, rules.default_retention_days, rules.branch_retention_days)
    _print_rules(ctx, args.repo, rules)
    return 0


@command
def gc_show_rules(args: argparse.Namespace, ctx: Context) -> int:
    from quarry.retention import RetentionRules

    _print_rules(ctx, args.repo, RetentionRules.from_proto(ctx.client.get_gc_rules(args.repo)))
    return 0


def _print_rules(ctx: Context, repo: str, rules: Any) -> None:
    if ctx.json:
        output.print_json(json.loads(rules.to_json()))
        return
    pairs = [("repository", repo), ("default retention", f"{rules.default_retention_days:g} days")]
    for branch, days in sorted(rules.branch_retention_days.items()):
        pairs.append((f"branch {branch}", f"{days:g} days"))
    output.fields(pairs)


@command
def gc_delete_rules(args: argparse.Namespace, ctx: Context) -> int:
    ctx.client.delete_gc_rules(args.repo)
    if ctx.json:
        output.print_json({"deleted": args.repo})
        return 0
    print(f"Deleted the garbage-collection rules of {args.repo} (GC now keeps 21 days)")
    return 0


@command
def gc_run(args: argparse.Namespace, ctx: Context) -> int:
    try:
        from quarry.spark.gc import collect_garbage, stored_rules
        from quarry.spark.session import local_session
    except ImportError as exc:
        raise CliError(
            "SPARK_NOT_INSTALLED", f"quarry gc needs PySpark ({exc}); install quarry[spark]"
        ) from None
    from quarry.spark.common import Connection

    if bool(args.repo) == bool(args.all):
        raise UsageError("give a repository or --all")
    now = None
    if args.now:
        try:
            now = _dt.datetime.fromisoformat(args.now)
        except ValueError:
            raise CliError("INVALID_ARGUMENT", f"--now: not an ISO time: {args.now!r}") from None
        now = now if now.tzinfo else now.replace(tzinfo=_dt.UTC)
    repositories = [args.repo] if args.repo else [r.name for r in ctx.client.iter_repositories()]
    # Rules are checked for every repository before Spark starts (a bad flag fails fast).
    rules = {repo: _gc_rules(args, stored_rules(ctx.client, repo)) for repo in repositories}
    connection = Connection.from_settings(ctx.settings)
    spark = local_session(args.master, "quarry-gc")
    reports, failures = [], []
    for repo in repositories:
        try:
            report = collect_garbage(
                spark,
                repo,
                rules=rules[repo],
                sweep=args.sweep,
                now=now,
                grace=_dt.timedelta(hours=args.grace_hours),
                ephemeral_ttl=_dt.timedelta(hours=args.ephemeral_ttl_hours),
                connection=connection,
            )
        except errors.QuarryError as exc:
            if not args.all:
                raise
            failures.append(repo)  # the other repositories are still collected
            # One line (or, with --json, one JSON object) on stderr per failed repository,
            # naming it; the reports of the others still go to stdout.
            fail(
                exc.reason,
                f"{repo}: {exc.message}",
                code=exc.code.name,
                metadata={**exc.metadata, "repository": repo},
                as_json=ctx.json,
            )
            continue
        reports.append(report)
        if not ctx.json:
            _print_gc_report(report)
    if ctx.json:
        output.print_json(
            reports[0].to_dict() if args.repo else [report.to_dict() for report in reports]
        )
    return EXIT_FAILURE if failures else 0


def _print_gc_report(report: Any) -> None:
    output.fields(
        [
            ("repository", report.repository),
            ("mode", "sweep" if report.sweep else "dry run (nothing deleted)"),
            ("commits", f"{report.commits_retained} retained, {report.commits_expired} expired"),
            ("stale Spark branches", ", ".join(report.ephemeral_branches) or "none"),
            (
                "objects scanned",
                f"{report.objects_scanned} ({report.objects_in_grace} "
                f"younger than the grace period)",
            ),
            ("report", f"{report.storage_namespace.rstrip('/')}/{report.report_key}"),
        ]
    )
    output.table(
        ["KIND", "COLLECTABLE", "BYTES"],
        [(kind, part.count, part.bytes) for kind, part in report.collectable.items()],
        right=(1, 2),
    )
    if report.sweep:
        print(f"Deleted {report.deleted} objects.")
    elif report.collectable_count:
        print(f"Run again with --sweep to delete these {report.collectable_count} objects.")


def _gc_rule_options(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument(
        "--rules",
        metavar="FILE",
        help="retention rules in lakeFS's JSON format "
        '({"default_retention_days": 21, "branches": [{"branch_id": ..., '
        '"retention_days": ...}]})',
    )
    p.add_argument(
        "--retention-days", type=_days, metavar="DAYS", help=f"keep commits this recent {default}"
    )
    p.add_argument(
        "--branch-retention",
        action="append",
        type=_branch_days,
        metavar="BRANCH=DAYS",
        help="a branch's own retention (repeatable)",
    )


def register_gc(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    gc = group(sub, "gc", "garbage collection of storage namespaces, and its retention rules")
    p = leaf(
        common,
        gc,
        "run",
        gc_run,
        "garbage-collect a repository's storage namespace (a Spark "
        "job): expired commits' data, orphaned ranges and metaranges, "
        "stale Spark branches; a dry run unless --sweep",
    )
    p.add_argument("repo", metavar="REPO", nargs="?")
    p.add_argument(
        "--all",
        action="store_true",
        help="every repository, one after another (exit 1 if any failed)",
    )
    p.add_argument("--sweep", action="store_true", help="delete (default: only report)")
    _gc_rule_options(p, "(default: the repository's rules, else 21 days)")
    p.add_argument(
        "--grace-hours",
        type=_hours,
        default=6.0,
        metavar="H",
        help="never delete objects younger than this (default: 6)",
    )
    p.add_argument(
        "--ephemeral-ttl-hours",
        type=_hours,
        default=24.0,
        metavar="H",
        help="Spark write branches older than this are stale (default: 24)",
    )
    p.add_argument(
        "--now", metavar="ISO_TIME", help="measure retention from this time instead of now"
    )
    p.add_argument(
        "--master", default="local[*]", metavar="URL", help="Spark master (default: local[*])"
    )
    p = leaf(common, gc, "set-rules", gc_set_rules, "store a repository's retention rules")
    p.add_argument("repo", metavar="REPO")
    _gc_rule_options(p, "(default: 21)")
    p = leaf(common, gc, "show-rules", gc_show_rules, "show a repository's retention rules")
    p.add_argument("repo", metavar="REPO")
    p = leaf(common, gc, "delete-rules", gc_delete_rules, "delete a repository's retention rules")
    p.add_argument("repo", metavar="REPO")


COMMANDS = {"gc": register_gc}
