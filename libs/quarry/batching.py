"""Count-and-bytes batching: the one way Quarry cuts a stream of items into messages.

Used by every client that sends many items in bounded messages: `quarry.client` (PutObjects
stream batches), `quarry.kv.remote` (BatchGet/BatchSet/BatchDelete requests) and
`quarry.committed.remote` (range-writer change and entry streams).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def batches(
    items: Iterable[T],
    max_items: int,
    max_bytes: int | None = None,
    size: Callable[[T], int] | None = None,
) -> Iterator[list[T]]:
    """Consecutive lists of `items`, in order, each of at most `max_items` items and, when
    `max_bytes` and `size` are given, of at most `max_bytes` by `size(item)` — except that
    an item larger than `max_bytes` on its own gets a batch of its own: an item is never
    dropped, split or reordered.

    Lazy: the source is consumed one item at a time as batches are taken (a batch is
    yielded once the next item would not fit, or the source ends), so an exception of the
    source surfaces from the `next()` that reaches it. Never yields an empty batch."""
    if max_items <= 0:
        raise ValueError("max_items must be positive")
    measure = size if max_bytes is not None else None
    limit = max_bytes or 0
    batch: list[T] = []
    batch_bytes = 0
    for item in items:
        item_bytes = measure(item) if measure is not None else 0
        full = len(batch) >= max_items or (measure is not None and batch_bytes + item_bytes > limit)
        if batch and full:
            yield batch
            batch, batch_bytes = [], 0
        batch.append(item)
        batch_bytes += item_bytes
    if batch:
        yield batch


__all__ = ["batches"]
