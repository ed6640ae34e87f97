"""The `quarry` command line.

One module per resource, each with its handlers and, beside each handler, the function that
adds its parser (`COMMANDS`: command name -> registration):

    quarry.cli.services    up, serve, version, settings
    quarry.cli.transfer    export, import (the KV backend itself, services stopped)
    quarry.cli.repos       repo create | list | show | delete
    quarry.cli.branches    branch create | list | show | delete; reset; discard
    quarry.cli.tags        tag create | list | show | delete
    quarry.cli.objects     put, rm, ls, stat
    quarry.cli.history     commit, log, diff
    quarry.cli.merging     merge, revert, cherry-pick
    quarry.cli.compaction  compact, stats
    quarry.cli.doctor      doctor
    quarry.cli.gc          gc run | set-rules | show-rules | delete-rules
    quarry.cli.setup       setup (the first admin and its credentials file)
    quarry.cli.auth        auth token | whoami, and under it one module per resource:
                           auth_users, auth_credentials, auth_groups, auth_policies

quarry.cli.base holds what the client commands share (Context, the `command` wrapper that
turns failures into `quarry: <REASON>: <message>` and exit code 1, the common options).
This module only builds the parser from those modules and dispatches.
"""

from __future__ import annotations

import argparse
import sys

from quarry.cli import (
    auth,
    base,
    branches,
    compaction,
    doctor,
    gc,
    history,
    merging,
    objects,
    protect,
    repos,
    services,
    setup,
    tags,
    transfer,
)

# Re-exported: scripts and tests know them from here.
from quarry.cli.services import SERVICE_MODULES, start_order

_REGISTRATIONS: dict[str, base.Registration] = {
    name: register
    for module in (
        services,
        transfer,
        repos,
        branches,
        tags,
        objects,
        history,
        merging,
        compaction,
        doctor,
        gc,
        setup,
        auth,
        protect,
    )
    for name, register in module.COMMANDS.items()
}

# The order `quarry --help` lists the commands in.
COMMAND_ORDER = (
    "up",
    "serve",
    "version",
    "settings",
    "export",
    "import",
    "repo",
    "branch",
    "tag",
    "put",
    "rm",
    "ls",
    "stat",
    "commit",
    "log",
    "diff",
    "merge",
    "revert",
    "cherry-pick",
    "reset",
    "discard",
    "compact",
    "stats",
    "doctor",
    "gc",
    "setup",
    "auth",
    "branch-protect",
)


def build_parser() -> argparse.ArgumentParser:
    if set(COMMAND_ORDER) != set(_REGISTRATIONS):
        raise RuntimeError(
            f"commands without a place in COMMAND_ORDER, or the reverse: "
            f"{sorted(set(COMMAND_ORDER) ^ set(_REGISTRATIONS))}"
        )
    parser = argparse.ArgumentParser(
        prog="quarry",
        description=__doc__.split("\n")[0] or "Quarry: version control for data-lake metadata",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    common = base.common_options()
    for name in COMMAND_ORDER:
        _REGISTRATIONS[name](sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `quarry settings | head`
        return 0


__all__ = ["main", "build_parser", "COMMAND_ORDER", "SERVICE_MODULES", "start_order"]

if __name__ == "__main__":
    sys.exit(main())
