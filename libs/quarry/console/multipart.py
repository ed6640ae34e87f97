"""A streaming reader of multipart/form-data (RFC 7578), the body of the console's upload
form: its text fields are read (bounded) until the first file part, whose bytes are then
read in pieces by the page that stores them — a file is never held whole.

The console's forms put the file last (after the CSRF token and the destination path), so
every field a page checks has been read before the first byte of the file is; fields after
the file part are not read."""

from __future__ import annotations

import re
from collections.abc import Callable

from quarry import errors

CHUNK = 1 << 16
MAX_HEADER_BYTES = 16 * 1024  # one part's headers
_PARAM = re.compile(r';\s*([\w*-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)')


class MalformedForm(errors.InvalidArgument):
    reason = "MALFORMED_FORM"


def boundary_of(content_type: str) -> bytes:
    """The boundary of a `multipart/form-data; boundary=...` content type."""
    found = dict(
        (k.lower(), v.strip('"')) for k, v in _PARAM.findall(";" + content_type.partition(";")[2])
    )
    boundary = found.get("boundary", "")
    if not content_type.lower().startswith("multipart/form-data") or not 0 < len(boundary) <= 70:
        raise MalformedForm("a multipart/form-data body needs a boundary of 1-70 characters")
    return boundary.encode("latin-1")


class FilePart:
    """A file field: its name, the file name and content type the browser sent, and its
    bytes through read(n) (b"" at the end of the part)."""

    def __init__(self, reader: MultipartReader, name: str, filename: str, content_type: str):
        self._reader = reader
        self.name = name
        self.filename = filename
        self.content_type = content_type

    def read(self, n: int = -1) -> bytes:
        return self._reader.read_part(n if n > 0 else CHUNK)


class MultipartReader:
    """The parts of a multipart body read from `read` (an ASGI body reader) in order."""

    def __init__(self, read: Callable[[int], bytes], boundary: bytes) -> None:
        self._read = read
        # The body starts with "--boundary"; a CRLF in front makes every delimiter alike.
        self._buffer = bytearray(b"\r\n")
        self._delimiter = b"\r\n--" + boundary
        self._eof = False
        self._in_part = True  # the preamble, up to the first delimiter: skipped
        self._done = False
        self._scanned = 0  # bytes of the buffer known to hold no delimiter start

    def _fill(self) -> bool:
        if self._eof:
            return False
        chunk = self._read(CHUNK)
        if not chunk:
            self._eof = True
            return False
        self._buffer += chunk
        return True

    def read_part(self, n: int) -> bytes:
        """Up to `n` bytes of the current part; b"" at its end (the delimiter consumed)."""
        if not self._in_part:
            return b""
        delimiter = self._delimiter
        while True:
            found = self._buffer.find(delimiter, self._scanned)
            if found == 0:
                del self._buffer[: len(delimiter)]
                self._in_part = False
                self._scanned = 0
                return b""
            if found > 0:
                take = min(found, n)
            else:
                safe = len(self._buffer) - len(delimiter) + 1
                self._scanned = max(0, safe)
                if safe < n:
                    if self._fill():
                        continue
                    if safe <= 0:
                        raise MalformedForm("the form ends inside a part")
                take = min(safe, n)
            out = bytes(self._buffer[:take])
            del self._buffer[:take]
            self._scanned = max(0, self._scanned - take)
            return out

    def next_part(self) -> tuple[str, str | None, str] | None:
        """(field name, file name or None for a text field, content type) of the next part,
        or None after the last one. The current part's rest is skipped."""
        while self._in_part:
            self.read_part(CHUNK)
        if self._done:
            return None
        while len(self._buffer) < 2 and self._fill():
            pass
        if self._buffer[:2] == b"--":
            self._done = True
            return None
        end = self._buffer.find(b"\r\n\r\n")
        while end < 0:
            if len(self._buffer) > MAX_HEADER_BYTES or not self._fill():
                raise MalformedForm("a part's headers are missing, cut short or too long")
            end = self._buffer.find(b"\r\n\r\n")
        head = bytes(self._buffer[:end]).decode("utf-8", "replace")
        del self._buffer[: end + 4]
        self._in_part = True
        self._scanned = 0
        name, filename, content_type = "", None, "application/octet-stream"
        for line in head.split("\r\n")[1:]:  # the first line is the rest of the delimiter's
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key == "content-disposition":
                params = {k.lower(): _unquote(v) for k, v in _PARAM.findall(value)}
                name = params.get("name", "")
                filename = params.get("filename")
            elif key == "content-type":
                content_type = value.strip()
        if not name:
            raise MalformedForm("a form part has no field name")
        return name, filename, content_type


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def read_fields(
    read: Callable[[int], bytes], content_type: str, limit: int
) -> tuple[dict[str, str], FilePart | None]:
    """The text fields before the first file part (at most `limit` bytes of them all:
    FORM_TOO_LARGE past it) and that file part (None when the form has none)."""
    reader = MultipartReader(read, boundary_of(content_type))
    fields: dict[str, str] = {}
    total = 0
    while (part := reader.next_part()) is not None:
        name, filename, ctype = part
        if filename is not None:
            return fields, FilePart(reader, name, filename, ctype)
        pieces = []
        while piece := reader.read_part(CHUNK):
            total += len(piece)
            if total > limit:
                raise FormTooLarge(f"the form's fields are larger than {limit} bytes")
            pieces.append(piece)
        fields[name] = b"".join(pieces).decode("utf-8", "replace")
    return fields, None


class FormTooLarge(errors.InvalidArgument):
    reason = "FORM_TOO_LARGE"
