"""A tiny dependency-free progress printer for long CLI work, on stderr.

    with Progress("uploading", total=120, unit="files") as bar:
        for ...:
            bar.advance()

It draws only when enabled: by default when the stream is a terminal (pass enabled=True
for `--progress`). Redraws are throttled; `clear()` wipes the line so other output can be
printed between redraws.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

BAR_WIDTH = 24


def human_count(n: float) -> str:
    for unit in ("", "k", "M", "G"):
        if abs(n) < 1000:
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.1f}{unit}"
        n /= 1000
    return f"{n:.1f}T"


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class Progress:
    def __init__(  # noqa: PLR0913 — keyword options of a public class (tests set them)
        self,
        label: str,
        total: int | None = None,
        *,
        unit: str = "",
        stream: TextIO | None = None,
        enabled: bool | None = None,
        min_interval: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.done = 0
        self._clock = clock
        self._started = clock()
        self._last_draw = float("-inf")
        self._min_interval = min_interval
        self._drawn = False
        self._width = 0

    # ---- updates ----

    def advance(self, n: int = 1) -> None:
        self.update(self.done + n)

    def update(self, done: int) -> None:
        self.done = done
        if not self.enabled:
            return
        now = self._clock()
        finished = self.total is not None and done >= self.total
        if finished or now - self._last_draw >= self._min_interval:
            self._draw(now)

    def render(self, now: float | None = None) -> str:
        now = self._clock() if now is None else now
        elapsed = max(now - self._started, 1e-9)
        rate = self.done / elapsed
        unit = f" {self.unit}" if self.unit else ""
        if self.total:
            fraction = min(1.0, self.done / self.total)
            filled = int(round(fraction * BAR_WIDTH))
            bar = "#" * filled + "-" * (BAR_WIDTH - filled)
            return (
                f"{self.label} [{bar}] {self.done:,}/{self.total:,}{unit} "
                f"{fraction * 100:3.0f}%  {human_count(rate)}/s"
            )
        return f"{self.label} {self.done:,}{unit}  {human_count(rate)}/s"

    def _draw(self, now: float) -> None:
        text = self.render(now)
        pad = " " * max(0, self._width - len(text))
        self.stream.write("\r" + text + pad)
        self.stream.flush()
        self._width = len(text)
        self._drawn = True
        self._last_draw = now

    def clear(self) -> None:
        """Wipe the bar (before printing other lines to the same terminal)."""
        if self.enabled and self._drawn:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._drawn = False
            self._width = 0
            self._last_draw = float("-inf")

    def close(self) -> None:
        """Draw the final state and end the line."""
        if not self.enabled:
            return
        self._draw(self._clock())
        self.stream.write("\n")
        self.stream.flush()
        self._drawn = False
        self.enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.clear()
            self.enabled = False
