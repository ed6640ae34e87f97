"""quarry.lru.TTLCache, the one short-lived cache (repository records, protection rules,
writers' branch records): entries expire, the cache is bounded, and time is the injected
clock's, so nothing here sleeps."""

from __future__ import annotations

from quarry.graveler.refs import RefManager
from quarry.kv.memory import MemoryStore
from quarry.lru import TTLCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_entry_is_served_until_its_ttl_then_never():
    clock = Clock()
    cache = TTLCache(2.0, clock=clock)
    cache.put("repo", "record")
    clock.now += 1.999
    assert cache.get("repo") == "record"
    clock.now += 0.001
    assert cache.get("repo") is None  # expired: never served stale past the ttl
    assert len(cache) == 0  # and dropped
    cache.put("repo", "again")
    assert cache.get("repo", ttl=0.0) is None  # a caller's shorter ttl wins


def test_it_is_bounded_and_evicts_the_least_recently_used():
    cache = TTLCache(60.0, max_items=3, clock=Clock())
    for key in "abc":
        cache.put(key, key.upper())
    assert cache.get("a") == "A"  # a is now the most recently used
    cache.put("d", "D")
    assert len(cache) == 3 and cache.get("b") is None
    assert [cache.get(k) for k in "acd"] == ["A", "C", "D"]
    cache.pop("c")
    assert cache.get("c") is None


def test_the_repository_cache_is_one():
    """RefManager's repository records live in a TTLCache (bounded, expiring)."""
    refs = RefManager(MemoryStore())
    assert isinstance(refs._repos, TTLCache)
    assert refs._repos.max_items > 0


def test_expired_entries_of_keys_never_asked_again_do_not_pile_up():
    """An expired entry was dropped only when its key was asked for again: a cache of keys
    that never repeat (the S3 gateway's clients by token, a new token every 10 s) held
    max_items dead values (~300 MB per gateway process)."""
    clock = Clock()
    cache = TTLCache(10.0, max_items=1000, clock=clock)
    for n in range(500):
        cache.put(f"token-{n}", n)
        clock.now += 1.0
    assert len(cache) <= 11  # what the last 10 s put, not 500
    assert cache.get("token-499") == 499
