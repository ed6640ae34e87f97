"""The README's code blocks and what the README runner does with each.

A fenced block of shell or Python (```sh, ```bash, ```python) carries a marker in the HTML
comment on the line right above its fence, so which examples run is explicit:

    <!-- readme-runner: run -->          run in order by tests/e2e/test_readme_runner.py
    <!-- readme-runner: run (note) -->   the same, with a note for the reader
    <!-- readme-runner: skip (why) -->   never run (e.g. `make run` itself, a cluster)

tests/unit/test_readme.py fails on a shell or Python block without a marker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
RUNNABLE_LANGUAGES = {"sh": "sh", "bash": "sh", "shell": "sh", "python": "python"}
_MARKER = re.compile(r"<!--\s*readme-runner:\s*(run|skip)\b(.*?)-->")
_FENCE = re.compile(r"^```(\S*)")


@dataclass(frozen=True)
class Block:
    language: str  # "sh" or "python" (RUNNABLE_LANGUAGES), or the fence's own info string
    line: int  # the README line of the block's first code line (1-based)
    code: str
    action: str | None  # "run", "skip" or None (no marker)


def blocks(text: str | None = None) -> list[Block]:
    """Every fenced block of the README, in order."""
    lines = (text if text is not None else README.read_text()).splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        info = fence.group(1)
        marker = _MARKER.search(lines[index - 1]) if index > 0 else None
        end = index + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        action = marker.group(1) if marker else None
        found.append(
            Block(
                language=RUNNABLE_LANGUAGES.get(info, info),
                line=index + 2,
                code="\n".join(lines[index + 1 : end]) + "\n",
                action=action,
            )
        )
        index = end + 1
    return found


def runnable() -> list[Block]:
    return [b for b in blocks() if b.action == "run"]
