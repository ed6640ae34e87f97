"""Jinja2 templates of the console (autoescaped: every value a user or a repository supplies
is escaped where it is shown)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import jinja2

FOLDER = Path(__file__).parent / "html"


def timestamp(ts: Any) -> str:
    if ts is None or not getattr(ts, "seconds", 0):
        return ""
    moment = datetime.datetime.fromtimestamp(ts.seconds, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(n)


class Templates:
    def __init__(self) -> None:
        self._env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(FOLDER)),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            # The templates ship with the package: no stat() of each file on every render.
            auto_reload=False,
        )
        self._env.filters["time"] = timestamp
        self._env.filters["size"] = size
        self._env.filters["short"] = lambda s: (s or "")[:12]

    def render(self, name: str, **values: Any) -> str:
        return self._env.get_template(name).render(**values)
