"""`quarry completion bash|zsh|fish`: the shell script that completes quarry's commands,
flags and choices, and the names of repositories, branches and tags from the server
(argcomplete: the shell asks `quarry` itself, so completion always matches this build's
parser).

    eval "$(quarry completion bash)"    # in ~/.bashrc
    eval "$(quarry completion zsh)"     # in ~/.zshrc
    quarry completion fish | source     # in ~/.config/fish/config.fish
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any

from quarry.cli.base import Subparsers

SHELLS = ("bash", "zsh", "fish")


def completion(args: argparse.Namespace) -> int:
    import argcomplete

    print(argcomplete.shellcode(["quarry"], shell=args.shell), end="")
    return 0


def register(sub: Subparsers, _common: argparse.ArgumentParser) -> None:
    help_text = 'print the shell completion script (eval "$(quarry completion bash)")'
    p = sub.add_parser("completion", help=help_text, description=__doc__)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash, zsh or fish")
    p.set_defaults(func=completion)


# ---- names from the server ------------------------------------------------------------------
#
# REPO, BRANCH, REF and the like complete with the names on the server the command line
# points at (its --branch-manager, else the settings'), asked with a short deadline and no
# retry; an unreachable or refusing server completes nothing, silently.

COMPLETION_TIMEOUT_SECONDS = 2.0
Completer = Callable[..., list[str]]


def _names(
    parsed_args: argparse.Namespace, list_names: Callable[[Any], Iterable[str]]
) -> list[str]:
    try:
        from quarry.cli.base import Context
        from quarry.client import Client, RetryPolicy
        from quarry.client.token_cache import TokenCache

        settings = Context(parsed_args).settings
        with Client.from_settings(
            settings,
            retry=RetryPolicy.none(),
            timeout=COMPLETION_TIMEOUT_SECONDS,
            token_cache=TokenCache(settings.home),
        ) as client:
            return sorted(list_names(client))
    except Exception:
        return []


def _repositories(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    return _names(parsed_args, lambda c: (r.name for r in c.iter_repositories()))


def _branches(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    repo = getattr(parsed_args, "repo", None)
    if not repo:
        return []
    return _names(parsed_args, lambda c: (b.name for b in c.iter_branches(repo)))


def _tags(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    repo = getattr(parsed_args, "repo", None)
    if not repo:
        return []
    return _names(parsed_args, lambda c: (t.name for t in c.iter_tags(repo)))


def _refs(prefix: str, parsed_args: argparse.Namespace, **kwargs: Any) -> list[str]:
    names = _branches(prefix, parsed_args) + _tags(prefix, parsed_args)
    return [*names, "HEAD"] if names else []


COMPLETERS: dict[str, Completer] = {
    "REPO": _repositories,
    "BRANCH": _branches,
    "DEST_BRANCH": _branches,
    "REF": _refs,
    "SOURCE_REF": _refs,
    "LEFT|BRANCH": _refs,
    "RIGHT": _refs,
}
# NAME, by the resource command it belongs to (only where it names an existing one): the
# last two words of the command's path.
NAME_COMPLETERS: dict[tuple[str, ...], Completer] = {
    ("repo", "show"): _repositories,
    ("repo", "delete"): _repositories,
    ("branch", "show"): _branches,
    ("branch", "delete"): _branches,
    ("tag", "show"): _tags,
    ("tag", "delete"): _tags,
}


def attach_completers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                attach_completers(sub, (*path, name))
        elif not action.option_strings:
            key = str(action.metavar or action.dest).upper()
            completer = NAME_COMPLETERS.get(path[-2:]) if key == "NAME" else COMPLETERS.get(key)
            if completer is not None:
                action.completer = completer  # type: ignore[attr-defined]


def autocomplete(parser: argparse.ArgumentParser) -> None:
    """Answer the shell's completion request (and exit) when the script above asked;
    nothing otherwise (argcomplete is imported only then: no cost on ordinary runs)."""
    import os

    if "_ARGCOMPLETE" in os.environ:
        import argcomplete

        attach_completers(parser)
        argcomplete.autocomplete(parser)


COMMANDS = {"completion": register}
