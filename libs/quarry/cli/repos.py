"""`quarry repo create | list | show | update | delete`."""

from __future__ import annotations

import argparse

from quarry.cli import output
from quarry.cli.base import Context, Subparsers, command, confirm, count_at_least_one, group, leaf


@command
def repo_create(args: argparse.Namespace, ctx: Context) -> int:
    repo = ctx.client.create_repository(
        args.name, args.namespace, args.default_branch, staging_shards=args.staging_shards
    )
    if ctx.json:
        output.print_json(repo)
    else:
        print(
            f"Created repository {repo.name} (default branch {repo.default_branch}, "
            f"storage {repo.storage_namespace})"
        )
    return 0


@command
def repo_list(args: argparse.Namespace, ctx: Context) -> int:
    output.listing(
        list(ctx.client.iter_repositories()),
        ctx.json,
        ("NAME", "DEFAULT BRANCH", "STORAGE NAMESPACE", "CREATED"),
        lambda r: (
            r.name,
            r.default_branch,
            r.storage_namespace,
            output.timestamp_text(r.creation_time),
        ),
    )
    return 0


@command
def repo_show(args: argparse.Namespace, ctx: Context) -> int:
    repo = ctx.client.get_repository(args.name)
    if ctx.json:
        output.print_json(repo)
        return 0
    output.fields(
        [
            ("name", repo.name),
            ("storage namespace", repo.storage_namespace),
            ("default branch", repo.default_branch),
            ("created", output.timestamp_text(repo.creation_time)),
            ("staging shards", str(repo.staging_shards or 1)),
        ]
    )
    return 0


@command
def repo_update(args: argparse.Namespace, ctx: Context) -> int:
    repo = ctx.client.update_repository(args.name, staging_shards=args.staging_shards)
    if ctx.json:
        output.print_json(repo)
    else:
        print(
            f"Updated repository {repo.name} (staging shards {repo.staging_shards or 1}, "
            f"from each branch's next staging token)"
        )
    return 0


@command
def repo_delete(args: argparse.Namespace, ctx: Context) -> int:
    """Never deletes without --yes or a "y" typed on a terminal (confirm)."""
    if not args.yes:
        confirm(f"Delete repository {args.name!r} and all its branches, tags and history?", "--yes")
    ctx.client.delete_repository(args.name)
    if ctx.json:
        output.print_json({"deleted": args.name})
    else:
        print(f"Deleted repository {args.name}")
    return 0


def register_repo(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    repo = group(sub, "repo", "create, list, show and delete repositories")
    p = leaf(common, repo, "create", repo_create, "create a repository")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "namespace",
        help="storage namespace: /abs/dir, file:///abs/dir or s3://bucket/prefix",
        metavar="NAMESPACE",
    )
    p.add_argument("--default-branch", default="main", metavar="B")
    p.add_argument(
        "--staging-shards",
        type=count_at_least_one,
        default=0,
        metavar="N",
        help="KV partitions per staging token, 1-64 (default 1): N lifts one branch's "
        "staged-write ceiling N times",
    )
    leaf(common, repo, "list", repo_list, "list repositories")
    p = leaf(common, repo, "show", repo_show, "show a repository")
    p.add_argument("name", metavar="NAME")
    p = leaf(common, repo, "update", repo_update, "change a repository's settings")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "--staging-shards",
        type=int,
        required=True,
        metavar="N",
        help="KV partitions per staging token, 1-64; applies from each branch's next "
        "staging token (its next commit, a reset, a new branch)",
    )
    p = leaf(common, repo, "delete", repo_delete, "delete a repository")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")


COMMANDS = {"repo": register_repo}
