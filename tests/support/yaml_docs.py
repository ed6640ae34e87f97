"""Rendered manifests parsed with libyaml's C parser (PyYAML's pure-Python one took most of
the chart tests' time: a chart rendering is ~40 documents, parsed hundreds of times)."""

from __future__ import annotations

from typing import Any

import yaml

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def documents(text: str) -> list[Any]:
    """The non-empty YAML documents of a multi-document text, safely loaded."""
    return [doc for doc in yaml.load_all(text, Loader=LOADER) if doc]
