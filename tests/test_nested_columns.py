"""Upstreams with nested columns (struct, array, map), without Spark: generated Delta schemas
checked by `checked_upstream` (tests/test_column_identity.py's log generator).

An MV that does not read a nested column is checked as usual and carries only what it reads;
one that reads a nested column (selected, or named by its filter) is refused with
`UnsupportedColumnType` naming the column and what to do, before anything is written. The
Spark counterpart, on tables Delta-Spark writes: tests/interop/test_unread_columns.py.
"""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.core.errors import UnsupportedColumnType
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.step.preflight import checked_upstream
from tests.test_column_identity import Upstream

SCALARS = ("integer", "long", "string", "double", "boolean", "date", "binary")


def nested_types() -> st.SearchStrategy:
    """Delta schema types with at least one level of nesting, any depth below."""
    def extend(inner: st.SearchStrategy) -> st.SearchStrategy:
        field = st.builds(lambda n, t: {"name": n, "type": t, "nullable": True, "metadata": {}},
                          st.sampled_from(["a", "b c", "d.e", "f"]), inner)
        return st.one_of(
            st.builds(lambda t: {"type": "array", "elementType": t, "containsNull": True}, inner),
            st.builds(lambda k, v: {"type": "map", "keyType": k, "valueType": v,
                                    "valueContainsNull": True},
                      st.sampled_from(["string", "integer"]), inner),
            st.lists(field, min_size=1, max_size=3, unique_by=lambda f: f["name"]).map(
                lambda fs: {"type": "struct", "fields": fs}))
    return extend(st.recursive(st.sampled_from(SCALARS), extend, max_leaves=4))


@st.composite
def upstreams(draw) -> dict:
    scalars = draw(st.lists(st.sampled_from(["qty", "label", "at"]), unique=True, max_size=3))
    nested = draw(st.lists(st.sampled_from(["payload", "tags", "attrs", "s"]), unique=True,
                           min_size=1, max_size=3))
    order = draw(st.permutations([*scalars, *nested]))
    types = {n: draw(st.sampled_from(["integer", "string"])) for n in scalars}
    types |= {n: draw(nested_types()) for n in nested}
    return {"order": order, "types": types, "scalars": scalars, "nested": nested,
            "read": draw(st.sampled_from([None, *nested])),
            "by_filter": draw(st.booleans())}


def _definition(uri: str, columns: list[str], filter_: str | None) -> MVDefinition:
    return MVDefinition.from_dict({"name": "mv", "upstream": uri, "primary_key": ["id"],
                                   "columns": ["id", *columns], "filter": filter_,
                                   "vnode_count": 8})


@settings(max_examples=60)
@given(upstreams())
def test_nested_columns_are_carried_only_when_read_and_then_refused(case: dict) -> None:
    with tempfile.TemporaryDirectory() as root:
        up = Upstream(f"{root}/upstream", "none", {})
        for name in case["order"]:
            up.fields.append({"name": name, "type": case["types"][name], "nullable": True,
                              "metadata": {}})
        version = up.commit()
        read = case["read"]
        columns = list(case["scalars"])
        filter_ = None
        if read is not None and case["by_filter"]:
            filter_ = f"`{read}` IS NOT NULL"
        elif read is not None:
            columns.append(read)
        d = _definition(up.uri, columns, filter_)
        tables = MVTables.under(root, d.name, up.uri)
        if read is None:
            checked = checked_upstream(tables, d, version)
            assert checked.schema.names == [n for n in ["id", *case["order"]]
                                            if n in {"id", *case["scalars"]}]
        else:
            with pytest.raises(UnsupportedColumnType, match=f"reads column '{read}'") as err:
                checked_upstream(tables, d, version)
            assert "leave it out of the MV's columns, filter and computed columns" in \
                str(err.value)
        assert not os.path.exists(tables.root)


def test_a_short_nested_name_inside_an_unparsed_expression_is_not_read(tmp_path) -> None:
    """Outside the parsed subset an expression reads the columns named by its words: ``e``
    in ``upper``/``levenshtein`` is no read, a backquoted or bare ``e`` is (then refused)."""
    up = Upstream(f"{tmp_path}/upstream", "none", {"label": "string"})
    up.fields.append({"name": "e", "type": {"type": "array", "elementType": "string",
                                            "containsNull": True}, "nullable": True,
                      "metadata": {}})
    version = up.commit()
    for filter_, refused in [("levenshtein(upper(label), 'x') > 1", False),
                             ("levenshtein(upper(label), 'x') > size(`e`)", True),
                             ("levenshtein(label, 'x') > size(e)", True)]:
        d = _definition(up.uri, ["label"], filter_)
        tables = MVTables.under(str(tmp_path), d.name, up.uri)
        if refused:
            with pytest.raises(UnsupportedColumnType, match="reads column 'e'"):
                checked_upstream(tables, d, version)
        else:
            assert checked_upstream(tables, d, version).schema.names == ["id", "label"]
