"""The one in-process cache the storage layer (and mv/) keeps things in: least recently used
first out, bounded by entries and optionally by a weight (bytes, files), thread-safe.

Why one helper: each cache (loaded versions, replayed logs, parsed commits, table heads,
change ranges, shared-cut windows, file keys) is a few lines of bookkeeping that are easy to
get subtly wrong (a lookup that forgets to mark its entry used, a weight that drifts from its
entries); here they are written and tested once. The lock is re-entrant and public, so a
caller whose read-modify-write must not interleave with another's holds it around the steps.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most ``max_entries`` entries (None: no count bound) and, with ``weight``, at most
    ``max_weight`` of their total weight, of which the ``keep_at_least`` most recent are
    never evicted for weight alone."""

    def __init__(self, max_entries: int | None, *, weight: Callable[[V], int] | None = None,
                 max_weight: int | None = None, keep_at_least: int = 0) -> None:
        self.max_entries, self.max_weight, self.keep_at_least = (max_entries, max_weight,
                                                                 keep_at_least)
        self._weigh = weight
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._weight = 0
        self.lock = threading.RLock()

    def get(self, key: K, *, touch: bool = True,
            valid: Callable[[V], bool] | None = None) -> V | None:
        """The entry of ``key`` (None when absent, or when ``valid`` refuses it); ``touch``:
        it becomes the most recently used."""
        with self.lock:
            found = self._entries.get(key)
            if found is None or (valid is not None and not valid(found)):
                return None
            if touch:
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

    def keys(self) -> list[K]:
        """The keys, least recently used first (a copy)."""
        with self.lock:
            return list(self._entries)

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
