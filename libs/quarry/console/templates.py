"""Jinja2 templates of the console (autoescaped: every value a user or a repository supplies
is escaped where it is shown)."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jinja2

FOLDER = Path(__file__).parent / "html"


def timestamp(ts: Any) -> str:
    """A Timestamp as UTC date and time ("" when unset). Formatted by the C library (a listing
    page formats one per row: ~0.7 µs against datetime's ~1.9). Any int64 a client staged
    shows: past the C library's range, as its raw seconds."""
    if ts is None or not getattr(ts, "seconds", 0):
        return ""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts.seconds))
    except (OverflowError, OSError, ValueError):
        return f"{ts.seconds} s after 1970-01-01 UTC"


def size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(n)


# The Unicode direction marks and overrides, shown as their escapes: in a name they would
# display it reversed or reordered (an object "txt.exe" shown as "exe.txt").
_BIDI = str.maketrans(
    {c: f"\\u{c:04x}" for c in (0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))}
)


def without_bidi(value: Any) -> Any:
    """The `shown` filter, on the names a page shows (object paths, metadata keys,
    committers, storage namespaces): direction controls escaped (markup the console built
    stays markup). Prose and data (messages, a hook's answer, a file's text) keep theirs:
    right-to-left text uses them. A filter where needed, not Jinja's finalize on every
    value: that made a listing page's rendering three times as costly."""
    if type(value) is str:
        return value.translate(_BIDI)
    if isinstance(value, str):  # markupsafe.Markup: translated, it must stay Markup
        return type(value)(str.translate(value, _BIDI))
    return value


class Templates:
    """The console's pages. The Jinja2 environment is made on the first render: a console
    that serves no page (most of a `quarry up`'s life) never loads Jinja2."""

    @functools.cached_property
    def _env(self) -> jinja2.Environment:
        import jinja2

        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(FOLDER)),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            # The templates ship with the package: no stat() of each file on every render.
            auto_reload=False,
        )
        env.filters["time"] = timestamp
        env.filters["size"] = size
        env.filters["short"] = lambda s: (s or "")[:12]
        env.filters["shown"] = without_bidi
        return env

    def render(self, name: str, **values: Any) -> str:
        return self._env.get_template(name).render(**values)
