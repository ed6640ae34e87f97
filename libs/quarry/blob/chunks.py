"""An import's listing as column chunks: runs of listed objects, in key order, whose
destination paths and fields are already the buffers of Arrow columns (docs/import.md).

The import (quarry.graveler.imports) turns chunks into the record batches it streams to the
range-writer without a Python object per row. A chunk is made either in the importing
process (`sequential_chunks`: S3, and local directories when listing processes are off) or,
for a local directory, by listing processes (`local_chunks`): the walk is depth first in
key order as quarry.blob.sources.Listing's, but the directories it will reach next are read
ahead, up to 2 per process, in other processes. A CPython process walks a directory on about
one core (the stat calls and the per-name work hold the GIL); with N processes the listing
is N cores wide, the importing process only joins their buffers, and the range-writer cuts
ranges beside them.

The order is the one the ranges need: directories are read in any order, but their results
are used in key order (a directory's subdirectories take the places of their names in its
listing), so the chunks come out exactly as the sequential walk lists, chunk for chunk
(a test compares them).

A source that changes while it is listed: as with the sequential walk, each directory is
read once, whole; with listing processes a directory may be read a little before the import
reaches its place (at most 2 directories per process ahead), so "not yet read" is decided
by the reading, not by the import's progress (docs/import.md).

Safety rules: a listing process must never outlive the import that started it: it reads its
requests from a pipe only its importing process holds, so it exits at end-of-file when that
process ends any way (a SIGKILL included), and the import closes its processes when it
ends, fails or is cancelled. A listing process only reads directories below the source it
was given (the importing process sends it only directories its walk found, links never
followed).

Run as `python -m quarry.blob.chunks` it is a listing process (started only by local_chunks).
"""

from __future__ import annotations

import contextlib
import pickle
import subprocess
import sys
import threading
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Generator, Iterable
from itertools import accumulate, islice
from typing import IO, Any, NamedTuple

from quarry.blob.sources import (
    SourceObject,
    Subdirectory,
    read_directory,
    with_action_file_checksums,
)

# Rows per chunk a listing process sends at most (a directory of more files: several), and
# characters of keys and addresses (long names: the import's batches stay within their
# byte budget, quarry.committed.columns.BATCH_BYTES).
CHUNK_ROWS = 8192
CHUNK_CHARS = 1024 * 1024
# The in-process listing makes chunks of this many objects: the import looks at a cancel and
# at its heartbeat once per chunk.
SEQUENTIAL_CHUNK_ROWS = 1024
# Directory reads handed to each listing process before their results are used: one being
# read, one waiting, so a process never idles while the import takes a result.
AHEAD_PER_PROCESS = 2
# How far into the walk's queue (chunks and directories) it looks for directories to hand out.
_LOOK_AHEAD = 64


class ColumnChunk(NamedTuple):
    """Listed objects in key order: each string column as (int32 offsets, UTF-8 data) and
    each integer column as int64, little-endian, as Arrow lays them out; `skipped` counts
    what the listing left out where this chunk was made (it may be the only content)."""

    rows: int
    skipped: int
    bytes_total: int  # the sum of the sizes
    paths: tuple[bytes, bytes]
    addresses: tuple[bytes, bytes]
    checksums: tuple[bytes, bytes]
    sizes: bytes
    mtimes: bytes

    @property
    def text_bytes(self) -> int:
        """Bytes of its paths and addresses (what the import's batches are measured by)."""
        return len(self.paths[1]) + len(self.addresses[1])


def _little_endian(values: array) -> bytes:
    if sys.byteorder != "little":
        values.byteswap()
    return values.tobytes()


def string_buffers(encoded: list[bytes]) -> tuple[bytes, bytes]:
    """(int32 offsets, data) of a string column of already UTF-8 encoded values."""
    offsets = array("i", [0])
    offsets.extend(accumulate(map(len, encoded)))
    return _little_endian(offsets), b"".join(encoded)


def _text_buffers(values: tuple[str, ...]) -> tuple[bytes, bytes]:
    """string_buffers of str values: when they are all ASCII (one check of their join) the
    join is the data and the lengths are the offsets, with no bytes object per value."""
    joined = "".join(values)
    if not joined.isascii():
        return string_buffers([value.encode() for value in values])
    offsets = array("i", [0])
    offsets.extend(accumulate(map(len, values)))
    return _little_endian(offsets), joined.encode()


_EMPTY_STRINGS = (_little_endian(array("i", [0])), b"")


def objects_chunk(
    objects: Iterable[SourceObject], prefix: str, max_path_bytes: int, skipped: int = 0
) -> ColumnChunk:
    """The chunk of `objects` under the destination `prefix`. An object whose path would be
    longer than max_path_bytes is left out and counted in `skipped` (no entry can have it).
    UnicodeEncodeError for a name that is not Unicode text (undecodable bytes).

    Column by column, not object by object (the listing processes make one per ~1,000
    files): the objects transposed at once, each string column joined and encoded once when
    it is ASCII (_text_buffers). Keys that are not all ASCII, or a path that is too long,
    take the object-by-object way (_objects_chunk_by_object): the same chunk."""
    objects = objects if isinstance(objects, list) else list(objects)
    if not objects:
        return ColumnChunk(0, skipped, 0, _EMPTY_STRINGS, _EMPTY_STRINGS, _EMPTY_STRINGS, b"", b"")
    # SourceObject's fields, in its order.
    keys, addresses, sizes, checksums, mtimes = zip(*objects, strict=True)
    encoded_prefix = prefix.encode()
    if not "".join(keys).isascii() or len(encoded_prefix) + max(map(len, keys)) > max_path_bytes:
        return _objects_chunk_by_object(objects, encoded_prefix, max_path_bytes, skipped)
    # Every path is the prefix and an ASCII key: the prefix joins them (prefix k1 prefix k2
    # ...), a path's bytes are the prefix's and its key's length.
    path_offsets = array("i", [0])
    path_offsets.extend(accumulate(map(len(encoded_prefix).__add__, map(len, keys))))
    paths_data = (prefix + prefix.join(keys)).encode()
    integer_sizes = array("q", sizes)
    return ColumnChunk(
        len(objects),
        skipped,
        sum(integer_sizes),
        (_little_endian(path_offsets), paths_data),
        _text_buffers(addresses),
        _text_buffers(checksums),
        _little_endian(integer_sizes),
        _little_endian(array("q", mtimes)),
    )


def _objects_chunk_by_object(
    objects: list[SourceObject], encoded_prefix: bytes, max_path_bytes: int, skipped: int
) -> ColumnChunk:
    paths: list[bytes] = []
    addresses: list[bytes] = []
    checksums: list[bytes] = []
    sizes = array("q")
    mtimes = array("q")
    for obj in objects:
        path = encoded_prefix + obj.key.encode()
        if len(path) > max_path_bytes:
            skipped += 1
            continue
        paths.append(path)
        addresses.append(obj.address.encode())
        checksums.append(obj.checksum.encode())
        sizes.append(obj.size)
        mtimes.append(obj.mtime_us)
    return ColumnChunk(
        len(paths),
        skipped,
        sum(sizes),
        string_buffers(paths),
        string_buffers(addresses),
        string_buffers(checksums),
        _little_endian(sizes),
        _little_endian(mtimes),
    )


def sequential_chunks(
    listing: Any, prefix: str, max_path_bytes: int, rows: int = SEQUENTIAL_CHUNK_ROWS
) -> Generator[ColumnChunk, None, None]:
    """The chunks of a listing (quarry.blob.sources.Listing, iterated here), `rows` objects
    at most each; its `skipped` counts are carried by the chunks."""
    run: list[SourceObject] = []
    seen_skipped = 0
    settings = getattr(listing, "settings", None)
    for obj in listing:
        run.append(obj)
        if len(run) >= rows:
            skipped, seen_skipped = listing.skipped - seen_skipped, listing.skipped
            run = with_action_file_checksums(run, prefix, settings)
            yield objects_chunk(run, prefix, max_path_bytes, skipped)
            run = []
    skipped = listing.skipped - seen_skipped
    if run or skipped:
        run = with_action_file_checksums(run, prefix, settings)
        yield objects_chunk(run, prefix, max_path_bytes, skipped)


# ---- listing processes ----------------------------------------------------------------


class _Read(NamedTuple):
    """A directory to read: what the importing process sends a listing process."""

    path: str
    key: str
    addressable: bool
    prefix: str
    max_path_bytes: int


def read_chunks(request: _Read) -> list[ColumnChunk | Subdirectory]:
    """One directory, read: its files as chunks (of CHUNK_ROWS / CHUNK_CHARS at most, a run
    between two subdirectories in one) and its subdirectories, in key order. What a listing
    process answers. A chunk ends after the row that makes it CHUNK_ROWS rows, or its keys
    and addresses CHUNK_CHARS characters; the directory's skipped count goes with its first
    chunk (an empty one if it has no file before its first subdirectory)."""
    items, skipped = read_directory(request.path, request.key, request.addressable)
    out: list[ColumnChunk | Subdirectory] = []
    subdirectories = [i for i, item in enumerate(items) if type(item) is Subdirectory]
    start = 0
    for stop in [*subdirectories, len(items)]:
        files: list[SourceObject] = items[start:stop]  # type: ignore[assignment]
        files = with_action_file_checksums(files, request.prefix)
        for run in _runs(files):
            out.append(objects_chunk(run, request.prefix, request.max_path_bytes, skipped))
            skipped = 0
        if skipped:
            out.append(objects_chunk([], request.prefix, request.max_path_bytes, skipped))
            skipped = 0
        if stop < len(items):
            out.append(items[stop])  # type: ignore[arg-type]  # (a Subdirectory)
        start = stop + 1
    return out


def _runs(files: list[SourceObject]) -> list[list[SourceObject]]:
    """`files` cut where read_chunks' chunks end (CHUNK_ROWS rows, or CHUNK_CHARS characters
    of keys and addresses reached), from the columns' lengths, not a step per file."""
    if not files:
        return []
    keys, addresses = list(zip(*files, strict=True))[:2]
    if sum(map(len, keys)) + sum(map(len, addresses)) < CHUNK_CHARS:  # rows decide alone
        return [files[i : i + CHUNK_ROWS] for i in range(0, len(files), CHUNK_ROWS)]
    chars = list(accumulate(map(int.__add__, map(len, keys), map(len, addresses))))
    runs = []
    begin, before = 0, 0  # the run's first row; the characters of the rows before it
    while begin < len(files):
        # The first row at which the run reaches CHUNK_CHARS, or its CHUNK_ROWS-th row.
        end = min(bisect_left(chars, before + CHUNK_CHARS, begin), begin + CHUNK_ROWS - 1)
        end = min(end, len(files) - 1)
        runs.append(files[begin : end + 1])
        before, begin = chars[end], end + 1
    return runs


class ListingProcessStopped(RuntimeError):
    """A listing process ended before answering (killed, out of memory)."""


class _Pending:
    """A directory of the walk: its read, the process it was handed to, its answer."""

    __slots__ = ("read", "process", "answer", "answered")

    def __init__(self, read: _Read) -> None:
        self.read = read
        self.process: _ListingProcess | None = None
        self.answer: Any = None
        self.answered = threading.Event()


class _ListingProcess:
    """A listing process, and a thread reading its answers as they come: a process whose
    answer waited in the pipe for the walk to reach it would stop, its next read not begun
    (an answer is larger than a pipe's buffer)."""

    def __init__(self) -> None:
        # Its stdin is the pipe only this process holds (see the module's safety rules).
        self.child = subprocess.Popen(
            [sys.executable, "-m", "quarry.blob.chunks"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.sent: deque[_Pending] = deque()  # answers not yet read, in the order sent
        self._reader = threading.Thread(target=self._read, name="listing-answers", daemon=True)
        self._reader.start()

    def send(self, pending: _Pending) -> None:
        pending.process = self
        self.sent.append(pending)  # before the process can answer it
        stdin: IO[bytes] = self.child.stdin  # type: ignore[assignment]
        pickle.dump(pending.read, stdin, pickle.HIGHEST_PROTOCOL)
        stdin.flush()

    def _read(self) -> None:
        stdout: IO[bytes] = self.child.stdout  # type: ignore[assignment]
        try:
            while True:
                answer = pickle.load(stdout)
                pending = self.sent.popleft()
                pending.answer = answer
                pending.answered.set()
        except Exception:  # end of file (the process ended), or closed under us
            pass
        while self.sent:
            pending = self.sent.popleft()
            pending.answer = ListingProcessStopped(
                f"a listing process stopped (exit status {self.child.poll()})"
            )
            pending.answered.set()

    def stop(self) -> None:
        """Ask it to end: end of its requests (it exits), or a kill mid-walk."""
        with contextlib.suppress(OSError):
            self.child.stdin.close()  # type: ignore[union-attr]
        if self.sent:  # stopped mid-walk: its answers are not wanted
            self.child.kill()

    def close(self) -> None:
        """Wait for it to end (after stop)."""
        try:
            self.child.wait(10)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()
        self._reader.join(10)
        with contextlib.suppress(OSError):
            self.child.stdout.close()  # type: ignore[union-attr]


def local_chunks(
    root: str, prefix: str, max_path_bytes: int, processes: int
) -> Generator[ColumnChunk, None, None]:
    """A local directory's chunks, in key order, read by `processes` listing processes
    (>= 1), started here and stopped when the generator ends or is closed. An error reading
    a directory (other than its disappearance, which is no error) is raised here as it was
    raised there."""
    workers: list[_ListingProcess] = []

    def least_busy() -> _ListingProcess:
        return min(workers, key=lambda worker: len(worker.sent))

    try:
        for _ in range(processes):
            workers.append(_ListingProcess())
        # The walk: chunks ready to go, and directories whose place in the order comes first.
        queue: deque[ColumnChunk | _Pending] = deque(
            [_Pending(_Read(root, "", True, prefix, max_path_bytes))]
        )
        in_flight = 0
        while queue:
            for item in islice(queue, _LOOK_AHEAD):
                if in_flight >= AHEAD_PER_PROCESS * processes:
                    break
                if isinstance(item, _Pending) and item.process is None:
                    least_busy().send(item)
                    in_flight += 1
            head = queue.popleft()
            if isinstance(head, ColumnChunk):
                yield head
                continue
            if head.process is None:  # (the look-ahead hands out the first one first)
                least_busy().send(head)
                in_flight += 1
            head.answered.wait()
            answer = head.answer
            in_flight -= 1
            if isinstance(answer, BaseException):
                raise answer
            queue.extendleft(
                reversed(
                    [
                        _Pending(
                            _Read(item.path, item.key, item.addressable, prefix, max_path_bytes)
                        )
                        if type(item) is Subdirectory
                        else item
                        for item in answer
                    ]
                )
            )
    finally:
        for worker in workers:  # all asked first: they end at the same time
            worker.stop()
        for worker in workers:
            worker.close()


def _serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    """A listing process: answer each directory read until the importing process is gone."""
    while True:
        try:
            read = pickle.load(stdin)
        except EOFError:
            return
        answer: Any
        try:
            answer = read_chunks(read)
        except Exception as exc:  # raised by the importing process, as it would be there
            try:
                pickle.dumps(exc)
                answer = exc
            except Exception:
                answer = RuntimeError(repr(exc))
        try:
            pickle.dump(answer, stdout, pickle.HIGHEST_PROTOCOL)
            stdout.flush()
        except BrokenPipeError:
            return


if __name__ == "__main__":
    import signal

    # Ctrl-C in a terminal reaches the whole process group: the import stops its listing
    # processes itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Through the module, not this __main__: what it answers must unpickle as
    # quarry.blob.chunks' classes in the importing process.
    from quarry.blob.chunks import _serve as serve

    serve(sys.stdin.buffer, sys.stdout.buffer)
