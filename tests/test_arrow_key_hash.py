"""The key hash over Arrow columns (arrow/key_hash.py) equals the platform's key hash a value
at a time (`core.vnode.vnodes_of`, itself Spark's `spark_vnode_sql`): a vnode that differs
would put a join's index row where a keyed read never looks."""

from __future__ import annotations

import datetime as dt
import zlib

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.arrow.key_hash import crc32_texts, key_vnodes
from backfill_assets.core.vnode import vnodes_of

INT64 = st.integers(-(2**63), 2**63 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
DATES = st.dates(dt.date(1000, 1, 1), dt.date(9999, 12, 31))
COUNTS = st.sampled_from([1, 7, 8, 256, 1024, 32768])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=80), max_size=50))
def test_the_crc_of_every_text_is_zlibs(texts):
    array = pa.array(texts, pa.string())
    assert crc32_texts(array).tolist() == [zlib.crc32(t.encode("utf-8")) for t in texts]
    if len(texts) > 2:  # an array that starts inside its buffers
        assert crc32_texts(array.slice(1)).tolist() == \
            [zlib.crc32(t.encode("utf-8")) for t in texts[1:]]


@settings(max_examples=200, deadline=None)
@given(st.lists(INT64, min_size=1, max_size=60), st.lists(INT32, min_size=60, max_size=60),
       st.lists(st.text(max_size=12), min_size=60, max_size=60),
       st.lists(DATES, min_size=60, max_size=60), COUNTS)
def test_a_key_hashes_to_the_vnode_the_platform_gives(bigints, ints, texts, dates, count):
    n = len(bigints)
    columns = {"bigint": pa.array(bigints, pa.int64()), "int": pa.array(ints[:n], pa.int32()),
               "string": pa.array(texts[:n], pa.string()),
               "date": pa.array(dates[:n], pa.date32())}
    for key in (["bigint"], ["int"], ["string"], ["date"], ["bigint", "string"],
                ["date", "int", "string"]):
        got = key_vnodes([columns[t] for t in key], key, count)
        rows = list(zip(*(columns[t].to_pylist() for t in key), strict=True))
        assert got.to_pylist() == vnodes_of(rows, key, count), key


def test_a_key_it_cannot_prove_is_left_to_the_caller():
    assert key_vnodes([pa.array([1, None], pa.int64())], ["bigint"], 8) is None
    assert key_vnodes([pa.array([1.5], pa.float64())], ["double"], 8) is None
    assert key_vnodes([pa.chunked_array([[1, 2], [3]], pa.int64())], ["bigint"], 8) \
        .to_pylist() == vnodes_of([(1,), (2,), (3,)], ["bigint"], 8)
