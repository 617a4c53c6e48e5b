"""The progress-row codec: layout, round trip, schema validation and corrupt rows."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.core.codec import (
    decode,
    encode,
    from_json,
    progress_schema,
    to_json,
    validate_schema,
)
from backfill_assets.core.errors import (
    CorruptProgressRow,
    InvalidMVDefinition,
    ProgressSchemaMismatch,
)
from backfill_assets.core.keys import KeyColumn, KeyOrder
from backfill_assets.core.progress import Completed, InProgress, NotStarted

KO = KeyOrder(
    (
        KeyColumn("id", "bigint"),
        KeyColumn("day", "date", descending=True),
        KeyColumn("amount", "decimal(10,2)"),
        KeyColumn("at", "timestamp"),
        KeyColumn("name", "string"),
    )
)
POS = (7, dt.date(2024, 1, 2), Decimal("3.50"), dt.datetime(2024, 1, 1, tzinfo=dt.UTC), "x")
NAMES = ["vnode", "id", "day", "amount", "at", "name", "backfill_finished", "row_count",
         "version"]


def row(**over) -> dict:
    base = dict(zip(KO.names, POS, strict=True))
    base.update(vnode=3, backfill_finished=False, row_count=5, version=9)
    base.update(over)
    return base


def test_progress_schema() -> None:
    assert progress_schema(KO) == [
        ("vnode", "int"), ("id", "bigint"), ("day", "date"), ("amount", "decimal(10,2)"),
        ("at", "timestamp"), ("name", "string"), ("backfill_finished", "boolean"),
        ("row_count", "bigint"), ("version", "bigint"),
    ]


def test_not_started_has_no_row() -> None:
    assert encode(3, NotStarted(), None, KO) is None


def test_encode_in_progress_and_completed() -> None:
    assert encode(3, InProgress(POS, 5), 9, KO) == row()
    assert encode(3, Completed(POS, 5), 9, KO) == row(backfill_finished=True)


def test_empty_snapshot_is_finished_with_an_all_null_pk() -> None:
    encoded = encode(1, Completed(KO.placeholder(), 0), 2, KO)
    assert encoded == {"vnode": 1, "id": None, "day": None, "amount": None, "at": None,
                       "name": None, "backfill_finished": True, "row_count": 0, "version": 2}
    assert decode(encoded, KO) == (1, Completed(KO.placeholder(), 0), 2)


def test_encode_refuses_what_could_not_be_decoded() -> None:
    with pytest.raises(CorruptProgressRow, match="version None is missing"):
        encode(3, InProgress(POS, 5), None, KO)
    with pytest.raises(CorruptProgressRow, match="row_count -1"):
        encode(3, InProgress(POS, -1), 1, KO)


@pytest.mark.parametrize("name", ["vnode", "Version", "row_count", "backfill_finished"])
def test_pk_names_must_not_clash_with_metadata_columns(name) -> None:
    ko = KeyOrder((KeyColumn(name, "int"),))
    with pytest.raises(InvalidMVDefinition, match=f"'{name}'.*clash.*pick another primary key"):
        progress_schema(ko)
    with pytest.raises(InvalidMVDefinition):
        encode(0, InProgress((1,), 1), 1, ko)


PROGRESS = st.one_of(
    st.builds(InProgress, st.just(POS), st.integers(0, 2**40)),
    st.builds(Completed, st.just(POS), st.integers(0, 2**40)),
    st.just(Completed(KO.placeholder(), 0)),
)


@settings(max_examples=100, deadline=None)
@given(vnode=st.integers(0, 32767), progress=PROGRESS, version=st.integers(0, 2**40))
def test_round_trip(vnode, progress, version) -> None:
    assert decode(encode(vnode, progress, version, KO), KO) == (vnode, progress, version)


def test_decode_normalizes_naive_timestamps() -> None:
    naive = row(at=dt.datetime(2024, 1, 1))
    assert decode(naive, KO)[1] == InProgress(POS, 5)


def test_schema_mismatch_names_missing_and_extra_columns() -> None:
    old = row()
    del old["name"]
    old["title"] = "x"
    with pytest.raises(ProgressSchemaMismatch) as e:
        decode(old, KO)
    msg = str(e.value)
    assert "missing columns ['name']" in msg and "unexpected columns ['title']" in msg
    assert "primary key changed" in msg and "drop the MV's state" in msg
    assert "restore the previous primary key" in msg


def test_validate_schema_accepts_names_in_any_order_and_spark_type_spellings() -> None:
    validate_schema(reversed(NAMES), KO)
    validate_schema(
        {"vnode": "integer", "id": "long", "day": "DATE", "amount": "decimal(10, 2)",
         "at": "timestamp", "name": "string", "backfill_finished": "bool",
         "row_count": "bigint", "version": "long"},
        KO,
    )


def test_validate_schema_refuses_wrong_types() -> None:
    types = dict(progress_schema(KO))
    types["amount"] = "decimal(12,2)"
    types["version"] = 7
    with pytest.raises(ProgressSchemaMismatch, match=r"wrong types: amount is decimal\(12,2\), "
                       r"expected decimal\(10,2\), version is 7, expected bigint"):
        validate_schema(types, KO)
    types = dict(progress_schema(KO))
    types["name"] = "array<string>"
    with pytest.raises(ProgressSchemaMismatch, match="name is array<string>"):
        validate_schema(types, KO)


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"vnode": -1}, "vnode must be a non-negative int"),
        ({"vnode": None}, "vnode must be a non-negative int"),
        ({"vnode": True}, "vnode must be a non-negative int"),
        ({"backfill_finished": None}, "backfill_finished None must be true or false"),
        ({"backfill_finished": "true"}, "backfill_finished 'true' must be true or false"),
        ({n: None for n in KO.names}, "backfill_finished=false with a null pk"),
        ({"name": None}, "is partly null"),
        ({"row_count": -3}, "row_count -3"),
        ({"row_count": None}, "row_count None"),
        ({"version": None}, "version None is missing"),
        ({"version": -1}, "version -1 is missing or negative"),
        ({**{n: None for n in KO.names}, "backfill_finished": True, "row_count": 2},
         "empty finished vnode .* must have row_count 0"),
        ({"id": "7"}, "does not fit its type bigint"),
        ({"amount": Decimal("1.234")}, "does not fit its type decimal"),
    ],
)
def test_decode_refuses_corrupt_rows(over, message) -> None:
    with pytest.raises(CorruptProgressRow, match=message) as e:
        decode(row(**over), KO)
    assert "corrupt" in str(e.value) and "drop the MV's state" in str(e.value)


@settings(max_examples=100, deadline=None)
@given(vnode=st.integers(0, 32767), progress=PROGRESS, version=st.integers(0, 2**40))
def test_json_round_trip(vnode, progress, version) -> None:
    encoded = encode(vnode, progress, version, KO)
    text = json.dumps(to_json(encoded, KO))
    assert decode(from_json(json.loads(text), KO), KO) == (vnode, progress, version)
    assert decode(from_json(text, KO), KO) == (vnode, progress, version)


def test_json_values() -> None:
    got = to_json(encode(3, InProgress(POS, 5), 9, KO), KO)
    assert got == {"vnode": 3, "id": 7, "day": "2024-01-02", "amount": "3.50",
                   "at": "2024-01-01T00:00:00.000000+00:00", "name": "x",
                   "backfill_finished": False, "row_count": 5, "version": 9}
    assert to_json(None, KO) is None and from_json(None, KO) is None


@pytest.mark.parametrize(
    "bad",
    ["{not json", '["a", "list"]', {**row(), "day": "2024-13-01"}, {**row(), "amount": "x"},
     {**row(), "at": 5}],
)
def test_from_json_refuses_unreadable_progress(bad) -> None:
    if isinstance(bad, dict):
        bad = {k: (v.isoformat() if isinstance(v, dt.date) else v) for k, v in bad.items()}
        bad = {k: (str(v) if isinstance(v, Decimal) else v) for k, v in bad.items()}
    with pytest.raises(CorruptProgressRow, match="cannot be read.*drop the MV's state"):
        from_json(bad, KO)
