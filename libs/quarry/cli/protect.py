"""`quarry branch-protect add | list | delete`: a repository's branch protection rules
(lakeFS semantics: a rule's pattern matches branch names; it blocks staging writes and/or
commits on them; merges into a protected branch still work)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from quarry import errors
from quarry.cli import output
from quarry.cli.base import CliError, Context, Subparsers, command, group, leaf
from quarry.v1 import branch_manager_pb2 as bm

_ACTIONS = {
    "staging-write": bm.BRANCH_PROTECTION_BLOCKED_ACTION_STAGING_WRITE,
    "commit": bm.BRANCH_PROTECTION_BLOCKED_ACTION_COMMIT,
}
_NAMES = {value: name for name, value in _ACTIONS.items()}
Rules = list[bm.BranchProtectionRule]


def _blocked(text: str) -> list[int]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in _ACTIONS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(_ACTIONS)}, got {text!r}"
        )
    return sorted({_ACTIONS[name] for name in names})


def _update(ctx: Context, repo: str, change: Callable[[Rules], Rules]) -> Rules:
    """Read, change and write the rules under the checksum (compare-and-swap); a lost race
    (PRECONDITION_FAILED: someone else changed them in between) is retried once."""
    for attempt in range(2):
        rules, checksum = ctx.client.get_branch_protection_rules(repo)
        changed = change(rules)
        try:
            ctx.client.set_branch_protection_rules(repo, changed, if_checksum=checksum)
        except errors.FailedPrecondition as exc:
            if exc.reason != "PRECONDITION_FAILED" or attempt:
                raise
            continue
        return changed
    raise AssertionError("unreachable")


def _show(ctx: Context, rules: Rules) -> None:
    if ctx.json:
        output.print_json(rules)
        return
    output.table(
        ["PATTERN", "BLOCKED"],
        [(r.pattern, ",".join(_NAMES[a] for a in r.blocked_actions)) for r in rules],
    )


@command
def protect_add(args: argparse.Namespace, ctx: Context) -> int:
    def add(rules: Rules) -> Rules:
        others = [rule for rule in rules if rule.pattern != args.pattern]
        # --block given more than once adds up (it kept only the last: a protection weaker
        # than asked for); not given, both.
        blocked = sorted({a for given in args.block for a in given}) if args.block else None
        rule = bm.BranchProtectionRule(
            pattern=args.pattern, blocked_actions=blocked or sorted(_ACTIONS.values())
        )
        return [*others, rule]

    _show(ctx, _update(ctx, args.repo, add))
    return 0


@command
def protect_list(args: argparse.Namespace, ctx: Context) -> int:
    _show(ctx, ctx.client.get_branch_protection_rules(args.repo)[0])
    return 0


@command
def protect_delete(args: argparse.Namespace, ctx: Context) -> int:
    def delete(rules: Rules) -> Rules:
        if all(rule.pattern != args.pattern for rule in rules):
            raise CliError(
                "RULE_NOT_FOUND",
                f"repository {args.repo!r} has no branch protection rule {args.pattern!r}",
            )
        return [rule for rule in rules if rule.pattern != args.pattern]

    _update(ctx, args.repo, delete)
    if ctx.json:
        output.print_json({"deleted": args.pattern})
    else:
        print(f"Deleted branch protection rule {args.pattern} of {args.repo}")
    return 0


def register_branch_protect(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    protect = group(
        sub, "branch-protect", "branch protection rules: block staging writes or commits"
    )
    p = leaf(common, protect, "add", protect_add, "add (or replace) a rule for a branch pattern")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("pattern", metavar="PATTERN", help="branch-name glob, e.g. main or release-*")
    p.add_argument(
        "--block",
        type=_blocked,
        action="append",
        metavar="ACTIONS",
        help="what to block: staging-write,commit (default: both); may be repeated",
    )
    p = leaf(common, protect, "list", protect_list, "list a repository's rules")
    p.add_argument("repo", metavar="REPO")
    p = leaf(common, protect, "delete", protect_delete, "delete the rule for a branch pattern")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("pattern", metavar="PATTERN")


COMMANDS = {"branch-protect": register_branch_protect}
