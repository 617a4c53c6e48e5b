"""The model the property tests (test_properties.py) drive: an in-memory upstream (dict key ->
row, one snapshot per version, a change feed), a tiny step driver through the pure core
(plan_step -> replicate -> net_changes + visible -> snapshot -> apply_chunk -> commit via the
codec), and the brute force ``f`` the MV is compared with, whose key order is its own rank-based
sort key, independent of ``KeyOrder.compare``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import zlib
from decimal import Decimal

from hypothesis import event
from hypothesis import strategies as st

from backfill_assets.core.changes import (
    RawChange,
    StreamOp,
    mark_visible,
    net_changes,
    select_changes,
    visible,
)
from backfill_assets.core.codec import decode, encode
from backfill_assets.core.keys import KeyColumn, KeyOrder
from backfill_assets.core.planning import commit_step, plan_step
from backfill_assets.core.positions import VnodeChunk
from backfill_assets.core.progress import BackfillState, Completed, NotStarted

KO = KeyOrder(
    (
        KeyColumn("k_int", "int"),
        KeyColumn("k_str", "string", descending=True, nulls_first=True),
        KeyColumn("k_date", "date"),
        KeyColumn("k_dec", "decimal(6,2)", descending=True),
        KeyColumn("k_ts", "timestamp"),
    )
)
UTC = dt.UTC
DOMAINS = (
    [0, 1, 2],
    ["", "a", "b'", "\\"],
    [dt.date(2024, 1, 1), dt.date(2024, 2, 29)],
    [Decimal("-1.50"), Decimal("2.00")],
    [dt.datetime(2024, 1, 1, tzinfo=UTC), dt.datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=UTC)],
)
UNIVERSE = list(itertools.product(*DOMAINS))
VNODES = (0, 1, 2)


def vnode_of(key: tuple) -> int:
    return zlib.crc32(repr(key).encode()) % len(VNODES)


def ref_sort_key(key: tuple) -> tuple:
    """Independent of KeyOrder.compare: rank in the column's sorted domain, negated if desc."""
    out = []
    for col, domain, value in zip(KO.columns, DOMAINS, key, strict=True):
        rank = sorted(domain).index(value)
        out.append(-rank if col.descending else rank)
    return tuple(out)


def make_row(key: tuple, val: int) -> dict:
    return {**dict(zip(KO.names, key, strict=True)), "val": val}


def keep(row: dict) -> bool:  # the MV's filter
    return row["val"] % 3 != 0


def project(row: dict) -> dict:  # the MV's projection (+ a computed column)
    return {**{n: row[n] for n in KO.names}, "val": row["val"], "double": row["val"] * 2}


def f(rows: dict) -> dict:
    return {k: project(r) for k, r in rows.items() if keep(r)}


class Upstream:
    """A pk table with a version history and a change feed in both forms."""

    def __init__(self) -> None:
        self.rows: dict[tuple, dict] = {}
        self.version = 0
        self.history = {0: {}}
        self.raw: list[RawChange] = []
        self.stream: list[tuple[int, StreamOp]] = []

    def commit(self, ops: list[tuple[str, tuple, tuple, int]]) -> None:
        """One Delta-like commit: each key is touched at most once per version."""
        v, touched = self.version + 1, set()
        for kind, key, key2, val in ops:
            if key in touched or (kind == "move" and key2 in touched):
                continue
            exists = key in self.rows
            if kind == "insert" and not exists:
                self._emit(v, [("insert", "+", key, make_row(key, val))])
            elif kind == "update" and exists:
                old, new = self.rows[key], make_row(key, val)
                self._emit(v, [("update_preimage", "U-", key, old),
                               ("update_postimage", "U+", key, new)])
            elif kind == "delete" and exists:
                self._emit(v, [("delete", "-", key, self.rows[key])])
            elif kind == "move" and exists and key2 not in self.rows:
                old, new = self.rows[key], make_row(key2, val)
                self._emit(v, [("update_preimage", "U-", key, old),
                               ("update_postimage", "U+", key2, new)])
            else:
                continue
            touched |= {key, key2}
        self.version = v
        self.history[v] = dict(self.rows)

    def _emit(self, v: int, changes: list) -> None:
        for change_type, op, key, row in changes:
            if op in ("-", "U-"):
                del self.rows[key]
            else:
                self.rows[key] = row
            self.raw.append(RawChange(v, change_type, key, row))
            self.stream.append((v, StreamOp(op, key, row)))


def of_vnode(rows: dict, vnode: int) -> dict:
    return {k: r for k, r in rows.items() if vnode_of(k) == vnode}


def apply_net(target: dict, nets, transform) -> None:
    for n in nets:
        if n.op == "upsert" and (transform is None or keep(n.row)):
            target[n.key] = project(n.row) if transform else n.row
        else:
            target.pop(n.key, None)


def assert_pairs_intact(ops: list[StreamOp]) -> None:
    """After mark_visible every U- is directly followed by a U+ of the same key."""
    for i, o in enumerate(ops):
        if o.op == "U-":
            assert ops[i + 1].op == "U+" and ops[i + 1].key == o.key
        if o.op == "U+":
            assert i > 0 and ops[i - 1].op == "U-"


class Driver:
    """The step loop of docs/DESIGN.md ("The step"), in memory."""

    def __init__(self, strategy) -> None:
        self.strategy = strategy
        self.up = Upstream()
        self.mv: dict = {}
        self.stream_mv: dict = {}
        self.replica: dict[int, dict] = {}
        self.replica_versions: dict[int, int | None] = {}
        self.table: dict[int, dict] = {}  # backfill_progress rows by vnode
        self.read_counts = dict.fromkeys(VNODES, 0)  # snapshot rows read per vnode

    def recover(self, run: list[int]) -> BackfillState:
        recovered = {}
        for v in run:
            if v in self.table:
                vnode, progress, version = decode(self.table[v], KO)
                assert vnode == v
                recovered[v] = (progress, version)
        state = BackfillState(KO, run, recovered)
        self.strategy.recover(state)
        return state

    def step(self, state, data, chunk_size: int, rate_limit: int | None) -> None:
        v_new = self.up.version
        plan = plan_step(state, self.strategy, state.vnodes, self.replica_versions,
                         v_new, chunk_size, rate_limit)
        assert plan.paused == (rate_limit == 0) == (plan.chunk_limit == 0)
        self.replicate(plan)
        before = state.progress_map()
        raw = select_changes(self.up.raw, vnode_of, plan.forward_since, v_new)
        raw = data.draw(st.permutations(raw), label="cdf order")
        apply_net(self.mv, visible(net_changes(raw, KO), vnode_of, before, KO), True)
        self.forward_stream(plan, before)
        self.snapshot(state, plan)
        for w in commit_step(state, plan):
            assert (w.kind == "insert") == (w.vnode not in self.table)
            self.table[w.vnode] = encode(w.vnode, w.progress, w.version, KO)
        state.mark_committed()
        assert state.commit_plan() == []
        self.check()

    def replicate(self, plan) -> None:
        for p in plan.vnodes:
            if not p.replicate:
                assert p.replicate_from is None
                continue
            if p.replicate_from is None:
                self.replica[p.vnode] = of_vnode(self.up.history[plan.v_new], p.vnode)
            else:
                raw = select_changes(self.up.raw, vnode_of, {p.vnode: p.replicate_from},
                                     plan.v_new)
                apply_net(self.replica[p.vnode], net_changes(raw, KO), None)
            self.replica_versions[p.vnode] = plan.v_new
            assert self.replica[p.vnode] == of_vnode(self.up.history[plan.v_new], p.vnode)

    def forward_stream(self, plan, before) -> None:
        since = plan.forward_since
        ops = []
        for ver, op in self.up.stream:
            start = since.get(vnode_of(op.key))
            if start is not None and start < ver <= plan.v_new:
                ops.append(op)
        marked = mark_visible(ops, vnode_of, before, KO)
        event(f"forwarded ops: {min(len(marked), 5)}+")
        if any(o.op == "-" for o in marked) and any(o.op == "+" for o in marked):
            event("split update pair forwarded")
        assert_pairs_intact(marked)
        for o in marked:
            if o.op in ("+", "U+") and keep(o.row):
                self.stream_mv[o.key] = project(o.row)
            else:
                self.stream_mv.pop(o.key, None)

    def snapshot(self, state, plan) -> None:
        reading = plan.snapshot_vnodes
        if not reading:
            return
        limit = plan.chunk_limit
        chunk: dict[int, VnodeChunk] = {}
        if plan.shared_read:
            bound = plan.plan_for(reading[0]).bound
            assert all(plan.plan_for(v).bound == bound for v in reading)
            rows = [(k, r) for k, r in self.up.history[plan.v_new].items()
                    if vnode_of(k) in reading and bound.admits(KO, k)]
            read = sorted(rows, key=lambda kr: ref_sort_key(kr[0]))[:limit]
            for v in reading:
                mine = [k for k, _ in read if vnode_of(k) == v]
                chunk[v] = VnodeChunk(len(mine), mine[-1] if mine else None)
        else:
            read = []
            for v in reading:
                bound = plan.plan_for(v).bound
                rows = [(k, r) for k, r in self.replica[v].items() if bound.admits(KO, k)]
                mine = sorted(rows, key=lambda kr: ref_sort_key(kr[0]))[:limit]
                read += mine
                chunk[v] = VnodeChunk(len(mine), mine[-1][0] if mine else None,
                                      exhausted=len(mine) < limit)
        for v, c in chunk.items():
            self.read_counts[v] += c.rows
        for k, r in read:
            assert k not in self.mv and k not in self.stream_mv  # never a duplicate
            if keep(r):
                self.mv[k] = self.stream_mv[k] = project(r)
        event(f"snapshot rows read: {min(len(read), 4)}+")
        self.strategy.apply_chunk(state, chunk, limit)

    def committed(self, vnode: int):
        if vnode not in self.table:
            return NotStarted(), None
        _, progress, version = decode(self.table[vnode], KO)
        return progress, version

    def expected(self) -> dict:
        out = {}
        for v in VNODES:
            progress, version = self.committed(v)
            if isinstance(progress, NotStarted):
                continue
            for k, r in of_vnode(self.up.history[version], v).items():
                if isinstance(progress, Completed) or (
                    ref_sort_key(k) <= ref_sort_key(progress.current_pos)
                ):
                    out[k] = r
        return f(out)

    def check(self) -> None:
        expected = self.expected()
        assert self.mv == expected
        assert self.stream_mv == expected
        for v in VNODES:  # row counts are the snapshot rows the vnode has read
            progress, _ = self.committed(v)
            assert progress.row_count == self.read_counts[v]
