"""The console's streaming multipart/form-data reader: fields before the file, the file's
bytes exactly as sent whatever the pieces the body arrives in (bytes that look like the
boundary included), memory bounded by the piece asked for, and clear refusals of a
malformed or oversized form."""

from __future__ import annotations

import io
import random

import pytest

from quarry.console import multipart
from support.console import multipart_body


def _reader(body: bytes, piece: int):
    source = io.BytesIO(body)
    return lambda n: source.read(min(n, piece))


@pytest.mark.parametrize("seed", range(40))
def test_the_file_comes_back_exactly_whatever_the_pieces(seed):
    rng = random.Random(seed)
    data = rng.randbytes(rng.randint(0, 5000))
    if seed % 2:
        # Near-delimiters inside the file: CRLF + dashes + most of the boundary.
        data = b"\r\n------quarry-test-xxxxxxxx" * 10 + data + b"\r\n--"
    ctype, body = multipart_body({"csrf": "tok", "path": "a/b/"}, ("file", "f.bin", data))
    fields, part = multipart.read_fields(_reader(body, rng.choice([1, 3, 64, 65536])), ctype, 1000)
    assert fields == {"csrf": "tok", "path": "a/b/"}
    assert (part.name, part.filename, part.content_type) == ("file", "f.bin", "text/plain")
    got = b""
    while piece := part.read(rng.choice([1, 7, 4096])):
        got += piece
    assert got == data


def test_memory_stays_bounded_by_the_piece_asked_for():
    data = b"z" * (8 << 20)
    ctype, body = multipart_body({"csrf": "tok"}, ("file", "big.bin", data))
    _fields, part = multipart.read_fields(_reader(body, 1 << 16), ctype, 1000)
    reader = part._reader
    total = 0
    while piece := part.read(1 << 20):
        total += len(piece)
        assert len(reader._buffer) <= (1 << 20) + (1 << 16) + 100
    assert total == len(data)


def test_a_form_without_a_file_returns_its_fields_only():
    ctype, body = multipart_body({"a": "1", "b": "two words"}, None)
    assert multipart.read_fields(_reader(body, 5), ctype, 1000) == (
        {"a": "1", "b": "two words"},
        None,
    )


def test_malformed_and_oversized_forms_are_refused_with_their_reason():
    ctype, body = multipart_body({"csrf": "tok"}, ("file", "f.bin", b"x" * 100))
    _fields, part = multipart.read_fields(_reader(body[:-40], 64), ctype, 1000)
    with pytest.raises(multipart.MalformedForm):  # cut short: never a silently short file
        while part.read(10):
            pass
    with pytest.raises(multipart.MalformedForm):
        multipart.read_fields(_reader(body, 64), "multipart/form-data", 1000)  # no boundary
    with pytest.raises(multipart.MalformedForm):
        multipart.read_fields(
            _reader(b"--b\r\nno end of headers", 64),
            ctype.replace("----quarry-test-xxxxxxxxxxxxxxxx", "b"),
            1000,
        )
    big_ctype, big = multipart_body({"note": "n" * 2000}, None)
    with pytest.raises(multipart.FormTooLarge):
        multipart.read_fields(_reader(big, 64), big_ctype, 1000)
