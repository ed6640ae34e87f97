"""The `quarry` parser as a whole: every positional argument has help, and the flags a
command's help names are flags that command takes (`setup --help` once named `--secret`,
which does not exist)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

from quarry.cli.main import LOCAL_COMMANDS, build_parser, hoist_global_flags

_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
_QUOTED = re.compile(r"`[^`]*`")  # `quarry up --traces`: another command's flag, quoted


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("quarry",)
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield " ".join(path), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_positional_argument_has_help():
    missing = [
        f"{command} {action.metavar or action.dest}"
        for command, parser in _parsers(build_parser())
        for action in parser._actions
        if not action.option_strings
        and not isinstance(action, argparse._SubParsersAction)
        and not action.help
    ]
    assert missing == []


def test_the_flags_a_command_help_names_are_its_own():
    wrong = []
    for command, parser in _parsers(build_parser()):
        own = {flag for action in parser._actions for flag in action.option_strings}
        texts = [parser.description or ""] + [a.help or "" for a in parser._actions]
        named = {flag for text in texts for flag in _FLAG.findall(_QUOTED.sub("", text))}
        # A group's help may name its leaves' flags.
        leaves = {
            flag
            for name, sub in _parsers(parser)
            for action in sub._actions
            for flag in action.option_strings
        }
        wrong += [f"{command}: {flag}" for flag in sorted(named - own - leaves)]
    assert wrong == []


def test_global_flags_move_after_the_command():
    assert hoist_global_flags(["--branch-manager", "h:1", "--json", "repo", "list"]) == [
        "repo",
        "list",
        "--branch-manager",
        "h:1",
        "--json",
    ]
    assert hoist_global_flags(["--committer=h:2", "rm", "r", "b", "--", "--odd"]) == [
        "rm",
        "r",
        "b",
        "--committer=h:2",
        "--",
        "--odd",
    ]
    assert hoist_global_flags(["repo", "list", "--json"]) == ["repo", "list", "--json"]


def test_a_local_command_built_alone_is_the_command_of_the_whole_parser():
    """`quarry serve` and the other LOCAL_COMMANDS build their parser alone: it must be the
    very command the whole parser has (its help, its arguments), and nothing else."""
    whole = dict(_parsers(build_parser()))
    for name in LOCAL_COMMANDS:
        alone = dict(_parsers(build_parser(only=name)))
        commands = {path for path in alone if path != "quarry"}
        own = {p for p in whole if p == f"quarry {name}" or p.startswith(f"quarry {name} ")}
        assert commands == own, name
        for path in commands:
            assert alone[path].format_help() == whole[path].format_help(), path
