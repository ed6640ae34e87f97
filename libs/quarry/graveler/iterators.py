"""Layered iteration: staging tokens over committed data, tombstones hiding lower layers.

Every source yields (path, Entry | None) in path order and supports seek_ge(path);
None is a tombstone. `LayeredIterator` merges sources where the FIRST source holding a
path wins (sources are ordered newest first: staging token, sealed tokens, base).
"""

from __future__ import annotations

import base64
import heapq
import json
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from quarry.graveler import errors as gerrors
from quarry.graveler.model import Entry


class Source(Protocol):
    def __next__(self) -> tuple[str, Entry | None]: ...

    def seek_ge(self, path: str) -> None: ...


class CommittedSource:
    """Adapts a committed EntryIterator (yielding Entry) to a Source."""

    def __init__(self, iterator: Any) -> None:
        self._iterator = iterator

    def __iter__(self) -> CommittedSource:
        return self

    def __next__(self) -> tuple[str, Entry | None]:
        entry = next(self._iterator)
        return entry.path, entry

    def seek_ge(self, path: str) -> None:
        self._iterator.seek_ge(path)

    def close(self) -> None:
        close = getattr(self._iterator, "close", None)
        if close:
            close()


class LayeredIterator:
    """Merge of sources, newest first; yields (path, Entry | None) once per path with the
    newest layer's value (tombstones included: callers decide whether to hide them)."""

    def __init__(self, sources: list):
        self._sources = sources
        self._heap: list[tuple[str, int, Entry | None]] = []
        for index in range(len(sources)):
            self._advance(index)

    def _advance(self, index: int) -> None:
        try:
            path, value = next(self._sources[index])
        except StopIteration:
            return
        heapq.heappush(self._heap, (path, index, value))

    def __iter__(self) -> LayeredIterator:
        return self

    def __next__(self) -> tuple[str, Entry | None]:
        if not self._heap:
            raise StopIteration
        path, index, value = heapq.heappop(self._heap)
        self._advance(index)
        # Older layers holding the same path are shadowed.
        while self._heap and self._heap[0][0] == path:
            _, other, _ = heapq.heappop(self._heap)
            self._advance(other)
        return path, value

    def seek_ge(self, path: str) -> None:
        self._heap = []
        for index, source in enumerate(self._sources):
            source.seek_ge(path)
            self._advance(index)

    def close(self) -> None:
        for source in self._sources:
            close = getattr(source, "close", None)
            if close:
                close()


class DisjointMerge:
    """Merge, in path order, of sources that never hold the same path (the shards of one
    staging token): one heap replace per item, no shadowing to check."""

    def __init__(self, sources: list):
        self._sources = sources
        self._heap: list[tuple[str, int, Entry | None]] = []
        self._fill()

    def _fill(self) -> None:
        heap = []
        for index, source in enumerate(self._sources):
            try:
                path, value = next(source)
            except StopIteration:
                continue
            heap.append((path, index, value))
        heapq.heapify(heap)  # paths differ between sources: the index never breaks a tie
        self._heap = heap

    def __iter__(self) -> DisjointMerge:
        return self

    def __next__(self) -> tuple[str, Entry | None]:
        heap = self._heap
        if not heap:
            raise StopIteration
        path, index, value = heap[0]
        try:
            following, following_value = next(self._sources[index])
        except StopIteration:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (following, index, following_value))
        return path, value

    def seek_ge(self, path: str) -> None:
        for source in self._sources:
            source.seek_ge(path)
        self._fill()

    def close(self) -> None:
        for source in self._sources:
            source.close()


def visible(iterator: Iterable[tuple[str, Entry | None]]) -> Iterator[Entry]:
    """Entries only: tombstones hide whatever lay below them."""
    for _path, value in iterator:
        if value is not None:
            yield value


def string_after_prefix(prefix: str) -> str | None:
    """The smallest string greater than every string starting with `prefix`."""
    stripped = prefix.rstrip("\U0010ffff")
    if not stripped:
        return None
    return stripped[:-1] + chr(ord(stripped[-1]) + 1)


# ---- page tokens ---------------------------------------------------------------------------


def encode_page_token(**state: Any) -> str:
    raw = json.dumps(state, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# The fields encode_page_token is given, with their types: a token that parses but holds
# another type (a client's garbage) must be refused here, not fail deep inside as INTERNAL.
_PAGE_TOKEN_FIELDS = {"after": str, "skip_prefix": bool, "frontier": list}


def decode_page_token(token: str, *required: str) -> dict:
    if not token:
        return {}
    try:
        padded = token + "=" * (-len(token) % 4)
        state = json.loads(base64.urlsafe_b64decode(padded.encode()))
        if not isinstance(state, dict) or any(k not in state for k in required):
            raise ValueError
        for key, value in state.items():
            expected = _PAGE_TOKEN_FIELDS.get(key)
            if expected is not None and not isinstance(value, expected):
                raise ValueError
        if not all(isinstance(c, str) for c in state.get("frontier", [])):
            raise ValueError
        return state
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: deep nesting
        raise gerrors.InvalidPageToken(
            "page_token is not one this server issued; pass back next_page_token unchanged"
        ) from None
