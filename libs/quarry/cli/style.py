"""Colours for the CLI, as git does them: on for terminals, off for pipes and files.

`--color auto` (the default) colours a stream only when it is a terminal and `NO_COLOR`
(https://no-color.org) is unset or empty; `--color always` / `never` force it. The decision
is taken once per run, for stdout and stderr, before any output (`configure`), because the
`command` wrapper buffers stdout and the buffer is no terminal.

Plain ANSI SGR codes: the CLI colours a handful of things (error reasons, commit ids,
diff marks, table headers), which does not pay for a terminal-rendering library.
"""

from __future__ import annotations

import os
from typing import TextIO

WHEN = ("auto", "always", "never")

_CODES = {
    "bold": "1",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "cyan": "36",
    "dim": "2",
}

_enabled = {"stdout": False, "stderr": False}


def wanted(when: str | None, stream: TextIO) -> bool:
    """Whether `stream` gets colours under `--color WHEN` and the environment."""
    if when == "always":
        return True
    if when == "never" or os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def configure(when: str | None, stdout: TextIO, stderr: TextIO) -> None:
    _enabled["stdout"] = wanted(when, stdout)
    _enabled["stderr"] = wanted(when, stderr)


def paint(text: str, *styles: str, stream: str = "stdout") -> str:
    """`text` wrapped in the SGR codes of `styles` when `stream` ("stdout" or "stderr") is
    coloured; `text` unchanged otherwise."""
    if not _enabled[stream] or not styles or not text:
        return text
    codes = ";".join(_CODES[s] for s in styles)
    return f"\x1b[{codes}m{text}\x1b[0m"


def err(text: str, *styles: str) -> str:
    return paint(text, *styles, stream="stderr")


# Diff marks as git colours them: added green, removed red, changed yellow, conflict red.
MARK_STYLES = {"+": ("green",), "-": ("red",), "~": ("yellow",), "!": ("red", "bold")}


def mark(symbol: str) -> str:
    return paint(symbol, *MARK_STYLES.get(symbol, ()))


def commit_id(text: str) -> str:
    return paint(text, "yellow")


def header(text: str) -> str:
    return paint(text, "bold")


__all__ = ["WHEN", "wanted", "configure", "paint", "err", "mark", "commit_id", "header"]
