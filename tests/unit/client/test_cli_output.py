"""The CLI's plain-text helpers: progress printer, tables, JSON of protobuf messages."""

from __future__ import annotations

import argparse
import contextlib
import io
import json

from quarry.cli import base, output
from quarry.cli.progress import Progress, human_bytes
from quarry.cli.upload import plan
from quarry.v1 import types_pb2


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_progress_draws_only_when_enabled():
    quiet = io.StringIO()  # not a terminal
    with Progress("uploading", 10, stream=quiet) as bar:
        bar.advance(5)
    assert quiet.getvalue() == ""


def test_progress_bar_throttles_and_finishes():
    stream, clock = io.StringIO(), Clock()
    bar = Progress(
        "uploading", 4, unit="files", stream=stream, enabled=True, clock=clock, min_interval=1.0
    )
    clock.now = 2.0
    bar.advance()  # drawn
    bar.advance()  # throttled
    clock.now = 2.5
    bar.advance(2)  # finished: always drawn
    bar.close()
    frames = stream.getvalue().split("\r")[1:]
    assert len(frames) == 3
    assert frames[0].startswith("uploading [######------------------] 1/4 files  25%")
    assert frames[1].startswith("uploading [########################] 4/4 files 100%")
    assert stream.getvalue().endswith("\n")


def test_progress_without_total_and_clear():
    stream = io.StringIO()
    bar = Progress("listing", stream=stream, enabled=True, unit="entries", min_interval=0)
    bar.update(1500)
    assert "listing 1,500 entries" in stream.getvalue()
    bar.clear()
    assert stream.getvalue().endswith("\r")


def test_table_and_fields():
    out = io.StringIO()
    output.table(
        ["NAME", "SIZE", "PATH"], [("a", 5, "x/y"), ("long-name", 12345, "z")], out, right=[1]
    )
    assert out.getvalue().splitlines() == [
        "NAME        SIZE  PATH",
        "a              5  x/y",
        "long-name  12345  z",
    ]
    out = io.StringIO()
    output.fields([("path", "a"), ("checksum", "abc")], out)
    assert out.getvalue() == "path:     a\nchecksum: abc\n"
    assert human_bytes(1536) == "1.5 KiB" and human_bytes(12) == "12 B"


def test_a_listing_is_one_json_array_or_a_table():
    tags = [types_pb2.Tag(name="v1", commit_id="c" * 64), types_pb2.Tag(name="v2", commit_id="d")]
    as_json = io.StringIO()
    with contextlib.redirect_stdout(as_json):
        output.listing(tags, True, ("NAME", "COMMIT"), lambda t: (t.name, t.commit_id))
    assert [tag["name"] for tag in json.loads(as_json.getvalue())] == ["v1", "v2"]
    as_table = io.StringIO()
    with contextlib.redirect_stdout(as_table):
        output.listing(tags, False, ("NAME", "COMMIT"), lambda t: (t.name, t.commit_id[:4]))
    assert as_table.getvalue().splitlines() == ["NAME  COMMIT", "v1    cccc", "v2    d"]


def test_json_keeps_int64_numbers_and_timestamps():
    entry = types_pb2.Entry(path="p", size_bytes=2**40, metadata={"b": "2", "a": "1"})
    entry.mtime.FromSeconds(1714564800)
    out = io.StringIO()
    output.print_json(entry, out)
    data = json.loads(out.getvalue())
    assert data["size_bytes"] == 2**40
    assert data["mtime"] == "2024-05-01T12:00:00Z"
    assert list(data["metadata"]) == ["a", "b"]
    branch = output.to_jsonable(types_pb2.Branch(name="b"))
    assert branch["dirty"] is None and branch["sealed_tokens"] == []
    change = output.to_jsonable(types_pb2.Change(type=types_pb2.CHANGE_TYPE_REMOVED, path="x"))
    assert change == {"type": "removed", "path": "x", "entry": None}
    assert output.timestamp_text(entry.mtime) == "2024-05-01T12:00:00Z"


def test_upload_plan(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "b.txt").write_text("b")
    (tmp_path / "d" / "sub" / "a.txt").write_text("a")
    paths = [p.path for p in plan(tmp_path / "d", "in/")]
    assert paths == ["in/b.txt", "in/sub/a.txt"]
    assert [p.path for p in plan(tmp_path / "d", "")] == ["b.txt", "sub/a.txt"]
    single = tmp_path / "d" / "b.txt"
    assert plan(single, "x/y.txt")[0].path == "x/y.txt"
    assert plan(single, "x/")[0].path == "x/b.txt"
    assert plan(single, "")[0].path == "b.txt"


def _context() -> base.Context:
    return base.Context(argparse.Namespace(json=False))


def test_unheld_stdout_writes_every_byte_to_the_real_stdout_past_the_hold():
    """`quarry cat` writes past the hold to the stdout the command started with; a raw
    binary stdout (PYTHONUNBUFFERED) that takes part of a chunk still gets all of it."""

    class Raw(io.RawIOBase):
        def __init__(self):
            self.got = bytearray()

        def writable(self):
            return True

        def write(self, data):
            taken = bytes(data[:3])  # a pipe that took only part of the chunk
            self.got += taken
            return len(taken)

    raw = Raw()
    real = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
    with contextlib.redirect_stdout(real):
        ctx = _context()
        with base._held_stdout():
            out = ctx.unheld_stdout()
            out.write(b"0123456789")
            out.flush()
    assert bytes(raw.got) == b"0123456789"


def test_unheld_stdout_onto_a_text_only_stream_decodes_across_chunks():
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        ctx = _context()
        with base._held_stdout():
            out = ctx.unheld_stdout()
            encoded = "café ☕".encode()
            out.write(encoded[:4])  # the é split across two writes
            out.write(encoded[4:])
            out.flush()
    assert text.getvalue() == "café ☕"


def test_json_converts_a_message_anywhere_in_the_value():
    """`auth users show --json` put a User inside a dict: it was INTERNAL (TypeError)."""
    tag = types_pb2.Tag(name="v1", commit_id="c")
    out = io.StringIO()
    output.print_json({"tag": tag, "all": [tag], "nested": {"deeper": [tag]}, "n": 1}, out)
    data = json.loads(out.getvalue())
    assert data["tag"]["name"] == data["all"][0]["name"] == data["nested"]["deeper"][0]["name"]
    assert data["n"] == 1


def test_a_json_array_written_item_by_item_is_the_same_text():
    """print_json_array streams a listing (no dict per item held: `--json ls` of 1M
    entries took 1.3 GB): the text is print_json's, nested under a key too."""
    items = [types_pb2.Tag(name="v1", commit_id="c"), {"a": [1, 2], "b": {"c": None}}, "s"]
    for value in (items, [], [1]):
        whole, streamed = io.StringIO(), io.StringIO()
        output.print_json(value, whole)
        output.print_json_array(iter(value), streamed)
        assert streamed.getvalue() == whole.getvalue()
    nested = io.StringIO()
    nested.write('{\n  "entries": ')
    output.print_json_array(iter(items), nested, indent="  ")
    nested.write("\n}\n")
    whole = io.StringIO()
    output.print_json({"entries": items}, whole)
    assert nested.getvalue() == whole.getvalue()
