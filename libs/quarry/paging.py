"""Where a page ends: after `max_items` items, or before the item that would take the
encoded response past `max_bytes` (Settings.max_response_bytes).

Every paged listing of the core (objects, uncommitted and committed diffs, log,
repositories, branches, tags), the IAM listings (quarry.auth.store), the range-writer's
GetMetaRange and the kv-gateway's
streamed scans cut their pages with a
`PageBudget`, so no response grows past what gRPC clients accept by default (grpcurl and
most clients: 4 MiB received) however large the items or the requested page_size.

A page always holds its first item, whatever its size, so paging always progresses; a
single item is bounded far below the limit anyway (400 KB KV items, 8 KB of metadata per
entry, paths of 1 KB).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from google.protobuf.message import Message

T = TypeVar("T")

# Items per page when a request gives no page_size, and the most any request gets.
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 10_000
# A repeated field's element costs its tag (1 byte for field numbers below 16) and a length
# varint (at most 5 bytes) on top of its own encoding.
ELEMENT_OVERHEAD_BYTES = 6
# Room kept for the response's next_page_token (and its other small fields): a listing's
# token holds one path or name (at most 1 KB of UTF-8, up to ~4 KB once JSON-escaped and
# base64-encoded). A larger token (a log frontier of dozens of merge parents) eats into the
# margin between the default limit and gRPC's 4 MiB.
PAGE_TOKEN_RESERVE_BYTES = 4096


def encoded_size(item: Any) -> int:
    """The bytes `item` adds to a response as one element of a repeated field: the exact
    encoded size of the message the servicer sends for it, plus the element overhead.

    Domain values are converted exactly as the servicers convert them (quarry.convert, a
    Repository's to_proto), so the estimate is the wire size, not a guess."""
    from quarry import convert
    from quarry.graveler.model import Change, Entry, RangeInfo

    if isinstance(item, Message):
        size = item.ByteSize()
    elif isinstance(item, Entry):
        size = convert.entry_to_proto(item).ByteSize()
    elif isinstance(item, Change):
        size = convert.change_to_proto(item).ByteSize()
    elif isinstance(item, RangeInfo):
        size = convert.range_info_to_proto(item).ByteSize()
    elif isinstance(item, str):
        size = len(item.encode())
    elif isinstance(item, (bytes, bytearray)):
        size = len(item)
    elif hasattr(item, "to_proto"):
        size = item.to_proto().ByteSize()
    else:
        raise TypeError(f"no encoded size for {type(item).__name__}")
    return size + ELEMENT_OVERHEAD_BYTES


class PageBudget:
    """Counts items into one page (or one streamed message) by number and encoded size.

    `admit(item)` is True when the item belongs to this page (and counts it), False when
    the page is full: the item then starts the next page. The first item is always
    admitted, even one larger than `max_bytes` on its own."""

    def __init__(
        self, max_items: int, max_bytes: int, size_of: Callable[[Any], int] = encoded_size
    ):
        if max_items < 1 or max_bytes < 1:
            raise ValueError("a page holds at least one item and one byte")
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._size_of = size_of
        self.items = 0
        self.bytes = 0

    def admit(self, item: Any) -> bool:
        if self.items >= self.max_items:
            return False
        size = self._size_of(item)
        if self.items and self.bytes + size > self.max_bytes:
            return False
        self.items += 1
        self.bytes += size
        return True

    @classmethod
    def for_response(
        cls,
        max_items: int,
        max_response_bytes: int,
        size_of: Callable[[Any], int] = encoded_size,
    ) -> PageBudget:
        """The budget of a paged response: its items leave PAGE_TOKEN_RESERVE_BYTES of
        `max_response_bytes` for the next_page_token. `size_of`: the encoded size of an
        item, for items encoded_size does not know (IAM records: quarry.auth.convert)."""
        return cls(max_items, max(1, max_response_bytes - PAGE_TOKEN_RESERVE_BYTES), size_of)

    def reset(self) -> None:
        """Start the next page (streams reuse one budget per message)."""
        self.items = 0
        self.bytes = 0


__all__ = ["PageBudget", "encoded_size", "ELEMENT_OVERHEAD_BYTES", "PAGE_TOKEN_RESERVE_BYTES"]


def every_item(
    list_page: Callable[[str, int], list[T]], after_of: Callable[[T], str], page: int = 1000
) -> Iterator[T]:
    """Every item of a listing read `page` at a time, each page after the last item's key
    (`list_page(after, limit)`, as RefManager's listings take them)."""
    after = ""
    while True:
        items = list_page(after, page)
        yield from items
        if len(items) < page:
            return
        after = after_of(items[-1])
