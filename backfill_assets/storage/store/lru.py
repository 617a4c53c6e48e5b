"""Every in-process cache of the package goes through here: `LRU` (least recently used first
out, bounded by entries and optionally by a weight, thread-safe) or, for a pure function on a
hot path, `memoized` (functools' C cache, registered); `clear_all` empties them all.

Why one helper: each cache (loaded versions, replayed logs, parsed commits, table heads,
change ranges, shared-cut windows, file keys, recoveries, compiled projections, paces) is a
few lines of bookkeeping that are easy to get subtly wrong (a lookup that forgets to mark its
entry used, a weight that drifts from its entries, a dict that is never bounded); here they
are written and tested once, each has a bound, and a test that needs a cold process calls
`clear_all` instead of reaching into one module's dict. The lock is re-entrant and public, so
a caller whose read-modify-write must not interleave with another's holds it around the
steps. docs/ARCHITECTURE.md ("Process caches") lists every cache and what bounds it.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
F = TypeVar("F", bound=Callable)

_LIVE: weakref.WeakSet[LRU] = weakref.WeakSet()  # every LRU of the process, for clear_all
_MEMOIZED: dict[str, Callable] = {}  # name -> the memoized function (its cache_clear)


class LRU(Generic[K, V]):
    """At most ``max_entries`` entries (None: no count bound) and, with ``weight``, at most
    ``max_weight`` of their total weight, of which the ``keep_at_least`` most recent are
    never evicted for weight alone."""

    def __init__(self, max_entries: int | None, *, name: str = "",
                 weight: Callable[[V], int] | None = None, max_weight: int | None = None,
                 keep_at_least: int = 0) -> None:
        if max_entries is None and (weight is None or max_weight is None):
            raise ValueError("an LRU needs a bound: max_entries, or a weight and max_weight")
        self.name = name  # what it holds, as ARCHITECTURE's table of caches names it
        self.max_entries, self.max_weight, self.keep_at_least = (max_entries, max_weight,
                                                                 keep_at_least)
        self._weigh = weight
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._weight = 0
        self.hits = self.misses = 0  # lookups (``touch``) that found / did not find an entry
        self.lock = threading.RLock()
        _LIVE.add(self)

    def get(self, key: K, *, touch: bool = True,
            valid: Callable[[V], bool] | None = None) -> V | None:
        """The entry of ``key`` (None when absent, or when ``valid`` refuses it); ``touch``:
        it becomes the most recently used."""
        with self.lock:
            found = self._entries.get(key)
            if found is None or (valid is not None and not valid(found)):
                self.misses += touch
                return None
            if touch:
                self.hits += 1
                self._entries.move_to_end(key)
            return found

    def put(self, key: K, value: V, *, replaces: Callable[[V], bool] | None = None) -> bool:
        """Store ``value`` as the most recently used entry and evict what the bounds do not
        hold; an entry already there is replaced only when ``replaces(entry)`` (default:
        always). Whether it was stored."""
        with self.lock:
            current = self._entries.get(key)
            if current is not None:
                if replaces is not None and not replaces(current):
                    return False
                self._weight -= self._weight_of(current)
            self._entries[key] = value
            self._entries.move_to_end(key)
            self._weight += self._weight_of(value)
            self._evict()
            return True

    def pop(self, key: K) -> V | None:
        with self.lock:
            found = self._entries.pop(key, None)
            if found is not None:
                self._weight -= self._weight_of(found)
            return found

    def discard_where(self, doomed: Callable[[K], bool]) -> None:
        """Forget every entry whose key ``doomed`` picks."""
        with self.lock:
            for key in [k for k in self._entries if doomed(k)]:
                self.pop(key)

    def set_max_weight(self, max_weight: int) -> None:
        with self.lock:
            self.max_weight = max_weight
            self._evict()

    def clear(self) -> None:
        with self.lock:
            self._entries.clear()
            self._weight = 0
            self.hits = self.misses = 0

    def keys(self) -> list[K]:
        """The keys, least recently used first (a copy)."""
        with self.lock:
            return list(self._entries)

    def bound(self) -> str:
        """What bounds it, in words: `32 entries`, `512 MiB of weight`, or both."""
        parts = [] if self.max_entries is None else [f"{self.max_entries} entries"]
        if self.max_weight is not None:
            parts.append(f"weight {self.max_weight}")
        return ", ".join(parts)

    @property
    def weight(self) -> int:
        return self._weight

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def _weight_of(self, value: V) -> int:
        return self._weigh(value) if self._weigh is not None else 0

    def _evict(self) -> None:
        while self._entries and (
                (self.max_entries is not None and len(self._entries) > self.max_entries)
                or (self.max_weight is not None and len(self._entries) > self.keep_at_least
                    and self._weight > self.max_weight)):
            self._weight -= self._weight_of(self._entries.popitem(last=False)[1])


def memoized(name: str, max_entries: int) -> Callable[[F], F]:
    """A pure function's results kept by functools' C cache (no lock or OrderedDict on a path
    taken per file), registered under ``name`` so `clear_all` empties it too."""

    def wrap(function: F) -> F:
        cached = functools.lru_cache(maxsize=max_entries)(function)
        _MEMOIZED[name] = cached
        return cached  # type: ignore[return-value]

    return wrap


def clear_all() -> None:
    """Empty every cache of the process (`LRU`s and `memoized` functions): what a test calls
    to start cold, as a new process would, without knowing which module keeps what."""
    for cache in list(_LIVE):
        cache.clear()
    for function in _MEMOIZED.values():
        function.cache_clear()


def registered() -> dict[str, str]:
    """Every named cache alive in the process -> its bound, in words (the docs' table)."""
    found = {c.name: c.bound() for c in list(_LIVE) if c.name}
    found.update({name: f"{f.cache_info().maxsize} entries" for name, f in _MEMOIZED.items()})
    return found
