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


import pytest

from quarry.cli.main import main as quarry_main


@pytest.mark.parametrize(
    "argv",
    [
        ["--timeout", "0", "repo", "list"],
        ["--timeout", "-1", "repo", "list"],
        ["--timeout", "nan", "repo", "list"],
        ["--timeout", "inf", "repo", "list"],
        ["--branch-manager", "127.0.0.1:99999", "repo", "list"],
        ["--committer", "127.0.0.1:0", "log", "r", "main"],
        ["--committer", "127.0.0.1", "log", "r", "main"],
        ["--branch-manager", "host:port", "repo", "list"],
        ["--branch-manager", "::1:7402", "repo", "list"],
        ["log", "r", "main", "-n", "-1"],
        ["log", "r", "main", "-n", "0"],
        ["repo", "create", "r", "/tmp/r", "--staging-shards", "0"],
        ["repo", "show", "\udcff\udcfe"],  # bytes that were not UTF-8, as Python decodes argv
    ],
)
def test_values_no_call_could_use_are_usage_errors(argv, capsys):
    """Exit 2 with a usage line, before any call (these used to fail every call with
    DEADLINE_EXCEEDED, dial port 99999 % 65536, or answer INTERNAL)."""
    with pytest.raises(SystemExit) as exited:
        quarry_main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "INTERNAL" not in err and "Traceback" not in err


def test_get_of_a_path_with_no_file_name_asks_for_one(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for path in ("..", "a/.", "dir/"):
        assert quarry_main(["get", "r", "main", path]) == 2
        assert "-o FILE" in capsys.readouterr().err


def test_a_commands_span_name_is_every_word_of_the_command_and_none_of_its_arguments():
    from quarry.cli.base import command_name

    parser = build_parser()
    for argv, name in [
        (["auth", "users", "create", "secret-ish"], "quarry auth users create"),
        (["auth", "credentials", "create", "u"], "quarry auth credentials create"),
        (["actions", "runs", "list", "r"], "quarry actions runs list"),
        (["repo", "list"], "quarry repo list"),
        (["log", "r", "main"], "quarry log"),
    ]:
        assert command_name(parser.parse_args(argv)) == name


def test_presign_names_the_gateway_by_https_under_tls():
    """A CLI set up for TLS as docs/tls.md shows (the CA alone) printed http:// URLs."""
    from quarry.cli.sharing import s3_gateway_url
    from quarry.config import load_settings

    plain = load_settings(env={}, s3_gateway_address="gw:7406")
    assert s3_gateway_url(plain) == "http://gw:7406"
    for tls in ({"tls_ca_file": "/ca.pem"}, {"tls_cert_file": "/c.pem", "tls_key_file": "/k.pem"}):
        assert s3_gateway_url(plain.replace(**tls)) == "https://gw:7406"
