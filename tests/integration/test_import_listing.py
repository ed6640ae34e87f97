"""An import's local listing read by listing processes (quarry.blob.chunks): real processes
(`python -m quarry.blob.chunks`) give exactly what the sequential walk gives, in the same
order, errors included, and never outlive the walk that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from quarry.blob.chunks import local_chunks, sequential_chunks
from quarry.blob.sources import Listing, parse_source
from quarry.committed.columns import chunks_batch
from support.processes import children_of, wait_gone

# Order traps (a-b < a/ < a0), nesting, an empty directory, spaces and unicode, a name with
# a control character and a link (both skipped and counted), and Quarry's temporary files.
FILES = [
    "a-b",
    "a/x",
    "a/b/c/deep",
    "a/b/c d/e",
    "a/too-long-for-the-destination-path.bin",
    "a0",
    "caf\u00e9/\u65e5\u672c.txt",
    "bad\x01dir/f",
    "bad\x01name",
    "z/last",
]


def _tree(root, directories=12, per_directory=40):
    for key in FILES:
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(key.encode()[:5])
    (root / "empty" / "nested").mkdir(parents=True)
    os.symlink(root / "a0", root / "link")
    for d in range(directories):
        for i in range(per_directory):
            path = root / f"date={d:02d}" / f"h={i % 3}" / f"part-{i:04d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x" * (i % 4))
    return root


def _rows(chunks):
    chunks = list(chunks)
    with_rows = [chunk for chunk in chunks if chunk.rows]
    return chunks_batch(with_rows).to_pylist(), sum(chunk.skipped for chunk in chunks)


@pytest.mark.parametrize("processes", [1, 3])
def test_listing_processes_list_what_the_sequential_walk_lists(tmp_path, processes):
    root = _tree(tmp_path / "src")
    # A path limit that one key's path passes: left out and counted alike.
    prefix, max_path_bytes = "dest/", 40
    sequential = _rows(
        sequential_chunks(Listing(parse_source(str(root))), prefix, max_path_bytes, rows=7)
    )
    parallel = _rows(local_chunks(str(root), prefix, max_path_bytes, processes))
    assert parallel == sequential
    rows, skipped = parallel
    paths = [row["path"] for row in rows]
    assert paths == sorted(paths) and len(paths) == len(set(paths))
    assert paths[:4] == ["dest/a-b", "dest/a/b/c d/e", "dest/a/b/c/deep", "dest/a/x"]
    assert len(rows) == 12 * 40 + 7
    assert skipped == 4  # bad\x01dir/f, bad\x01name, link, the one too long


def test_an_error_in_a_listing_process_is_raised_as_the_sequential_walk_raises_it(tmp_path):
    root = tmp_path / "src"
    (root / "ok").mkdir(parents=True)
    (root / "ok" / "f").write_bytes(b"x")
    os.mkdir(os.fsencode(root) + b"/not-utf8-\xff")
    with open(os.fsencode(root) + b"/not-utf8-\xff/f", "wb") as file:
        file.write(b"x")
    (root / "z").mkdir()
    (root / "z" / "f").write_bytes(b"x")
    with pytest.raises(UnicodeEncodeError):
        list(sequential_chunks(Listing(parse_source(str(root))), "", 1024))
    walk = local_chunks(str(root), "", 1024, 2)
    with pytest.raises(UnicodeEncodeError):
        list(walk)


def test_listing_processes_stop_when_the_walk_is_closed_early(tmp_path):
    """A cancelled or failed import closes its listing mid-way: its processes end then."""
    root = _tree(tmp_path / "src", directories=30)
    others = set(children_of(os.getpid()))  # a session's moto_server, say
    walk = local_chunks(str(root), "", 1024, 2)
    next(walk)
    started = set(children_of(os.getpid())) - others
    assert len(started) == 2
    walk.close()
    assert set(children_of(os.getpid())) - others == set()
    assert wait_gone(list(started)) == []


def test_listing_processes_never_outlive_a_killed_importing_process(tmp_path):
    """The importing process killed with SIGKILL (none of its code runs): its listing
    processes see their request pipe end and exit."""
    root = _tree(tmp_path / "src", directories=30)
    walker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import sys
                from quarry.blob.chunks import local_chunks
                walk = local_chunks(sys.argv[1], "", 1024, 2)
                next(walk)
                print("listing", flush=True)
                sys.stdin.read()
                """
            ),
            str(root),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert walker.stdout is not None and walker.stdout.readline() == "listing\n"
        listing = children_of(walker.pid)
        assert len(listing) == 2
        os.kill(walker.pid, signal.SIGKILL)
        walker.wait(30)
        assert wait_gone(listing) == []
    finally:
        if walker.poll() is None:
            walker.kill()
            walker.wait()


def test_a_directory_of_long_names_comes_in_chunks_within_the_byte_budget(tmp_path):
    """A chunk ends at CHUNK_ROWS rows or CHUNK_CHARS characters of keys and addresses, so
    the import's batches stay within their byte budget however long the names are."""
    from quarry.blob import chunks as chunks_module

    root = tmp_path / "src"
    (root / "d").mkdir(parents=True)
    name = "n" * 200
    per_file = len(f"d/{name}-0000") + len(str(root / "d" / f"{name}-0000"))
    count = chunks_module.CHUNK_CHARS // per_file + 200  # past one chunk's budget
    for i in range(count):
        (root / "d" / f"{name}-{i:04d}").write_bytes(b"")
    chunks = [c for c in local_chunks(str(root), "", 1024, 1) if c.rows]
    assert len(chunks) == 2
    assert all(c.text_bytes <= chunks_module.CHUNK_CHARS + per_file for c in chunks)
    sequential = sequential_chunks(Listing(parse_source(str(root))), "", 1024)
    assert _rows(chunks) == _rows(sequential)
