"""Time standing still for the in-process TTL caches (quarry.lru.TTLCache: repository records,
branch records of writers, protection rules), while a test measures a call's cost.

A cost test warms the caches with one call and counts the KV operations of the next. With
real time, an entry cached a little before the warm call (2 s for a repository record, 1 s
for a writer's branch record) may expire between the two calls on a loaded machine, and the
measured call pays one read more: a count that depends on the machine's speed. Within
`paused_ttl_caches()` every TTLCache of this process reads one frozen instant, so nothing
expires between the warm call and the measured one; afterwards each cache gets its own clock
back (what was cached meanwhile is dated at the frozen instant, so it expires no later than
it would have)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from quarry.lru import TTLCache


@contextlib.contextmanager
def paused_ttl_caches() -> Iterator[None]:
    caches = [o for o in gc.get_objects() if isinstance(o, TTLCache)]
    clocks = [cache._clock for cache in caches]
    for cache, clock in zip(caches, clocks, strict=True):
        frozen = clock()  # each cache's own time scale (an injected clock may have its own)
        cache._clock = lambda frozen=frozen: frozen
    try:
        yield
    finally:
        for cache, clock in zip(caches, clocks, strict=True):
            cache._clock = clock
