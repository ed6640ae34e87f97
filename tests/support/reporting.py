"""Print a test's figures to the terminal even when pytest captures output (the figures of
the property and fault-injection runs belong in every CI log, passing or not)."""

from __future__ import annotations

import sys


def report_lines(config, lines: list[str]) -> None:
    capture = config.pluginmanager.getplugin("capturemanager")
    text = "\n" + "\n".join(lines) + "\n"
    if capture is None:
        print(text)
        return
    with capture.global_and_fixture_disabled():
        sys.stdout.write(text)
        sys.stdout.flush()
