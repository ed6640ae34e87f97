"""`quarry repo create | list | show | update | delete | dump | restore`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from google.protobuf import json_format

from quarry.cli import output
from quarry.cli.base import (
    CliError,
    Context,
    Subparsers,
    command,
    confirm,
    count_at_least_one,
    group,
    leaf,
)
from quarry.cli.files import write_whole_file
from quarry.v1 import branch_manager_pb2 as bm


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


def _counted(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "es" if noun.endswith("ch") else "s")


def _refs_counted(commits: int, branches: int, tags: int) -> str:
    return ", ".join(
        (_counted(commits, "commit"), _counted(branches, "branch"), _counted(tags, "tag"))
    )


def _dump_line(record: bm.RepositoryDumpRecord) -> str:
    """One record as a line of JSON (protobuf's JSON mapping, field names as in the proto)."""
    data = json_format.MessageToDict(record, preserving_proto_field_name=True)
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False) + "\n"


def _read_dump(source: str) -> list[bm.RepositoryDumpRecord]:
    """Every record of a dump file ("-": stdin), parsed before anything is sent: a line that
    is not a record refuses the restore naming it (the service checks the rest)."""
    stream = sys.stdin if source == "-" else open(source, encoding="utf-8")  # noqa: SIM115
    records = []
    try:
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                records.append(json_format.Parse(line, bm.RepositoryDumpRecord()))
            except json_format.ParseError as exc:
                raise CliError(
                    "CORRUPT_DUMP", f"{source}, line {number}: not a repository dump record ({exc})"
                ) from None
    except UnicodeDecodeError:
        raise CliError(
            "CORRUPT_DUMP", f"{source} is not UTF-8 text: not a repository dump"
        ) from None
    finally:
        if stream is not sys.stdin:
            stream.close()
    return records


@command
def repo_dump(args: argparse.Namespace, ctx: Context) -> int:
    """The dump as JSON lines, to --output or stdout; what it holds to stderr (stdout is the
    dump) or, with --output, to stdout; exit 1 when the dump did not reach its end."""
    seen: dict[str, bm.RepositoryDumpRecord] = {}

    def lines() -> Iterator[str]:
        for record in ctx.client.dump_repository(args.name):
            kind = record.WhichOneof("record")
            if kind in ("header", "end"):
                seen[kind] = record
            yield _dump_line(record)

    if args.output == "-":
        # Streamed as it comes (a long history is not held in memory), as `quarry cat`
        # streams an object: a failure midway leaves a dump without its end record, which
        # a restore refuses. A reader that stops early is a failure here, not a success.
        out = ctx.unheld_stdout()
        try:
            for line in lines():
                out.write(line.encode())
            out.flush()
        except BrokenPipeError:
            raise CliError(
                "INCOMPLETE_DUMP",
                "the reader of stdout stopped before the dump's end: what it read is "
                "incomplete (a restore refuses it)",
                "ABORTED",
            ) from None
    else:
        # Private: a dump holds the whole history. Named only once complete (files).
        write_whole_file(
            Path(args.output),
            lambda fh: fh.writelines(line.encode() for line in lines()),
            force=args.force,
            private=True,
        )
    header, end = seen["header"].header, seen["end"].end
    dirty = list(header.branches_with_uncommitted_changes)
    summary = {
        "repository": args.name,
        "output": args.output,
        "branches": end.branches,
        "tags": end.tags,
        "commits": end.commits,
        "branches_with_uncommitted_changes": dirty,
    }
    report = sys.stderr if args.output == "-" else sys.stdout
    if ctx.json:
        print(json.dumps(summary), file=report)
        return 0
    where = "stdout" if args.output == "-" else args.output
    print(
        f"Dumped repository {args.name} to {where}: "
        f"{_refs_counted(end.commits, end.branches, end.tags)}",
        file=report,
    )
    if dirty:
        print(
            f"Not dumped: the uncommitted changes of {', '.join(dirty)} (commit them first "
            f"to keep them)",
            file=sys.stderr,
        )
    return 0


@command
def repo_restore(args: argparse.Namespace, ctx: Context) -> int:
    records = _read_dump(args.dump)
    restored = ctx.client.restore_repository(
        args.name, args.namespace, records, adopt_namespace=args.adopt_namespace
    )
    if ctx.json:
        output.print_json(restored)
        return 0
    repo = restored.repository
    print(
        f"Restored repository {repo.name} (storage {repo.storage_namespace}): "
        f"{_refs_counted(restored.commits, restored.branches, restored.tags)}"
    )
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
    p = leaf(
        common,
        repo,
        "dump",
        repo_dump,
        "dump a repository's refs (commits, branch heads, tags, rules; not uncommitted "
        "changes) as JSON lines, for `quarry repo restore`; the data stays in its namespace",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "--output", "-o", default="-", metavar="FILE", help="write the dump here (default: stdout)"
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing --output file")
    p = leaf(
        common,
        repo,
        "restore",
        repo_restore,
        "create a repository from a dump, over the namespace holding the dumped repository's "
        "data (that of a deleted repository, or a copy of one)",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "namespace",
        help="the storage namespace holding the dumped repository's data",
        metavar="NAMESPACE",
    )
    p.add_argument(
        "--from",
        dest="dump",
        required=True,
        metavar="FILE",
        help="the dump `quarry repo dump` wrote (- for stdin)",
    )
    p.add_argument(
        "--adopt-namespace",
        action="store_true",
        help="the namespace belongs to another Quarry installation, which no longer uses it",
    )


COMMANDS = {"repo": register_repo}
