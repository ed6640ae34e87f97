"""The `quarry` command line.

One module per resource, each with its handlers and, beside each handler, the function that
adds its parser (`COMMANDS`: command name -> registration):

    quarry.cli.services    up, serve, version, settings
    quarry.cli.traces      traces (a local trace receiver)
    quarry.cli.transfer    store export | import (the KV backend itself, services stopped)
    quarry.cli.importing   import (zero-copy, into a branch) | import status | import cancel
    quarry.cli.repos       repo create | list | show | delete
    quarry.cli.branches    branch create | list | show | delete; reset; discard
    quarry.cli.tags        tag create | list | show | delete
    quarry.cli.objects     put, rm, ls, stat, cat, get
    quarry.cli.history     commit, log, diff
    quarry.cli.merging     merge, revert, cherry-pick
    quarry.cli.actions     actions runs list | show
    quarry.cli.compaction  compact, stats
    quarry.cli.doctor      doctor
    quarry.cli.gc          gc run | set-rules | show-rules | delete-rules
    quarry.cli.setup       setup (the first admin and its credentials file)
    quarry.cli.auth        auth token | whoami, and under it one module per resource:
                           auth_users, auth_credentials, auth_groups, auth_policies

    quarry.cli.completion  completion bash | zsh | fish

quarry.cli.base holds what the client commands share (Context, the `command` wrapper that
turns failures into `quarry: <REASON>: <message>` and exit code 1, the common options).
This module only builds the parser from those modules and dispatches; its parser answers a
mistyped command with the closest commands (as git does) instead of the whole usage.

Argument parsing stays on the standard library's argparse (with argcomplete for shell
completion): the commands, their help and tests are built on it, and it does what click or
typer would add here.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import os
import re
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, NoReturn

import quarry

# Re-exported: scripts and tests know them from here.
from quarry.cli.services import SERVICE_MODULES, start_order

if TYPE_CHECKING:
    from quarry.cli.base import Registration

# The modules of quarry.cli that hold the commands (each a COMMANDS dict: name ->
# registration), imported when a parser is built.
COMMAND_MODULES = (
    "services",
    "transfer",
    "repos",
    "branches",
    "tags",
    "objects",
    "sharing",
    "history",
    "importing",
    "merging",
    "actions",
    "compaction",
    "doctor",
    "gc",
    "setup",
    "auth",
    "protect",
    "traces",
    "completion",
)
# Commands that use neither the client library nor the common connection options, each
# with its module: their parser is built alone, without the client library or the other
# commands' modules. Every service process is a `quarry serve` (a branch-manager's worker
# too), so every service start skips them (tests/unit/test_import_cost.py).
LOCAL_COMMANDS = {
    "up": "services",
    "serve": "services",
    "version": "services",
    "settings": "services",
    "traces": "traces",
}


def _registrations(modules: Iterable[str]) -> dict[str, Registration]:
    return {
        name: register
        for module in modules
        for name, register in importlib.import_module(f"quarry.cli.{module}").COMMANDS.items()
    }


# The order `quarry --help` lists the commands in.
COMMAND_ORDER = (
    "up",
    "serve",
    "version",
    "settings",
    "traces",
    "store",
    "repo",
    "branch",
    "tag",
    "put",
    "rm",
    "ls",
    "stat",
    "cat",
    "get",
    "cp",
    "presign",
    "commit",
    "log",
    "diff",
    "import",
    "merge",
    "revert",
    "cherry-pick",
    "actions",
    "reset",
    "discard",
    "compact",
    "stats",
    "doctor",
    "gc",
    "setup",
    "auth",
    "branch-protect",
    "completion",
)

VERSION_TEXT = f"quarry {quarry.__version__} (storage format version {quarry.FORMAT_VERSION})"
EXIT_USAGE = 2
_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)'")

# What a lakectl or git habit types, and Quarry's way of saying it: (command words as
# typed) -> the hint a mistyped command gets; a flag -> the flag it means.
HABITS = {
    ("fs",): "The object commands are top level: quarry ls, stat, cat, get, put, rm, cp, presign.",
    ("branch", "reset"): "Dropping uncommitted changes is `quarry discard`; moving a branch "
    "to a commit is `quarry reset`.",
    ("branch", "revert"): "Reverting a commit is `quarry revert`.",
    ("show",): "A commit: `quarry log REPO REF -n 1`; a branch: `quarry branch show`.",
}
FLAG_HABITS = {
    "--amount": "-n",
    "--limit": "-n",
    "--max-count": "-n",
    "--objects": "--path",
    "--prefixes": "--prefix",
}


class QuarryParser(argparse.ArgumentParser):
    """argparse, with usage errors as git reports them: a mistyped command or flag gets the
    closest names ("did you mean"), not the whole usage; under --json, one JSON object."""

    json_errors = False  # set by main() when the command line asks for --json
    argv: tuple[str, ...] = ()  # set by main(): finds the subcommand of an unknown flag

    def _commands(self) -> dict[str, argparse.ArgumentParser]:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    def _innermost(self) -> argparse.ArgumentParser:
        """The (sub)command parser the command line reached."""
        parser: argparse.ArgumentParser = self
        for token in self.argv:
            commands = parser._commands() if isinstance(parser, QuarryParser) else {}
            if token in commands:
                parser = commands[token]
        return parser

    def _flag_hint(self, message: str) -> str:
        unknown = message.split(":", 1)[1].split()
        parser = self._innermost()
        flags = [o for action in parser._actions for o in action.option_strings]
        hints = [
            f"'{close[0]}'"
            for token in unknown
            if token.startswith("--")
            for close in [
                # A habit's flag where this command has it; none where it does not (never a
                # merely similar flag: `ls --limit` suggested --timeout).
                (
                    [FLAG_HABITS[token.split("=")[0]]]
                    if FLAG_HABITS[token.split("=")[0]] in flags
                    else []
                )
                if token.split("=")[0] in FLAG_HABITS
                else difflib.get_close_matches(token.split("=")[0], flags, n=1)
            ]
            if close
        ]
        hint = f" See '{parser.prog} --help'."
        return hint + (" Did you mean " + ", ".join(hints) + "?" if hints else "")

    def error(self, message: str) -> NoReturn:
        names = list(self._commands())
        typo = _INVALID_CHOICE.search(message)
        usage = ""
        if typo and names:
            typed = typo.group(1)
            close = difflib.get_close_matches(typed, names, n=3, cutoff=0.6)
            message = f"'{typed}' is not a {self.prog} command. See '{self.prog} --help'."
            habit = HABITS.get((*self.prog.split()[1:], typed))
            if habit:
                message += f" {habit}"
            elif close:
                message += " Did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
        elif message.startswith("unrecognized arguments:"):
            message += "." + self._flag_hint(message)
        elif names and self.prog == "quarry":
            # The top level's usage lists every command: point at --help instead.
            message += f". See '{self.prog} --help'."
        else:
            usage = self.format_usage()  # a subcommand's: one to three lines
        if self.json_errors:
            error = {"code": "INVALID_ARGUMENT", "reason": "USAGE", "message": message}
            self.exit(EXIT_USAGE, json.dumps({"error": {**error, "metadata": {}}}) + "\n")
        self.exit(EXIT_USAGE, f"{usage}{self.prog}: error: {message}\n")


# Help for the positional arguments commands share, by metavar (NAME: by its resource). A
# command's own `help=` wins; tests/unit/test_cli_parser.py checks every positional has help.
_REF_HELP = (
    "a branch, tag or commit id (6+ hex characters), optionally with ~N / ^N; "
    "HEAD or @ is the default branch"
)
POSITIONAL_HELP = {
    "REPO": "the repository's name",
    "BRANCH": "the branch's name",
    "REF": _REF_HELP,
    "SOURCE_REF": "what to merge: " + _REF_HELP,
    "DEST_BRANCH": "the branch to merge into",
    "LEFT|BRANCH": "the left side of the diff (a ref), or the branch with --uncommitted",
    "RIGHT": "the right side of the diff (a ref)",
    "PATH": "an object's path in the repository",
    "PREFIX": "list only paths starting with this prefix",
    "PATTERN": "a branch-name glob, e.g. main or release-*",
    "USER": "the user's id",
    "KEY": "the access key id",
    "FILE": "the export file (JSON lines)",
    "SERVICE": "the service to run",
}
_NAME_HELP = {
    "repo": "the repository's name",
    "branch": "the branch's name",
    "tag": "the tag's name",
    "policies": "the policy's name",
}


def _help_positionals(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> None:
    """Give every positional argument without help its shared text (POSITIONAL_HELP)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                _help_positionals(sub, (*path, name))
        elif not action.option_strings and not action.help:
            key = str(action.metavar or action.dest).upper()
            if key == "NAME":
                action.help = next((_NAME_HELP[w] for w in path if w in _NAME_HELP), None)
            else:
                action.help = POSITIONAL_HELP.get(key)


def _name_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("quarry",)) -> None:
    """Each (sub)command's parser records its words (`quarry auth users create`) as the
    default `command_name`: the deepest one parsed wins (base.command_name, the CLI span's
    name). An alias keeps the name it aliases (the first name registered for a parser)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if sub.get_default("command_name") is None:
                    sub.set_defaults(command_name=" ".join((*path, name)))
                    _name_commands(sub, (*path, name))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line's parser, or with `only` (one of LOCAL_COMMANDS) that
    command's alone."""
    if only is None:
        registrations = _registrations(COMMAND_MODULES)
        if set(COMMAND_ORDER) != set(registrations):
            raise RuntimeError(
                f"commands without a place in COMMAND_ORDER, or the reverse: "
                f"{sorted(set(COMMAND_ORDER) ^ set(registrations))}"
            )
        names: tuple[str, ...] = COMMAND_ORDER
        from quarry.cli.base import common_options

        common = common_options()
    else:
        registrations = _registrations([LOCAL_COMMANDS[only]])
        names = (only,)
        common = argparse.ArgumentParser(add_help=False)  # a local command takes none
    parser = QuarryParser(
        prog="quarry",
        description="Quarry: version control for data-lake metadata.",
        epilog="The connection and output options (--branch-manager, --committer, --timeout, "
        "--json, --full, --trace, --color) go before or after the command. "
        "`quarry help COMMAND` shows a command's arguments.",
    )
    parser.add_argument("--version", action="version", version=VERSION_TEXT)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in names:
        registrations[name](sub, common)
    _help_positionals(parser)
    _name_commands(parser)
    return parser


def _global_flags() -> dict[str, bool]:
    """The common options (base.common_options) by flag: whether each takes a value."""
    from quarry.cli.base import common_options

    return {
        flag: action.nargs != 0
        for action in common_options()._actions
        for flag in action.option_strings
    }


def hoist_global_flags(argv: list[str]) -> list[str]:
    """`quarry --branch-manager H:P repo list` as `quarry repo list --branch-manager H:P`:
    the common options given before the command (git's habit) move after it (before a
    `--`, which ends the options), where the command's parser takes them."""
    flags = _global_flags()
    leading: list[str] = []
    i = 0
    while i < len(argv):
        name = argv[i].split("=", 1)[0]
        if name not in flags:
            break
        takes_value = flags[name] and "=" not in argv[i]
        leading.extend(argv[i : i + 2] if takes_value else argv[i : i + 1])
        i += 2 if takes_value else 1
    if not leading:
        return argv
    rest = argv[i:]
    end = rest.index("--") if "--" in rest else len(rest)
    return rest[:end] + leading + rest[end:]


def _print_help(parser: argparse.ArgumentParser, words: list[str]) -> int:
    """`quarry help [COMMAND [ACTION]]`: that parser's help on stdout."""
    target = parser
    for word in words:
        commands = target._commands() if isinstance(target, QuarryParser) else {}
        if word not in commands:
            target.error(f"argument COMMAND: invalid choice: '{word}'")
        target = commands[word]
    target.print_help()
    return 0


def _command_of(
    argv: list[str], parser: argparse.ArgumentParser
) -> tuple[argparse.ArgumentParser, int]:
    """The parser of the (sub)command `argv` names, and how many of its words name it."""
    sub: argparse.ArgumentParser = parser
    words = 0
    for token in argv:
        commands = sub._commands() if isinstance(sub, QuarryParser) else {}
        if token not in commands:
            break
        sub, words = commands[token], words + 1
    return sub, words


def switches_first(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """The command's switches (options that take no value) moved ahead of its positionals:
    `rm REPO BRANCH -r FOLDER` as `rm -r REPO BRANCH FOLDER`. argparse fills every
    positional from the first run of them, so a list (`PATH...`) or an optional one
    (`ls`'s PREFIX) after a switch was refused as unrecognized. Options that take a value,
    and everything after `--`, stay where they are."""
    sub, words = _command_of(argv, parser)
    if words == 0:
        return argv  # no command (`quarry help rm -h`, `quarry --version`): as given
    switches = {
        option for action in sub._actions for option in action.option_strings if action.nargs == 0
    }
    rest = argv[words:]
    end = rest.index("--") if "--" in rest else len(rest)
    moved = [token for token in rest[:end] if token in switches]
    if not moved:
        return argv
    kept = [token for token in rest[:end] if token not in switches]
    return argv[:words] + moved + kept + rest[end:]


URI_SCHEME = "quarry://"
# Commands whose later URIs name other refs of the repository (REF [PATH] each).
MULTI_REF_COMMANDS = frozenset({"quarry diff", "quarry merge", "quarry cp"})
# Commands whose URI path is a prefix option rather than a positional.
PATH_OPTIONS = {"quarry diff": "--prefix", "quarry log": "--prefix"}


def expand_uris(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """`quarry://REPO/REF[/PATH]` where a command takes REPO REF [PATH] (lakectl's
    `lakefs://` habit): the first URI stands for REPO REF [PATH]; a later one names the
    same repository, and for diff, merge and cp another REF [PATH], for every other command
    the same REF and another PATH (`rm quarry://R/dev/a quarry://R/main/b` is refused: it
    once removed b from dev). An option's value (a message, `import --to`) stays as given.
    ValueError for a URI that names no REF, or another repository or ref."""
    sub, _ = _command_of(argv, parser)
    command = str(sub.get_default("command_name") or "")
    takes_value = {
        option for action in sub._actions for option in action.option_strings if action.nargs != 0
    }
    out: list[str] = []
    first: tuple[str, str] | None = None
    prefix = ""
    for index, token in enumerate(argv):
        previous = argv[index - 1] if index else ""
        if not token.startswith(URI_SCHEME):
            out.append(token)
            continue
        if previous in takes_value:
            out.append(token)  # an option's own value: as given
            continue
        repo, _, rest = token[len(URI_SCHEME) :].partition("/")
        ref, _, path = rest.partition("/")
        if not repo or not ref:
            raise ValueError(f"{token!r}: a URI is quarry://REPO/REF[/PATH]")
        if path.startswith("-"):
            # Handed on as a word, it would be read as an option (`-r`: remove folders).
            raise ValueError(
                f"{token!r}: a path that starts with '-' goes after `--`: REPO REF -- PATH"
            )
        if first is not None and repo != first[0]:
            raise ValueError(f"{token!r} names repository {repo!r}; the first URI {first[0]!r}")
        if first is None:
            first = (repo, ref)
            out += [repo, ref]
        elif command in MULTI_REF_COMMANDS:
            out.append(ref)
        elif ref != first[1]:
            raise ValueError(
                f"{token!r} names ref {ref!r}; the first URI {first[1]!r} (this command works "
                "on one ref)"
            )
        if path and command in PATH_OPTIONS:
            if prefix and path != prefix:
                raise ValueError(f"{token!r}: the URIs name two prefixes, {prefix!r} and {path!r}")
            prefix = path
        elif path:
            out.append(path)
    if prefix:
        out += [PATH_OPTIONS[command], prefix]
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    completing = "_ARGCOMPLETE" in os.environ  # the shell asks: it needs every command
    local = argv[0] if argv and argv[0] in LOCAL_COMMANDS and not completing else None
    parser = build_parser(only=local)
    if completing:
        from quarry.cli.completion import autocomplete

        autocomplete(parser)
    if local is None:
        argv = hoist_global_flags(argv)
    QuarryParser.argv = tuple(argv)
    if local is None:
        try:
            argv = expand_uris(argv, parser)
        except ValueError as exc:
            parser.error(str(exc))
        argv = switches_first(argv, parser)
    QuarryParser.json_errors = "--json" in QuarryParser.argv
    if not argv or argv[0] == "help":  # `quarry`, `quarry help [COMMAND]`: git's habits
        return _print_help(parser, argv[1:])
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:  # bytes the filesystem encoding could not decode
            parser.error(f"argument {arg!r} is not valid UTF-8")
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `quarry settings | head`
        return 0


__all__ = ["main", "build_parser", "COMMAND_ORDER", "SERVICE_MODULES", "start_order"]

if __name__ == "__main__":
    sys.exit(main())
