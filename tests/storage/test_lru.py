"""The storage layer's one cache helper (storage/store/lru.py): least recently used first out,
bounded by entries and by weight, conditional replacement, thread-safe."""

from __future__ import annotations

import threading

from backfill_assets.storage.store.lru import LRU


def test_entries_bound_evicts_the_least_recently_used():
    cache: LRU[str, int] = LRU(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recent
    cache.put("c", 3)
    assert cache.keys() == ["a", "c"] and cache.get("b") is None


def test_a_lookup_that_does_not_touch_leaves_the_order():
    cache: LRU[str, int] = LRU(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a", touch=False) == 1
    cache.put("c", 3)
    assert cache.keys() == ["b", "c"]


def test_valid_refuses_an_entry_without_touching_it():
    cache: LRU[str, int] = LRU(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a", valid=lambda v: v > 1) is None
    assert cache.keys() == ["a", "b"]
    assert cache.get("b", valid=lambda v: v > 1) == 2


def test_replaces_keeps_the_entry_it_does_not_replace():
    cache: LRU[str, int] = LRU(4)
    assert cache.put("a", 5)
    assert not cache.put("a", 3, replaces=lambda current: current <= 3)
    assert cache.get("a") == 5
    assert cache.put("a", 7, replaces=lambda current: current <= 7)
    assert cache.get("a") == 7


def test_weight_bound_keeps_the_newest_few():
    cache: LRU[str, int] = LRU(16, weight=lambda v: v, max_weight=10, keep_at_least=2)
    for k, v in (("a", 4), ("b", 4), ("c", 4)):
        cache.put(k, v)
    assert cache.keys() == ["b", "c"] and cache.weight == 8
    cache.put("d", 50)  # over the bound alone, but the two newest are kept
    assert cache.keys() == ["c", "d"] and cache.weight == 54
    cache.set_max_weight(0)
    assert cache.keys() == ["c", "d"]


def test_weight_without_a_floor_and_without_a_count_bound():
    cache: LRU[str, int] = LRU(None, weight=lambda v: v, max_weight=10)
    for i in range(5):
        cache.put(str(i), 3)
    assert cache.keys() == ["2", "3", "4"] and cache.weight == 9
    cache.put("3", 1)  # a replaced entry's weight goes with it
    assert cache.weight == 7 and cache.keys() == ["2", "4", "3"]
    cache.discard_where(lambda k: k in {"2", "3"})
    assert cache.keys() == ["4"] and cache.weight == 3
    assert cache.pop("4") == 3 and cache.weight == 0 and len(cache) == 0
    cache.set_max_weight(0)
    cache.put("x", 1)
    assert len(cache) == 0


def test_threads_keep_the_bounds():
    cache: LRU[int, int] = LRU(8, weight=lambda v: 1, max_weight=6)

    def work(base: int) -> None:
        for i in range(500):
            cache.put(base + i % 20, 1)
            cache.get(base + (i * 7) % 20)

    threads = [threading.Thread(target=work, args=(n * 100,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) == 6 and cache.weight == 6
