"""`quarry completion bash|zsh|fish`: the shell script that completes quarry's commands,
flags and choices (argcomplete: the shell asks `quarry` itself, so completion always
matches this build's parser).

    eval "$(quarry completion bash)"    # in ~/.bashrc
    eval "$(quarry completion zsh)"     # in ~/.zshrc
    quarry completion fish | source     # in ~/.config/fish/config.fish
"""

from __future__ import annotations

import argparse

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


def autocomplete(parser: argparse.ArgumentParser) -> None:
    """Answer the shell's completion request (and exit) when the script above asked;
    nothing otherwise (argcomplete is imported only then: no cost on ordinary runs)."""
    import os

    if "_ARGCOMPLETE" in os.environ:
        import argcomplete

        argcomplete.autocomplete(parser)


COMMANDS = {"completion": register}
