"""The servicers' List* responses: one page of a listing call, converted, with the count of
corrupt records the listing skipped (quarry.graveler.records.listing)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from quarry.graveler import records

R = TypeVar("R")


def listed(
    response: Callable[..., R],
    field: str,
    read: Callable[[], tuple[Sequence[Any], str]],
    convert: Callable[[Any], Any] | None = None,
) -> R:
    """`response` (a List*Response type) with `read()`'s page: its items (each through
    `convert`, as they are without) in `field`, next_page_token, and
    skipped_corrupt_records — what the read skipped in its listing() scope."""
    with records.listing() as skipped:
        found, token = read()
    items = list(found) if convert is None else [convert(item) for item in found]
    return response(**{field: items}, next_page_token=token, skipped_corrupt_records=skipped.count)
