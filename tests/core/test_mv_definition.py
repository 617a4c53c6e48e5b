"""The MV definition: parsing from plain data, derived values and structural validation."""

from __future__ import annotations

import pytest

from backfill_assets.core.errors import InvalidKeyType, InvalidMVDefinition
from backfill_assets.core.keys import KeyColumn
from backfill_assets.core.mv_definition import UNRESOLVED, ComputedColumn, MVDefinition
from backfill_assets.core.snapshot import DEFAULT_SLICE_ROWS

UPSTREAM = {"id": "bigint", "day": "date", "name": "string", "amount": "decimal(10,2)",
            "score": "double", "vnode": "int"}
BASE = {"name": "mv", "upstream": "orders", "primary_key": ["id"], "columns": ["id", "name"]}


def make(**over) -> MVDefinition:
    return MVDefinition.from_dict({**BASE, **over})


def test_from_dict_with_names_and_defaults() -> None:
    d = make()
    assert d == MVDefinition("mv", "orders", (KeyColumn("id", UNRESOLVED),), ("id", "name"))
    assert (d.filter, d.computed, d.mode, d.chunk_size, d.rate_limit, d.vnode_count,
            d.slice_rows) == (None, (), "snapshot", 10000, None, 256, DEFAULT_SLICE_ROWS)


def test_from_dict_with_full_pk_and_computed_columns() -> None:
    d = make(
        primary_key=[{"name": "day", "type": "date", "descending": True, "nulls_first": True},
                     {"name": "id"}],
        columns=("day", "id"),
        computed=[{"name": "upper_name", "expr": "upper(name)"}],
        filter="amount > 0", mode="no_shuffle", chunk_size=5, rate_limit=0, vnode_count=8,
    )
    assert d.primary_key == (KeyColumn("day", "date", True, True), KeyColumn("id", UNRESOLVED))
    assert d.computed == (ComputedColumn("upper_name", "upper(name)"),)
    assert d.output_columns == ("day", "id", "upper_name", "vnode")
    assert (d.mode, d.chunk_size, d.rate_limit, d.vnode_count) == ("no_shuffle", 5, 0, 8)


def test_from_dict_accepts_a_single_name_and_built_objects() -> None:
    d = make(primary_key="id", computed=[ComputedColumn("x", "1")])
    assert d.primary_key == (KeyColumn("id", UNRESOLVED),)
    assert make(primary_key=[KeyColumn("id", "bigint")]).key_order.names == ("id",)
    assert d.computed == (ComputedColumn("x", "1"),)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (["not", "a", "mapping"], "must be a mapping"),
        ({**BASE, "colums": []}, r"unknown fields \['colums'\].*allowed fields: name, upstream"),
        ({"name": "mv"}, r"missing fields \['upstream', 'primary_key', 'columns'\]"),
        ({**BASE, "primary_key": 3}, "primary_key must be a list"),
        ({**BASE, "primary_key": [{"type": "int"}]}, "name required"),
        ({**BASE, "primary_key": [{"name": "id", "order": "desc"}]}, "must be a column name"),
        ({**BASE, "primary_key": [{"name": "id", "descending": "yes"}]}, "are booleans"),
        ({**BASE, "primary_key": [3]}, "must be a column name"),
        ({**BASE, "computed": [{"name": "x"}]}, "exactly the keys name and expr"),
        ({**BASE, "columns": {"id": 1}}, "columns must be a list"),
    ],
)
def test_from_dict_refuses_malformed_data(data, message) -> None:
    with pytest.raises(InvalidMVDefinition, match=message):
        MVDefinition.from_dict(data)


def test_key_order_needs_resolved_types() -> None:
    with pytest.raises(InvalidKeyType, match="'id' is unknown"):
        make().key_order  # noqa: B018


def test_validate_resolves_pk_types_from_the_upstream() -> None:
    d = make(primary_key=[{"name": "id", "type": "long"}, "day"], columns=["id", "day"])
    resolved = d.validate(UPSTREAM)
    assert resolved.primary_key == (KeyColumn("id", "bigint"), KeyColumn("day", "date"))
    assert resolved.key_order.names == ("id", "day")
    assert d.primary_key[1].type == UNRESOLVED  # the definition itself is unchanged


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"columns": ["id", "nope"]}, r"unknown columns \['nope'\]: pick from the upstream's "
                                      r"columns \(id, day"),
        ({"primary_key": ["nope"], "columns": ["id"]},
         r"unknown primary-key columns \['nope'\]"),
        ({"columns": ["name"]}, r"primary-key columns \['id'\] are not output columns: add them"),
        ({"columns": ["id", "name", "NAME"]}, r"output column names \['name'\] appear more"),
        ({"columns": ["id", "vnode"]}, r"\['vnode'\] appear more than once.*always added"),
        ({"computed": [{"name": "v2", "expr": "1"}, {"name": "V2", "expr": "2"}]},
         r"\['v2'\] appear more than once"),
        ({"computed": [{"name": "Amount", "expr": "1"}]},
         "computed column 'Amount' has the name of an upstream column: rename it"),
        ({"computed": [{"name": "", "expr": "1"}]}, "a computed column needs a non-empty name"),
        ({"computed": [{"name": "x", "expr": " "}]}, "computed column 'x' needs a non-empty"),
        ({"primary_key": ["score"], "columns": ["score"]}, "unsupported primary-key type "
                                                           "'double' of column 'score'"),
        ({"primary_key": [{"name": "id", "type": "string"}]},
         "'id' is declared string but the upstream has bigint"),
        ({"primary_key": [{"name": "zz", "type": "float"}], "columns": ["id"]},
         "unsupported primary-key type 'float'"),
        ({"primary_key": ["vnode"], "columns": ["vnode"]}, r"\['vnode'\] clash with the "
                                                           "progress table's columns"),
        ({"primary_key": []}, "primary_key is empty"),
        ({"columns": []}, "columns must be a non-empty list"),
        ({"columns": ["id", ""]}, "columns must be a non-empty list of column names"),
        ({"mode": "shuffle"}, "mode 'shuffle' is not one of snapshot, arrangement, no_shuffle"),
        ({"slice_rows": 0}, "slice_rows 0 must be an int >= 1"),
        ({"chunk_size": 0}, "chunk_size 0 must be an int >= 1"),
        ({"chunk_size": "10"}, "chunk_size '10' must be an int >= 1"),
        ({"vnode_count": 0}, "vnode_count 0 must be an int in 1..32768"),
        ({"vnode_count": 40000}, "vnode_count 40000 must be an int in 1..32768"),
        ({"rate_limit": -1}, r"rate_limit -1 must be empty \(unlimited\), 0 \(paused\)"),
        ({"filter": "  "}, "filter must be a non-empty Spark SQL expression"),
        ({"name": ""}, "name must be a non-empty string"),
        ({"upstream": None}, "upstream must be a non-empty string"),
    ],
)
def test_validate_refuses_structural_mistakes(over, message) -> None:
    with pytest.raises(InvalidMVDefinition, match=message) as e:
        make(**over).validate(UPSTREAM)
    assert str(e.value).startswith(f"MV definition {over.get('name', 'mv')!r} is invalid: ")


def test_validate_lists_every_problem_at_once() -> None:
    with pytest.raises(InvalidMVDefinition) as e:
        make(columns=["nope"], mode="x", chunk_size=0).validate(UPSTREAM)
    msg = str(e.value)
    assert "unknown columns ['nope']" in msg and "mode 'x'" in msg and "chunk_size 0" in msg
    assert "['id'] are not output columns" in msg


def test_validate_accepts_a_full_definition() -> None:
    d = make(columns=["id", "name", "amount"], filter="amount > 0", rate_limit=100,
             computed=[{"name": "twice", "expr": "amount * 2"}], mode="no_shuffle")
    assert d.validate(UPSTREAM).output_columns == ("id", "name", "amount", "twice", "vnode")
