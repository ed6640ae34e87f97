"""quarry.committed.columns: entries in Arrow columns, as an import sends them to the
range-writer; identities and boundaries computed from the buffers must be exactly the ones
of quarry.graveler.model / quarry.committed.format."""

from __future__ import annotations

import subprocess
import sys

import pytest

from quarry import errors
from quarry.committed.columns import (
    EntryColumns,
    boundaries,
    check_batch,
    decode_batches,
    encode_batch,
    entry_batches,
    first_unsorted,
    identities,
)
from quarry.committed.errors import InvalidPath
from quarry.committed.format import is_boundary
from quarry.graveler.model import Entry

ENTRIES = [
    Entry("a/caf\u00e9 \u65e5\u672c", "/lake/a", 0, "", 0),
    Entry("a/neg", "s3://b/k", -1, "etag", -5),
    Entry("a/plain", "/lake/plain", 12345678901, "", 1_700_000_000_123_456),
    Entry("b/meta", "x", 3, "c", 7, "text/csv", {"z": "1", "a": "\u00e9", "m": ""}),
]


def test_identities_and_boundaries_are_the_models():
    for batch in entry_batches(ENTRIES, max_rows=2):  # one batch with metadata, one without
        check_batch(batch)
        rows = (
            ENTRIES[: batch.num_rows]
            if batch.column("path")[0].as_py() == "a/caf\u00e9 \u65e5\u672c"
            else ENTRIES[2:]
        )
        assert identities(batch).to_pylist() == [e.identity for e in rows]
        assert boundaries(batch.column("path"), 2) == [
            i for i, e in enumerate(rows) if is_boundary(e.path, 2)
        ]
    many = [Entry(f"p/{i:05d}", f"/a/{i}", i) for i in range(2000)]
    (batch,) = entry_batches(many, max_rows=5000)
    assert boundaries(batch.column("path"), 16) == [
        i for i, e in enumerate(many) if is_boundary(e.path, 16)
    ]


def test_an_imports_five_lists_make_the_batch_its_entries_make():
    columns = EntryColumns()
    for entry in ENTRIES[:3]:
        columns.path.append(entry.path)
        columns.address.append(entry.physical_address)
        columns.size.append(entry.size_bytes)
        columns.checksum.append(entry.checksum)
        columns.mtime.append(entry.mtime_us)
    batch = columns.batch()
    assert len(columns) == 0  # the lists start again
    (expected,) = entry_batches(ENTRIES[:3])
    assert batch.equals(expected)
    (decoded,) = decode_batches(encode_batch(batch))
    assert decoded.equals(batch)


def test_bad_entries_are_the_callers_mistake():
    with pytest.raises(InvalidPath):
        list(entry_batches([Entry("a\ud800")]))
    with pytest.raises(errors.InvalidArgument):
        list(entry_batches([Entry("a", "b\ud800")]))
    with pytest.raises(errors.InvalidArgument):
        list(entry_batches([Entry("a", "b", 2**64)]))
    with pytest.raises(errors.InvalidArgument):
        list(entry_batches(["not an entry"]))
    with pytest.raises(errors.InvalidArgument):
        decode_batches(b"not arrow")


def test_first_unsorted():
    import pyarrow as pa

    assert first_unsorted(pa.array(["a", "b", "\u00e9"])) == -1
    assert first_unsorted(pa.array(["a", "c", "b"])) == 2
    assert first_unsorted(pa.array(["a", "a"])) == 1


def test_the_committer_side_never_imports_pandas():
    """pa.array's first call imports pandas (0.4-0.5 s of CPU): a committer building
    batches must not pay it (the arrays are made from buffers)."""
    code = (
        "import sys\n"
        "from quarry.committed.columns import EntryColumns, encode_batch, entry_batches\n"
        "from quarry.graveler.model import Entry\n"
        "c = EntryColumns()\n"
        "c.path.append('p'); c.address.append('a'); c.size.append(1)\n"
        "c.checksum.append(''); c.mtime.append(5)\n"
        "encode_batch(c.batch())\n"
        "[encode_batch(b) for b in entry_batches([Entry('q', 'b', 2, 'c', 3, 't')])]\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
