"""The one cache helper of the package (storage/store/lru.py): least recently used first out,
bounded by entries and by weight, conditional replacement, thread-safe; the registry of every
process cache and its one reset (`clear_all`)."""

from __future__ import annotations

import ast
import importlib
import pathlib
import threading

import pytest

from backfill_assets.storage.store import lru
from backfill_assets.storage.store.lru import LRU

ROOT = pathlib.Path(__file__).resolve().parents[2]


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


def _import_every_module() -> None:
    for package in ("backfill_assets", "resources", "jobs"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            importlib.import_module(".".join(parts))


def test_every_process_cache_is_registered_and_listed_in_the_docs():
    """Every cache a module keeps is made by lru.py (so `clear_all` reaches it) and named in
    docs/ARCHITECTURE.md's table of process caches, with what bounds it."""
    _import_every_module()
    names = [n for n in lru.registered() if not n.startswith("test: ")]  # this file's own
    section = (ROOT / "docs" / "ARCHITECTURE.md").read_text().split("## Process caches")[1]
    table = section.split("\n## ")[0]
    missing = [n for n in names if not any(n in row.split("|")[1] for row in
                                           table.splitlines() if row.startswith("| "))]
    assert not missing, f"caches not in ARCHITECTURE's table: {missing}"
    assert {"file keys", "recoveries", "rate-limit paces", "decoded log paths"} <= set(names)


def test_clear_all_empties_every_lru_and_memoized_function():
    calls: list[int] = []

    @lru.memoized("test: squares", 8)
    def square(n: int) -> int:
        calls.append(n)
        return n * n

    cache: LRU[str, int] = LRU(4, name="test: kept")
    cache.put("a", 1)
    assert square(3) == 9 and square(3) == 9 and calls == [3]
    assert cache.get("a") == 1 and cache.get("b") is None and (cache.hits, cache.misses) == (1, 1)
    assert lru.registered()["test: kept"] == "4 entries"
    lru.clear_all()
    assert len(cache) == 0 and (cache.hits, cache.misses) == (0, 0)
    assert square(3) == 9 and calls == [3, 3]  # computed again: the cache was emptied


def test_a_cache_without_a_bound_is_refused():
    with pytest.raises(ValueError, match="needs a bound"):
        LRU(None)


def _module_state(path: pathlib.Path) -> list[str]:
    """Module-level empty dicts/sets (a cache in the making) and functools caches in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                name = ast.unparse(d)
                if "lru_cache" in name or name in ("cache", "functools.cache"):
                    found.append(f"{path.name}:{node.lineno} @{name}")
        if isinstance(node, ast.Call) and "lru_cache" in ast.unparse(node.func):
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node.func)}(...)")
    for node in ast.parse(path.read_text()).body:  # module level only
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        empty = isinstance(value, ast.Dict) and not value.keys or \
            isinstance(value, ast.Call) and ast.unparse(value.func) in (
                "dict", "set", "OrderedDict", "collections.OrderedDict", "defaultdict")
        if empty:
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node).split('=')[0]}")
    return found


# module-level state that is a ledger, not a cache: forgetting it (a bound, `clear_all`) would
# change what the process does, so it stays out of lru.py
NOT_CACHES = {
    # the ports this process handed out: one handed out twice would make two servers clash
    ("jobs/ports.py", "_ports_given"),
    # the compactions running in the background, one per table: a registry of work in flight
    # (popped by `settle` when the table's next barrier waits for it), never a cached value
    ("backfill_assets/aggregate/store.py", "_COMPACTING"),
    # the commits left to the background thread, per table: work in flight (popped by
    # `settle` when the table is next opened), never a cached value
    ("backfill_assets/mv/commit_later.py", "_PENDING"),
}


def test_no_module_keeps_a_cache_of_its_own():
    """Outside lru.py no module keeps a dict, set or functools cache at module level: each
    cache goes through lru.py, so it has a bound and `clear_all` reaches it."""
    helper = ROOT / "backfill_assets" / "storage" / "store" / "lru.py"
    own = [hit for package in ("backfill_assets", "resources", "jobs")
           for path in sorted((ROOT / package).rglob("*.py")) if path != helper
           for hit in _module_state(path)
           if (str(path.relative_to(ROOT)), hit.split(" ")[1].split(":")[0]) not in NOT_CACHES]
    assert not own, "caches outside storage/store/lru.py:\n" + "\n".join(own)
