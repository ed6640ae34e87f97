"""`quarry actions`: the runs of action hooks (docs/actions.md), like lakectl's.

quarry actions runs list REPO [--branch B] [--commit C] [--amount N]
quarry actions runs show REPO RUN_ID
"""

from __future__ import annotations

import argparse
import datetime

from google.protobuf import timestamp_pb2

from quarry.cli import output
from quarry.cli.base import Context, Subparsers, command
from quarry.v1 import committer_pb2 as cm


def _time(stamp: timestamp_pb2.Timestamp) -> str:
    if not stamp.seconds and not stamp.nanos:
        return ""
    return stamp.ToDatetime(tzinfo=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


@command
def list_runs(args: argparse.Namespace, ctx: Context) -> int:
    runs: list[cm.ActionRun] = []
    token = ""
    while len(runs) < args.amount:
        page = ctx.client.list_action_runs(
            args.repo,
            branch=args.branch or "",
            commit_id=args.commit or "",
            page_size=min(args.amount - len(runs), 1000),
            page_token=token,
        )
        runs.extend(page.runs)
        token = page.next_page_token
        if not token:
            break
    if ctx.json:
        output.print_json(cm.ListActionRunsResponse(runs=runs, next_page_token=token))
        return 0
    output.table(
        ("RUN ID", "EVENT", "BRANCH", "STATUS", "START", "COMMIT"),
        [
            (
                r.run_id,
                r.event,
                r.branch,
                r.status,
                _time(r.start_time),
                output.short_id(r.commit_id),
            )
            for r in runs
        ],
    )
    return 0


@command
def show_run(args: argparse.Namespace, ctx: Context) -> int:
    run = ctx.client.get_action_run(args.repo, args.run_id)
    if ctx.json:
        output.print_json(run)
        return 0
    output.fields(
        [
            ("run", run.run_id),
            ("event", run.event),
            ("branch", run.branch),
            ("ref", run.ref),
            ("commit", output.short_id(run.commit_id)),
            ("status", run.status),
            ("start", _time(run.start_time)),
            ("end", _time(run.end_time)),
            ("error", run.error),
        ]
    )
    print()
    output.table(
        ("ACTION", "HOOK", "STATUS", "HTTP", "SECONDS", "OUTPUT / ERROR"),
        [
            (
                h.action,
                h.hook_id,
                h.status,
                h.http_status or "-",
                f"{h.duration.ToNanoseconds() / 1e9:.3f}",
                # Both: a refusing hook's answer says why ("HTTP 400: missing column ...").
                ": ".join(t for t in (h.error, h.output) if t).replace("\n", " ")[:120],
            )
            for h in run.hooks
        ],
    )
    return 0


def register_actions(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    text = "the runs of action hooks (pre/post commit, merge, revert, ...; docs/actions.md)"
    parser = sub.add_parser("actions", help=text, description=text, parents=[common])
    groups = parser.add_subparsers(dest="actions_group", metavar="GROUP", required=True)
    runs_text = "list and show action runs"
    runs = groups.add_parser("runs", help=runs_text, description=runs_text, parents=[common])
    verbs = runs.add_subparsers(dest="runs_action", metavar="ACTION", required=True)
    text = "action runs, newest first"
    p = verbs.add_parser("list", help=text, description=text, parents=[common])
    p.add_argument("repo", metavar="REPO", help="the repository")
    p.add_argument("--branch", help="only the runs of this branch")
    p.add_argument("--commit", help="only the runs of this commit (post events)")
    p.add_argument("--amount", type=int, default=100, help="at most this many runs (100)")
    p.set_defaults(func=list_runs)
    text = "one run: its status and each hook's status, HTTP status, duration and output"
    p = verbs.add_parser("show", help=text, description=text, parents=[common])
    p.add_argument("repo", metavar="REPO", help="the repository")
    p.add_argument("run_id", metavar="RUN_ID", help="the run (a failed pre-hook's error names it)")
    p.set_defaults(func=show_run)


COMMANDS = {"actions": register_actions}
