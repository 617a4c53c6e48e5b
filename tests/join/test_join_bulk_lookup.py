"""The task bulk's lookup join (join/bulk_join.py) against Arrow's own hash join: the
position of each fact's dimension row for one- and two-column keys, a null in any join
column matching nothing, the fact rows kept in their order (pure Arrow, no Spark)."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from backfill_assets.join.bulk_join import Lookup


@pytest.mark.parametrize("columns", [1, 2])
def test_positions_are_the_hash_joins_match(columns):
    rng = random.Random(columns)
    keys = sorted({tuple(rng.randint(0, 9) for _ in range(columns)) for _ in range(40)})
    rng.shuffle(keys)
    dim = pa.table({f"k{j}": [k[j] for k in keys] for j in range(columns)})
    facts = pa.table({f"f{j}": [None if rng.random() < 0.1 else rng.randint(0, 11)
                                for _ in range(300)] for j in range(columns)})
    on = tuple(f"f{j}" for j in range(columns))
    lookup = Lookup(on, tuple(f"k{j}" for j in range(columns)), dim)
    got = lookup.positions(facts).to_pylist()
    where = {k: i for i, k in enumerate(keys)}
    want = [None if None in row else where.get(row)
            for row in zip(*(facts.column(c).to_pylist() for c in on), strict=True)]
    assert got == want
    assert any(p is None for p in got) and any(p is not None for p in got)
