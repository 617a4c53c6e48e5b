"""Deletion-vector bytes: round trips, and byte equality with a Databricks-written DV file."""

from __future__ import annotations

import json
import os

from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap64

from backfill_assets.storage.delta import dv

KERNEL = os.path.join(os.path.dirname(__file__), "..", "data", "kernel")


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=64).map(lambda b: b[: len(b) // 4 * 4]))
def test_z85_round_trip(data):
    assert dv.z85_decode(dv.z85_encode(data)) == data


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sets(st.integers(0, 2**40), max_size=50), min_size=1, max_size=5))
def test_a_dv_file_decodes_to_its_bitmaps(row_sets):
    packed = dv.encode_file([BitMap64(rows) for rows in row_sets])
    assert packed.data[0] == 1
    for rows, descriptor in zip(row_sets, packed.descriptors, strict=True):
        offset, size = dv.file_span(descriptor)
        assert set(dv.decode_stored(packed.data[offset:offset + size], descriptor)) == rows
        assert dv.relative_path(descriptor) == packed.relative_path


def test_the_databricks_dv_is_byte_identical_to_ours():
    table = os.path.join(KERNEL, "table-with-dv-small")
    with open(os.path.join(table, "_delta_log", "00000000000000000001.json")) as f:
        adds = [json.loads(line)["add"] for line in f if '"add"' in line]
    descriptor = next(a["deletionVector"] for a in adds if a.get("deletionVector"))
    with open(os.path.join(table, dv.relative_path(descriptor)), "rb") as f:
        theirs = f.read()
    rows = dv.load(table, descriptor, None)
    assert sorted(rows) == [0, 9]
    ours = dv.encode_file([rows])
    assert ours.data == theirs
    assert {k: v for k, v in ours.descriptors[0].items() if k != "pathOrInlineDv"} == \
        {k: v for k, v in descriptor.items() if k != "pathOrInlineDv"}


def test_a_damaged_dv_is_refused():
    packed = dv.encode_file([BitMap64([1, 2, 3])])
    descriptor = packed.descriptors[0]
    offset, size = dv.file_span(descriptor)
    raw = bytearray(packed.data[offset:offset + size])
    raw[-1] ^= 0xFF
    try:
        dv.decode_stored(bytes(raw), descriptor)
    except dv.DeletionVectorCorrupt as exc:
        assert "checksum" in str(exc)
    else:
        raise AssertionError("a damaged DV was accepted")
