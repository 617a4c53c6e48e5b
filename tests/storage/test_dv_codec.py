"""Deletion-vector bytes: round trips, and byte equality with a Databricks-written DV file."""

from __future__ import annotations

import json
import os

from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap64

from backfill_assets.storage.delta import dv
from tests.foreign import z85_crate_tail

KERNEL = os.path.join(os.path.dirname(__file__), "..", "data", "kernel")


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=64))
def test_z85_round_trip_at_every_size(data):
    """Aligned or not: Delta's form (zero bytes to a multiple of 4, kept to ``size``)."""
    text = dv.z85_encode(data)
    assert len(text) == -(-len(data) // 4) * 5
    assert dv.z85_decode(text, len(data)) == data


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=64))
def test_the_z85_crate_tail_decodes_to_its_bytes(data):
    assert dv.z85_decode(z85_crate_tail(data), len(data)) == data


def test_the_databricks_inline_dv_of_34_bytes_deletes_row_3():
    """kernel-rs' cdf-table-with-dv version 5: 'Restore [0, 5] and Remove [3]' (its test's
    words); modulo 2^32 the last group would read row 28,168 of a 10-row file."""
    table = os.path.join(KERNEL, "cdf-table-with-dv")
    with open(os.path.join(table, "_delta_log", "00000000000000000005.json")) as f:
        add = next(json.loads(line)["add"] for line in f if '"add"' in line)
    assert add["deletionVector"]["sizeInBytes"] == 34
    assert list(dv.load(table, add["deletionVector"], None)) == [3]


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 2**40), max_size=40))
def test_an_inline_dv_of_any_size_round_trips(rows):
    descriptor = dv.encode_inline(BitMap64(rows))
    assert set(dv.decode_inline(descriptor)) == rows
    assert descriptor["sizeInBytes"] == len(dv.z85_decode(descriptor["pathOrInlineDv"],
                                                          descriptor["sizeInBytes"]))


def test_bad_z85_is_a_named_corruption():
    for text, size in [("0000", 4), ("##0930000#", 8), ("####0", 1), ("%%%%%", 4),
                       ("0000~", 4), ("00000", 8), ("#%%%%", 3)]:
        try:
            dv.z85_decode(text, size)
        except dv.DeletionVectorCorrupt:
            continue
        raise AssertionError(f"{text!r} was accepted")


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
