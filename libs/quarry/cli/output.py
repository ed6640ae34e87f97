"""Plain-text tables and JSON for the CLI."""

from __future__ import annotations

import datetime as _dt
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from google.protobuf import descriptor, timestamp_pb2
from google.protobuf.message import Message

from quarry.cli import style
from quarry.v1 import types_pb2

if TYPE_CHECKING:
    from google._upb import _message as _upb

    # A message's DESCRIPTOR is the pure-Python class or upb's (protobuf's C implementation,
    # the one installed here): their fields and enums have the same attributes.
    FieldDescriptor = descriptor.FieldDescriptor | _upb.FieldDescriptor
    EnumDescriptor = descriptor.EnumDescriptor | _upb.EnumDescriptor

_FD = descriptor.FieldDescriptor
_INT64 = {_FD.TYPE_INT64, _FD.TYPE_UINT64, _FD.TYPE_SINT64, _FD.TYPE_FIXED64, _FD.TYPE_SFIXED64}


def timestamp_text(ts: timestamp_pb2.Timestamp | None, *, empty: str = "-") -> str:
    """UTC, second precision: 2024-05-01T12:00:00Z."""
    if ts is None or (ts.seconds == 0 and ts.nanos == 0):
        return empty
    when = _dt.datetime.fromtimestamp(ts.seconds, tz=_dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _timestamp_json(ts: timestamp_pb2.Timestamp) -> str | None:
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    return ts.ToJsonString()


def _value(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None:  # TYPE_MESSAGE
        if field.message_type.full_name == "google.protobuf.Timestamp":
            return _timestamp_json(value)
        if field.message_type.full_name == "google.protobuf.Duration":
            return value.ToNanoseconds() / 1e9  # seconds, as the text output shows them
        return to_jsonable(value)
    if field.enum_type is not None:  # TYPE_ENUM
        enum_value = field.enum_type.values_by_number.get(value)
        return enum_word(field.enum_type, enum_value.name) if enum_value is not None else value
    if field.type == _FD.TYPE_BYTES:
        return value.hex()
    return value  # ints stay ints (unlike the proto3 JSON mapping's int64 strings)


def _upper_snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


def enum_word(enum_type: EnumDescriptor, name: str) -> str:
    """An enum value in the CLI's words: CHANGE_TYPE_ADDED -> added,
    BRANCH_PROTECTION_BLOCKED_ACTION_STAGING_WRITE -> staging-write (the protos' values
    carry their enum's name as a prefix, which buf lint enforces)."""
    prefix = _upper_snake(enum_type.name) + "_"
    return name.removeprefix(prefix).lower().replace("_", "-")


def to_jsonable(message: Message) -> dict[str, Any]:
    """Every field of a message (defaults included) as JSON-ready Python values,
    snake_case names, int64 as numbers, timestamps as RFC 3339 strings (null when unset),
    durations as seconds (a number),
    enum values in the CLI's words (enum_word: `added`, `staging-write`)."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _value(value_field, v) for k, v in sorted(value.items())}
        elif field.is_repeated:
            out[field.name] = [_value(field, v) for v in value]
        elif (
            field.type == _FD.TYPE_MESSAGE
            and not message.HasField(field.name)
            or field.has_presence
            and field.type != _FD.TYPE_MESSAGE
            and not message.HasField(field.name)
        ):
            out[field.name] = None
        else:
            out[field.name] = _value(field, value)
    return out


def print_json(value: Any, stream: TextIO | None = None) -> None:
    """`value` as JSON: a protobuf message anywhere in it (top level, in a list or a dict)
    as its to_jsonable form (`users show` once put a User in a dict: INTERNAL)."""
    stream = stream or sys.stdout
    json.dump(value, stream, indent=2, sort_keys=False, default=_message_json)
    stream.write("\n")


def print_json_array(items: Iterable[Any], stream: TextIO | None = None, indent: str = "") -> None:
    """`items` as one JSON array, written item by item (the same text print_json writes for
    a list): a long listing never holds a dict per item — `--json ls` of 1M entries took
    1.3 GB that way, against 0.1 GB for the text of the same listing."""
    stream = stream or sys.stdout
    first = True
    for item in items:
        text = json.dumps(item, indent=2, sort_keys=False, default=_message_json)
        stream.write(("[\n" if first else ",\n") + indent + "  ")
        stream.write(text.replace("\n", "\n  " + indent))
        first = False
    stream.write("[]" if first else "\n" + indent + "]")
    if not indent:
        stream.write("\n")


def _message_json(value: Any) -> Any:
    if isinstance(value, Message):
        return to_jsonable(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# C0 and C1 control characters (ESC sequences, CR, BEL, NUL, DEL...) and the Unicode
# direction overrides: in text from the server (names, messages, a hook's answer) they
# could recolour, move the cursor, rewrite what the terminal shows, or reverse a name.
_CONTROLS = [chr(c) for c in range(0x20) if chr(c) not in "\t\n"] + [
    chr(c) for c in range(0x7F, 0xA0)
]
_BIDI = [chr(c) for c in (0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))]
_SHOWN = str.maketrans({c: f"\\x{ord(c):02x}" for c in _CONTROLS})
_SHOWN_ONE_LINE = str.maketrans(
    {**_SHOWN, **{ord(c): f"\\u{ord(c):04x}" for c in _BIDI}, ord("\t"): "\\t", ord("\n"): "\\n"}
)


def shown(text: str, one_line: bool = False) -> str:
    """Text from the server as the human output shows it: control characters as escapes
    (`\\x1b`); with `one_line` (a name, a path, a table cell) tabs, newlines and the
    direction overrides too (`\\u202e`: a name shown reversed). Prose (a commit message)
    keeps its direction marks: right-to-left text uses them. --json output is JSON and
    escapes what it must itself."""
    return text.translate(_SHOWN_ONE_LINE if one_line else _SHOWN)


def listing(
    items: Sequence[Any],
    as_json: bool,
    headers: Sequence[str],
    row: Callable[[Any], Sequence[Any]],
) -> None:
    """A list command's output: the items as one JSON array (`--json`), or a table of
    `row(item)` under `headers`."""
    if as_json:
        print_json_array(items)
    else:
        table(headers, [row(item) for item in items])


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    stream: TextIO | None = None,
    *,
    right: Sequence[int] = (),
) -> None:
    """Columns padded to their widest cell; `right` lists right-aligned column indexes."""
    stream = stream or sys.stdout
    cells = [[str(c) for c in headers]] + [[shown(str(c), True) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for number, row in enumerate(cells):
        parts = []
        for i, cell in enumerate(row):
            last = i == len(row) - 1
            if i in right:
                parts.append(cell.rjust(widths[i]))
            else:
                parts.append(cell if last else cell.ljust(widths[i]))
        line = "  ".join(parts).rstrip()
        stream.write((style.header(line) if number == 0 else line) + "\n")


def fields(pairs: Iterable[tuple[str, Any]], stream: TextIO | None = None) -> None:
    """`key:  value` lines, keys aligned."""
    stream = stream or sys.stdout
    pairs = list(pairs)
    width = max((len(k) for k, _ in pairs), default=0) + 1
    for key, value in pairs:
        stream.write(f"{(key + ':').ljust(width)} {shown(str(value))}\n")


def metadata_text(metadata: Mapping[str, str]) -> str:
    text = ", ".join(f"{k}={v}" for k, v in sorted(dict(metadata).items()))
    return shown(text, one_line=True) or "-"


SHORT_ID_LENGTH = 12
# Set from --full by the command wrapper (quarry.cli.base.command) for the whole run.
full_ids = False


def short_id(commit_id: str) -> str:
    """A commit id as the CLI shows it, everywhere: its first SHORT_ID_LENGTH characters
    (unique in practice, as git's), the whole id under --full. JSON always has whole ids."""
    if not commit_id:
        return "-"
    return commit_id if full_ids else commit_id[:SHORT_ID_LENGTH]


CHANGE_MARKS = {
    types_pb2.CHANGE_TYPE_ADDED: "+",
    types_pb2.CHANGE_TYPE_REMOVED: "-",
    types_pb2.CHANGE_TYPE_CHANGED: "~",
    types_pb2.CHANGE_TYPE_CONFLICT: "!",
}
