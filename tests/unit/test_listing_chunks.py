"""quarry.blob.chunks: a listing's chunks are built column by column (ASCII columns joined
once), and give exactly the rows the object-by-object build gives, whichever way a chunk
takes (all ASCII, a non-ASCII key or address, a path past the limit)."""

from __future__ import annotations

import pytest

from quarry.blob import chunks
from quarry.blob.chunks import ColumnChunk, _objects_chunk_by_object, objects_chunk, read_chunks
from quarry.blob.sources import SourceObject, Subdirectory
from quarry.committed.columns import chunks_batch


def _obj(key: str, root: str = "/lake", size: int = 3, checksum: str = "") -> SourceObject:
    return SourceObject(key, f"{root}/{key}", size, checksum, 1_700_000_000_000_000 + size)


def _rows(chunk: ColumnChunk) -> list[tuple]:
    if not chunk.rows:
        return []
    batch = chunks_batch([chunk])
    return list(
        zip(
            *(
                batch.column(name).to_pylist()
                for name in ("path", "physical_address", "size_bytes", "checksum")
            ),
            strict=True,
        )
    )


CASES = {
    "ascii": [_obj("a/x"), _obj("a/y", size=0), _obj("b", checksum='"etag"')],
    "a non-ASCII key": [_obj("a"), _obj("caf\u00e9/\u65e5"), _obj("z")],
    "a non-ASCII address": [_obj("a", root="/l\u00e4ke"), _obj("b", root="/l\u00e4ke")],
    "a path past the limit": [_obj("a"), _obj("b" * 30), _obj("c")],
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("prefix", ["", "dest/", "d\u00e9st/"])
def test_a_chunk_holds_each_objects_row_under_the_prefix(case, prefix):
    objects = CASES[case]
    chunk = objects_chunk(objects, prefix, max_path_bytes=24, skipped=2)
    kept = [o for o in objects if len((prefix + o.key).encode()) <= 24]
    assert _rows(chunk) == [(prefix + o.key, o.address, o.size, o.checksum) for o in kept]
    assert chunk.rows == len(kept)
    assert chunk.skipped == 2 + len(objects) - len(kept)
    assert chunk.bytes_total == sum(o.size for o in kept)
    # The same buffers, byte for byte, as the object-by-object build.
    assert chunk == _objects_chunk_by_object(objects, prefix.encode(), 24, 2)


def test_an_empty_chunk_carries_its_skipped_count():
    chunk = objects_chunk([], "dest/", 1024, skipped=3)
    assert (chunk.rows, chunk.skipped, _rows(chunk)) == (0, 3, [])
    assert chunk == _objects_chunk_by_object([], b"dest/", 1024, 3)


def test_a_name_that_is_not_unicode_text_is_refused():
    with pytest.raises(UnicodeEncodeError):
        objects_chunk([_obj("ok"), _obj("bad-\udcff")], "", 1024)


def test_a_directory_is_cut_into_chunks_by_rows_and_characters(monkeypatch):
    """Runs between subdirectories are chunks of CHUNK_ROWS rows at most, ending at the row
    whose key and address characters reach CHUNK_CHARS; the directory's skipped count goes
    with its first chunk."""
    files = [_obj(f"f{i:02d}") for i in range(7)]  # key 3 + address 9 characters each
    sub = Subdirectory("/lake/s", "s/", True)
    items = [*files[:5], sub, *files[5:]]
    monkeypatch.setattr(chunks, "read_directory", lambda *args: (items, 4))
    monkeypatch.setattr(chunks, "CHUNK_ROWS", 3)
    monkeypatch.setattr(chunks, "CHUNK_CHARS", 22)  # reached at a run's 2nd row
    request = chunks._Read("/lake", "", True, "", 1024)
    out = read_chunks(request)
    shapes = [x if isinstance(x, Subdirectory) else (x.rows, x.skipped) for x in out]
    assert shapes == [(2, 4), (2, 0), (1, 0), sub, (2, 0)]
    keys = [row[0] for x in out if not isinstance(x, Subdirectory) for row in _rows(x)]
    assert keys == [f.key for f in files]
    monkeypatch.setattr(chunks, "CHUNK_CHARS", 10**6)  # rows alone decide
    out = read_chunks(request)
    shapes = [x if isinstance(x, Subdirectory) else (x.rows, x.skipped) for x in out]
    assert shapes == [(3, 4), (2, 0), sub, (2, 0)]
    # A directory whose first name is a subdirectory: its skipped count in an empty chunk.
    items[:] = [sub, *files]
    shapes = [
        x if isinstance(x, Subdirectory) else (x.rows, x.skipped) for x in read_chunks(request)
    ]
    assert shapes == [(0, 4), sub, (3, 0), (3, 0), (1, 0)]
