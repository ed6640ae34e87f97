"""Staging compaction: `quarry compact` (now) and `quarry stats` (the compactor-sensor's
view of a branch)."""

from __future__ import annotations

import argparse

from quarry.cli import output
from quarry.cli.base import Context, Subparsers, address, command, leaf


@command
def compact(args: argparse.Namespace, ctx: Context) -> int:
    response = ctx.client.compact(args.repo, args.branch)
    if ctx.json:
        output.print_json(response)
        return 0
    if response.tokens_compacted:
        print(
            f"Compacted {args.repo}/{args.branch}: {response.tokens_compacted} staging "
            f"token(s) into metarange {response.compacted_metarange_id}"
        )
    else:
        print(
            f"Nothing to compact on {args.repo}/{args.branch} (compacted metarange: "
            f"{response.compacted_metarange_id or 'none'})"
        )
    return 0


def register_compact(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = leaf(
        common,
        sub,
        "compact",
        compact,
        "compact a branch's staged changes now (the "
        "compactor-sensor also does it past its thresholds)",
    )
    p.add_argument("repo", metavar="REPO")
    p.add_argument("branch", metavar="BRANCH")


@command
def stats(args: argparse.Namespace, ctx: Context) -> int:
    response = ctx.client.branch_staging_stats(args.repo, args.branch)
    if ctx.json:
        output.print_json(response)
        return 0
    output.fields(
        [
            ("branch", f"{args.repo}/{args.branch}"),
            ("staged entries", str(response.puts)),
            ("staged tombstones", str(response.deletes)),
            ("sealed tokens", str(response.sealed_tokens)),
            (
                "last compaction",
                output.timestamp_text(
                    response.last_compaction if response.HasField("last_compaction") else None,
                    empty="never",
                ),
            ),
        ]
    )
    return 0


def register_stats(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = leaf(
        common,
        sub,
        "stats",
        stats,
        "a branch's staging statistics, as the compactor-sensor counts them",
    )
    p.add_argument("repo", metavar="REPO")
    p.add_argument("branch", metavar="BRANCH")
    p.add_argument(
        "--compactor-sensor",
        type=address,
        metavar="HOST:PORT",
        help="compactor-sensor address (default: QUARRY_COMPACTOR_SENSOR_ADDRESS)",
    )


COMMANDS = {"compact": register_compact, "stats": register_stats}
