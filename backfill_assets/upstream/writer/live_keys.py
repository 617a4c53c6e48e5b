"""The key sets the load generator draws DML from: the keys a batch may update, delete or move.

``LiveKeys`` holds every live key (read from the table once): exact for any table the
generator made, but a Python tuple per row. ``InitialIds`` stands for a table whose rows are
the generator's initial load with ids ``0..count-1`` and nothing else yet (a benchmark's
upstream of 100M rows): it holds only the initial ids removed since and the keys added since,
so drawing from a large table needs no scan and little memory.
"""

from __future__ import annotations

import random

REGIONS = ("eu", "us", "apac", "latam", "mea")


class LiveKeys:
    """The live keys (region, id) with O(1) random choice and removal."""

    def __init__(self, keys: list[tuple[str, int]]) -> None:
        self.keys = keys
        self.pos = {k: i for i, k in enumerate(keys)}

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, key: tuple[str, int]) -> None:
        self.pos[key] = len(self.keys)
        self.keys.append(key)

    def remove(self, key: tuple[str, int]) -> None:
        i = self.pos.pop(key)
        last = self.keys.pop()
        if i < len(self.keys):
            self.keys[i] = last
            self.pos[last] = i

    def choice(self, rng: random.Random) -> tuple[str, int]:
        return self.keys[rng.randrange(len(self.keys))]


class InitialIds:
    """The keys of an initial load of ``count`` rows (id ``i`` in region ``REGIONS[i % 5]``,
    as ``initial_rows_table`` writes them), less those removed, plus those added; a uniform
    choice over all of them. Added keys carry ids from ``count`` up (``Generator._new_key``)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.removed: set[int] = set()
        self.added = LiveKeys([])

    def __len__(self) -> int:
        return self.count - len(self.removed) + len(self.added)

    def add(self, key: tuple[str, int]) -> None:
        self.added.add(key)

    def remove(self, key: tuple[str, int]) -> None:
        if key[1] < self.count:
            self.removed.add(key[1])
        else:
            self.added.remove(key)

    def choice(self, rng: random.Random) -> tuple[str, int]:
        # rejection over the initial ids: the removed ones are a small share of a large table
        while True:
            i = rng.randrange(self.count + len(self.added))
            if i >= self.count:
                return self.added.keys[i - self.count]
            if i not in self.removed:
                return (REGIONS[i % len(REGIONS)], i)
