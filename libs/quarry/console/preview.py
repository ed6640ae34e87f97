"""An object's preview on its detail page: text (the first bytes), an image (shown from the
download address), or for Parquet the schema and the first rows (pyarrow). Reads are bounded:
a preview never reads a whole large object."""

from __future__ import annotations

import io
import mimetypes
import re
from dataclasses import dataclass, field
from typing import Any

from quarry.blob import open_object

TEXT_BYTES = 64 * 1024  # shown of a text object
PARQUET_MAX_BYTES = 64 * 1024 * 1024  # a larger Parquet file gets no row preview
PARQUET_ROWS = 20
TEXT_SUFFIXES = (
    ".txt", ".csv", ".tsv", ".json", ".jsonl", ".md", ".yaml", ".yml", ".xml", ".log",
    ".py", ".sql", ".ini", ".toml", ".html",
)  # fmt: skip
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".svg")


@dataclass
class Preview:
    kind: str  # "text" | "image" | "parquet" | "none"
    text: str = ""
    truncated: bool = False
    schema: list[tuple[str, str]] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    num_rows: int = 0
    note: str = ""


def content_type(path: str, stored: str) -> str:
    return stored or mimetypes.guess_type(path)[0] or "application/octet-stream"


# Shown inline (an <img> of the object page) only as one of these exact types: raster
# formats a browser never runs. Never SVG (it carries script), never what a stored type
# merely starts with.
INLINE_IMAGE_TYPES = frozenset(
    {"image/png", "image/jpeg", "image/gif", "image/webp", "image/avif", "image/bmp"}
)
_MEDIA_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*$")


def served_type(path: str, stored_type: str, inline_asked: bool) -> tuple[str, bool]:
    """(Content-Type, inline) of an object's download. Safety rule: an object is served
    inline only when the type sent is one of INLINE_IMAGE_TYPES (judged on that very
    header value, not on the path's suffix), so no upload -- HTML named x.png, SVG in any
    spelling -- renders as a page of the console's origin; and the type sent is always a
    bare media type (parameters dropped, no CR/LF or other character that could split or
    bend the header), else application/octet-stream. HTML is never sent as HTML."""
    media = content_type(path, stored_type).partition(";")[0].strip().lower()
    if not _MEDIA_TYPE.match(media) or media in ("text/html", "application/xhtml+xml"):
        media = "application/octet-stream"
    return media, inline_asked and media in INLINE_IMAGE_TYPES


def kind_of(path: str, stored_type: str) -> str:
    lower = path.lower()
    ctype = content_type(path, stored_type)
    if lower.endswith(".parquet"):
        return "parquet"
    if lower.endswith(IMAGE_SUFFIXES) or ctype.startswith("image/"):
        return "image"
    if lower.endswith(TEXT_SUFFIXES) or ctype.startswith("text/") or ctype.endswith("json"):
        return "text"
    return "none"


def _read(physical_address: str, settings: Any, limit: int, confine: Any = None) -> bytes:
    with open_object(physical_address, settings, confine=confine) as reader:
        out = bytearray()
        while len(out) < limit:
            piece = reader.read(min(1 << 20, limit - len(out)))
            if not piece:
                break
            out += piece
        return bytes(out)


def preview(entry: Any, settings: Any, confine: Any = None) -> Preview:
    """`confine`: where the repository's reads may open local files (quarry.blob.confine)."""
    kind = kind_of(entry.path, entry.content_type)
    if kind == "text":
        data = _read(entry.physical_address, settings, TEXT_BYTES, confine)
        return Preview(
            "text", text=data.decode("utf-8", "replace"), truncated=entry.size_bytes > len(data)
        )
    if kind == "image":
        return Preview("image")
    if kind == "parquet":
        if entry.size_bytes > PARQUET_MAX_BYTES:
            return Preview("none", note="Parquet file too large to preview here")
        return _parquet(_read(entry.physical_address, settings, PARQUET_MAX_BYTES, confine))
    return Preview("none")


def _parquet(data: bytes) -> Preview:
    import pyarrow.parquet as pq

    # Whatever the file holds, the page shows the entry: a file that is not Parquet, has
    # damaged pages, or values Python cannot represent (a date past year 9999) gets a note,
    # never an error page in place of the entry and its Download link.
    try:
        parquet = pq.ParquetFile(io.BytesIO(data))
        schema = [(f.name, str(f.type)) for f in parquet.schema_arrow]
    except Exception as exc:
        return Preview("none", note=f"not a readable Parquet file: {exc}")
    columns = [name for name, _ in schema]
    rows: list[list[str]] = []
    try:
        table = next(parquet.iter_batches(batch_size=PARQUET_ROWS), None)
        if table is not None:
            rows = [[_cell(r.get(c)) for c in columns] for r in table.to_pylist()]
    except Exception as exc:
        return Preview(
            "parquet",
            schema=schema,
            columns=columns,
            rows=[],
            num_rows=parquet.metadata.num_rows,
            note=f"its rows cannot be shown: {exc}",
        )
    return Preview(
        "parquet",
        schema=schema,
        columns=columns,
        rows=rows,
        num_rows=parquet.metadata.num_rows,
    )


def _cell(value: Any) -> str:
    text = "null" if value is None else str(value)
    return text if len(text) <= 200 else text[:200] + "…"
