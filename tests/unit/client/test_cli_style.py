"""The CLI's shared mechanisms without a server: when colours are on, and the one mapping
from request field names to CLI flags (every flag it names exists, every field is real)."""

from __future__ import annotations

import argparse
import io

import pytest

from quarry.cli import style
from quarry.cli.base import REQUEST_FIELD_FLAGS, flag_names
from quarry.cli.main import build_parser
from quarry.v1 import auth_pb2, branch_manager_pb2, committer_pb2, compactor_sensor_pb2, types_pb2


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("when", "no_color", "stream", "expected"),
    [
        ("auto", None, Terminal(), True),
        ("auto", None, io.StringIO(), False),
        ("auto", "1", Terminal(), False),
        ("auto", "", Terminal(), True),  # no-color.org: only a non-empty value disables
        ("always", "1", io.StringIO(), True),
        ("never", None, Terminal(), False),
    ],
)
def test_when_colours_are_on(monkeypatch, when, no_color, stream, expected):
    monkeypatch.delenv("NO_COLOR", raising=False)
    if no_color is not None:
        monkeypatch.setenv("NO_COLOR", no_color)
    assert style.wanted(when, stream) is expected


def test_paint_leaves_text_alone_when_off():
    style.configure("never", io.StringIO(), io.StringIO())
    assert style.mark("+") == "+" and style.err("x", "red") == "x"
    style.configure("always", io.StringIO(), io.StringIO())
    try:
        assert style.mark("+") == "\x1b[32m+\x1b[0m"
        assert style.err("x", "red", "bold") == "\x1b[31;1mx\x1b[0m"
    finally:
        style.configure("never", io.StringIO(), io.StringIO())


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    found = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found |= _option_strings(child)
    return found


def test_every_mapped_field_is_a_request_field_and_every_flag_exists():
    flags = _option_strings(build_parser())
    assert set(REQUEST_FIELD_FLAGS.values()) <= flags
    modules = (branch_manager_pb2, committer_pb2, compactor_sensor_pb2, auth_pb2, types_pb2)
    request_fields = {  # the fields of requests and of the messages they carry (Entry, ...)
        field.name
        for module in modules
        for message in module.DESCRIPTOR.message_types_by_name.values()
        for field in message.fields
    }
    assert set(REQUEST_FIELD_FLAGS) <= request_fields, set(REQUEST_FIELD_FLAGS) - request_fields


def test_flag_names_replaces_whole_field_names_only():
    assert flag_names("choose the parent_number (1..2)") == "choose the --parent (1..2)"
    assert flag_names("my_parent_number_x stays") == "my_parent_number_x stays"
