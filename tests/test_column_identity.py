"""The progress pin and column-mapping identities, without Spark: generated upstream
logs (JSON lines: a protocol and the metaData of each version, no data files) checked by
`checked_upstream` against a pin written into a real progress table.

Under column mapping (name or id) a swap of two columns by RENAME COLUMN (a -> swap, b -> a,
swap -> b) keeps every name and type, and DROP COLUMN + ADD COLUMN of the same name and type
gives the name a new column: both must be refused with `UpstreamSchemaChanged` naming the column
and what became of it when the MV uses the column (selected, key, or read by its filter, parsed
or not), and tolerated otherwise. An upstream without column mapping, a pin written before
identities were recorded, and an upstream that switched column mapping on after the pin (Delta
makes each name its column's physical name) are accepted; a swap after that switch is not.
The Spark counterpart, on a table Delta-Spark renames: tests/interop/
test_delta_spark_upstreams.py::test_a_column_swap_by_rename_is_refused.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets import storage
from backfill_assets.core.errors import UpstreamSchemaChanged
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.mv import owned_tables
from backfill_assets.mv.owned_tables import MVTables
from backfill_assets.mv.recovery import progress_schema
from backfill_assets.step.column_identity import PIN_KEY
from backfill_assets.step.preflight import checked_upstream

PLAIN = ("qty", "label", "price", "flag", "größe", "at")
MAPPED = ("na me", "dot.ted", "größe (kg)", "semi;colon", "x", "名 前")
TYPES = ("integer", "string")


class Upstream:
    """A Delta log of metaData versions: fields keep their id and physical name through
    renames, as Delta's RENAME COLUMN does; DROP + ADD gives a new one."""

    def __init__(self, root: str, mode: str, columns: dict[str, str]):
        self.uri, self.mode, self.version, self.max_id = root, mode, -1, 0
        self.fields: list[dict] = []
        for name, type_ in {"id": "long", **columns}.items():
            self.add(name, type_)
        os.makedirs(os.path.join(root, "_delta_log"))
        self.commit()

    def add(self, name: str, type_: str) -> None:
        self.max_id += 1
        meta = {} if self.mode == "none" else {
            "delta.columnMapping.id": self.max_id,
            "delta.columnMapping.physicalName": f"col-{uuid.uuid4()}"}
        self.fields.append({"name": name, "type": type_, "nullable": True, "metadata": meta})

    def rename(self, old: str, new: str) -> None:
        next(f for f in self.fields if f["name"] == old)["name"] = new

    def swap(self, a: str, b: str) -> None:
        self.rename(a, "swap")
        self.rename(b, a)
        self.rename("swap", b)

    def drop_and_add(self, name: str) -> None:
        type_ = next(f["type"] for f in self.fields if f["name"] == name)
        self.fields = [f for f in self.fields if f["name"] != name]
        self.add(name, type_)

    def map_by_name(self) -> None:
        """Column mapping switched on later: each column's physical name is its name."""
        self.mode = "name"
        for i, f in enumerate(self.fields, 1):
            f["metadata"] = {"delta.columnMapping.id": i,
                             "delta.columnMapping.physicalName": f["name"]}

    def commit(self) -> int:
        config = {"delta.enableChangeDataFeed": "true"}
        if self.mode != "none":
            config |= {"delta.columnMapping.mode": self.mode,
                       "delta.columnMapping.maxColumnId": str(self.max_id)}
        features = [] if self.mode == "none" else ["columnMapping"]
        actions = [{"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                                 "readerFeatures": features,
                                 "writerFeatures": [*features, "changeDataFeed"]}}]
        actions.append({"metaData": {
            "id": "upstream", "format": {"provider": "parquet", "options": {}},
            "schemaString": json.dumps({"type": "struct", "fields": self.fields}),
            "partitionColumns": [], "configuration": config, "createdTime": 1}})
        self.version += 1
        path = os.path.join(self.uri, "_delta_log", f"{self.version:020d}.json")
        with open(path, "w") as f:
            f.write("".join(json.dumps(a) + "\n" for a in actions))
        return self.version


def pinned(root: str, up: Upstream, d: MVDefinition, old_pin: bool = False) -> MVTables:
    """The MV's progress table, pinned at the upstream's current version (``old_pin``: as a
    pin written before identities were recorded)."""
    tables = MVTables.under(root, d.name, up.uri)
    checked = checked_upstream(tables, d, up.version)
    pin = json.loads(checked.pin(d, pa.schema([])))
    assert set(pin[PIN_KEY]) == set(checked.schema.names)
    if old_pin:
        del pin[PIN_KEY]
    owned_tables.ensure_table(tables.progress, progress_schema(checked.key_order), {}, cdf=False,
                          description=json.dumps(pin))
    return tables


def definition(up: Upstream, used: list[str], filtered: str | None, parsed: bool
               ) -> MVDefinition:
    """An MV selecting ``used``; ``filtered`` read by the filter only (in the subset
    core/expressions.py parses, or outside it: then found by its name in the text)."""
    quoted = f"`{filtered}`" if filtered else None
    text = None if quoted is None else (f"{quoted} IS NOT NULL" if parsed
                                        else f"coalesce({quoted}, {quoted}) IS NOT NULL")
    return MVDefinition.from_dict({"name": "mv", "upstream": up.uri, "primary_key": ["id"],
                                   "columns": ["id", *used], "filter": text, "vnode_count": 8})


@st.composite
def scenarios(draw) -> dict:
    mode = draw(st.sampled_from(["name", "id", "none"]))
    names = draw(st.lists(st.sampled_from(PLAIN if mode == "none" else MAPPED), min_size=3,
                          max_size=5, unique=True))
    columns = {n: draw(st.sampled_from(TYPES)) for n in names}
    used = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names) - 1))
    rest = [n for n in names if n not in used]
    filtered = draw(st.sampled_from([None, *rest]))
    same_type = [(a, b) for a in names for b in names if a < b and columns[a] == columns[b]]
    ops = ["drop_add", "none"] + (["swap"] if same_type else [])
    op = draw(st.sampled_from(ops))
    hit = ([draw(st.sampled_from(same_type))] if op == "swap" else
           [(draw(st.sampled_from(names)),)] if op == "drop_add" else [()])[0]
    return {"mode": mode, "columns": columns, "used": used, "filtered": filtered,
            "parsed": draw(st.booleans()), "op": op, "hit": list(hit),
            "old_pin": draw(st.booleans())}


@settings(max_examples=60)
@given(scenarios())
def test_identity_changes_of_used_columns_are_refused(case: dict) -> None:
    """Refused exactly when the upstream is mapped, the pin has identities, and a column the
    MV uses changed identity; the refusal names the column and what happened, and leaves the
    progress table as it was."""
    with tempfile.TemporaryDirectory() as root:
        up = Upstream(f"{root}/upstream", case["mode"], case["columns"])
        d = definition(up, case["used"], case["filtered"], case["parsed"])
        tables = pinned(root, up, d, case["old_pin"])
        if case["mode"] != "none":  # RENAME and DROP COLUMN need column mapping
            {"swap": lambda: up.swap(*case["hit"]), "drop_add": lambda: up.drop_and_add(
                *case["hit"]), "none": lambda: None}[case["op"]]()
        up.add("added later", "integer")
        version = up.commit()
        uses = {*case["used"], *([case["filtered"]] if case["filtered"] else [])}
        hit_used = sorted(set(case["hit"]) & uses)
        refused = case["mode"] != "none" and not case["old_pin"] and bool(hit_used)
        before = storage.latest_version(tables.progress)
        if not refused:
            names = checked_upstream(tables, d, version).schema.names
            everything = ["id", *case["columns"]]
            assert names == [n for n in everything if n in names]  # the upstream's order
            assert {"id", *uses} <= set(names)  # what the MV reads, and (parsed) only that
            assert case["parsed"] is False or set(names) == {"id", *uses}
            return
        with pytest.raises(UpstreamSchemaChanged) as err:
            checked_upstream(tables, d, version)
        what = "a RENAME COLUMN moved the name" if case["op"] == "swap" else "dropped and re-added"
        assert what in str(err.value) and "reset_mv_job" in str(err.value)
        assert any(repr(c) in str(err.value) for c in hit_used)
        assert storage.latest_version(tables.progress) == before


def test_a_swap_after_column_mapping_was_switched_on_is_refused(tmp_path) -> None:
    """A pin written without column mapping records names as identities: switching mapping
    on keeps them (accepted), a swap afterwards does not."""
    up = Upstream(f"{tmp_path}/upstream", "none", {"qty": "integer", "flag": "integer"})
    d = definition(up, ["qty", "flag"], None, True)
    tables = pinned(str(tmp_path), up, d)
    up.map_by_name()
    assert checked_upstream(tables, d, up.commit()).schema.names == ["id", "qty", "flag"]
    up.swap("qty", "flag")
    with pytest.raises(UpstreamSchemaChanged, match="'flag' is now the column that was 'qty'"):
        checked_upstream(tables, d, up.commit())


def test_renamed_and_dropped_unread_columns_are_not_pinned(tmp_path) -> None:
    """Only the columns the MV reads are pinned: renaming or dropping another one goes on;
    renaming or dropping a read one is refused, naming the column and what became of it."""
    up = Upstream(f"{tmp_path}/upstream", "name", {"qty": "integer", "x": "string",
                                                    "y": "string"})
    d = definition(up, ["qty"], None, True)
    tables = pinned(str(tmp_path), up, d)
    up.rename("x", "x2")
    up.fields = [f for f in up.fields if f["name"] != "y"]
    assert checked_upstream(tables, d, up.commit()).schema.names == ["id", "qty"]
    up.rename("qty", "quantity")
    with pytest.raises(UpstreamSchemaChanged,
                       match="renamed column 'qty' to 'quantity', which MV 'mv' reads"):
        checked_upstream(tables, d, up.commit())
    up.rename("quantity", "qty")
    assert checked_upstream(tables, d, up.commit()).schema.names == ["id", "qty"]
    up.fields = [f for f in up.fields if f["name"] != "qty"]
    with pytest.raises(UpstreamSchemaChanged, match="dropped column 'qty', which MV 'mv' reads"):
        checked_upstream(tables, d, up.commit())


def test_a_change_range_across_a_dropped_and_restored_read_column_is_refused(tmp_path) -> None:
    """A column dropped at version 1 and back at version 2 (a RESTORE brings back the same
    column): version 1's change rows lack it, so a range over it that reads the column is
    refused by name; one that does not read it is read."""
    up = Upstream(f"{tmp_path}/upstream", "name", {"qty": "integer", "x": "string"})
    kept = list(up.fields)
    up.fields = [f for f in up.fields if f["name"] != "x"]
    up.commit()
    up.fields = kept
    up.commit()
    with pytest.raises(UpstreamSchemaChanged, match="version 1 has no column 'x'"):
        storage.read_raw_changes(up.uri, 0, 2, ["id", "x"])
    assert storage.read_raw_changes(up.uri, 0, 2, ["id", "qty"]).num_rows == 0
