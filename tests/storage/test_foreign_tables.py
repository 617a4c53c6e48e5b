"""Foreign Delta tables read through the storage layer equal delta-rs' own (DV-aware) read.

The tables in tests/data/kernel were written by Databricks / Delta-Spark: deletion vectors,
column mapping in name and id modes, CDC files beside DVs, a timestamp_ntz partition with a
null partition. Types must be exact and rows identical as multisets.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from backfill_assets.core.errors import UnsupportedTableFeature
from backfill_assets.storage import TableVersion, read_version

KERNEL = os.path.join(os.path.dirname(__file__), "..", "data", "kernel")
TABLES = ["table-with-dv-small", "with-short-dv", "cdf-table-with-dv",
          "cdf-column-mapping-name-mode", "cdf-column-mapping-id-mode",
          "data-reader-timestamp_ntz", "cdf-table-with-cdc-and-dvs"]


def _multiset(table: pa.Table) -> Counter:
    return Counter(json.dumps(r, default=str, sort_keys=True) for r in table.to_pylist())


@pytest.mark.spark
@pytest.mark.parametrize("name", TABLES)
def test_every_version_reads_like_delta_rs(spark, name):
    uri = os.path.abspath(os.path.join(KERNEL, name))
    latest = DeltaTable(uri).version()
    for version in range(latest + 1):
        expected = pa.table(DeltaTable(uri, version=version).scan())
        got = read_version(spark, uri, version).toArrow()
        assert got.schema.names == expected.schema.names
        for g, e in zip(got.schema, expected.schema, strict=True):
            assert g.type == e.type or (pa.types.is_string(g.type) and
                                        pa.types.is_string_view(e.type)), (name, g, e)
        assert _multiset(got) == _multiset(expected.cast(got.schema)), (name, version)


@pytest.mark.spark
def test_deleted_rows_never_come_back(spark):
    uri = os.path.abspath(os.path.join(KERNEL, "table-with-dv-small"))
    snap = TableVersion.load(uri)
    assert [f.deleted for f in snap.files] == [2]
    values = sorted(read_version(spark, uri, None).toArrow()["value"].to_pylist())
    assert values == sorted(pa.table(DeltaTable(uri).scan())["value"].to_pylist())
    assert len(values) == snap.files[0].num_records - 2


def test_an_unknown_reader_feature_is_refused_by_name(tmp_path):
    uri = str(tmp_path / "t")
    shutil.copytree(os.path.join(KERNEL, "table-with-dv-small"), uri)
    log = os.path.join(uri, "_delta_log", "00000000000000000002.json")
    with open(log, "w") as f:
        f.write(json.dumps({"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                                         "readerFeatures": ["deletionVectors", "typeWidening"],
                                         "writerFeatures": ["deletionVectors",
                                                            "typeWidening"]}}) + "\n")
    with pytest.raises(UnsupportedTableFeature, match="typeWidening"):
        TableVersion.load(uri).check_readable()
