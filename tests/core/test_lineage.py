"""Lineage between MVs: barrier order, waves, what a commit reaches, cycles refused by name.

The generated graphs are checked against a brute-force oracle (reachability by repeated
expansion), independent of the module's Tarjan and Kahn.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.core.errors import InvalidMVDefinition, MVLineageCycle
from backfill_assets.core.lineage import (
    MVNode,
    build_lineage,
    cycles,
    external_asset_paths,
    table_key,
    topological_order,
)

ROOT = "/wh"


def node(name: str, *reads: str) -> MVNode:
    """An MV under ROOT reading ``reads``: another MV's name or an external table ``up:x``
    (at /up/x, outside ROOT)."""
    uris = tuple(f"/up/{t[3:]}" if t.startswith("up:") else f"{ROOT}/{t}/downstream_mv"
                 for t in reads)
    base = f"{ROOT}/{name}"
    return MVNode(name, uris, f"{base}/downstream_mv",
                  (f"{base}/backfill_progress", f"{base}/replicated_state"))


def reach(edges: dict[str, list[str]], start: str) -> set[str]:
    """Nodes reachable from ``start`` in one or more steps (the oracle)."""
    seen: set[str] = set()
    frontier = set(edges.get(start, ()))
    while frontier - seen:
        seen |= frontier
        frontier = {m for n in frontier for m in edges.get(n, ())}
    return seen


def test_table_key_spellings_meet() -> None:
    assert table_key("file:///wh/a/") == table_key("/wh/./a") == table_key("/wh/b/../a") == "/wh/a"
    assert table_key("s3a://bucket//x/y/") == table_key("S3://bucket/x/y") == "s3://bucket/x/y"


def test_chain_of_three_in_order_whatever_the_input_order() -> None:
    nodes = [node("c", "b"), node("a", "up:u"), node("b", "a")]
    lin = build_lineage(nodes)
    assert lin.order == ("a", "b", "c")
    assert lin.reads == {"a": (), "b": ("a",), "c": ("b",)}
    assert lin.readers == {"a": ("b",), "b": ("c",), "c": ()}
    assert lin.external == {"/up/u": ("a",)}
    assert lin.waves() == (("a",), ("b",), ("c",))
    assert lin.to_run(["file:///up/u/"]) == ("a", "b", "c")
    assert lin.to_run(["/wh/b/downstream_mv"]) == ("c",)
    assert lin.to_run(["/wh/other"]) == ()
    assert lin.downstream(["b", "nope"]) == ("b", "c")
    # one pass through the chain: a first, then b once a's barrier is done, then c
    assert lin.ready(["/up/u"], in_flight=[]) == ("a",)
    assert lin.ready(["/up/u"], in_flight=["a"]) == ()
    assert lin.ready(["/wh/a/downstream_mv"], in_flight=[]) == ("b",)
    assert lin.ready(["/wh/b/downstream_mv"], in_flight=["c"]) == ()


def test_two_mvs_over_one_upstream_share_it_and_run_in_one_wave() -> None:
    lin = build_lineage([node("y", "up:u"), node("x", "up:u"), node("z", "x", "y")])
    assert lin.external == {"/up/u": ("x", "y")}
    assert lin.waves() == (("x", "y"), ("z",))
    assert lin.to_run(["/up/u"]) == ("x", "y", "z")


def test_cycle_refused_by_name_rest_ordered() -> None:
    nodes = [node("a", "c"), node("b", "a"), node("c", "b"), node("d", "c"), node("e", "up:u"),
             node("self", "self")]
    lin = build_lineage(nodes)
    assert set(lin.refused) == {"a", "b", "c", "self"}
    assert all(isinstance(e, MVLineageCycle) for e in lin.refused.values())
    assert "a -> c -> b -> a" in str(lin.refused["b"]) and "'b'" in str(lin.refused["b"])
    assert "self -> self" in str(lin.refused["self"])
    # d reads a refused MV's output: it stays, reads it as a plain table, and is told
    assert lin.order == ("d", "e") and lin.reads["d"] == ()
    assert lin.reads_broken == {"d": ("c",)}
    assert lin.external["/wh/c/downstream_mv"] == ("d",)


def test_reading_a_state_table_or_overlapping_a_table_is_refused() -> None:
    bad_read = MVNode("r", ("/wh/a/backfill_progress",), "/wh/r/downstream_mv")
    inside = MVNode("t", ("/up/v",), "/up/u/t/downstream_mv")  # its folder is in a read table
    holder = MVNode("h", ("/up/v",), "/data/downstream_mv")  # its folder holds a read table
    reader = MVNode("u", ("/up/u", "/data/x"), "/wh/u/downstream_mv")
    lin = build_lineage([node("a", "up:2"), bad_read, inside, holder, reader])
    assert set(lin.refused) == {"r", "t", "h"}
    assert "state table of MV 'a'" in str(lin.refused["r"])
    assert "/wh/a/downstream_mv" in str(lin.refused["r"])
    assert isinstance(lin.refused["t"], InvalidMVDefinition)
    assert "/up/u/t, which overlaps the table /up/u that MV 'u' reads" in str(lin.refused["t"])
    assert "overlaps the table /data/x that MV 'u' reads" in str(lin.refused["h"])
    assert lin.order == ("a", "u")


def test_broken_outputs_named_to_their_readers() -> None:
    lin = build_lineage([node("b", "a")], broken={"/wh/a/downstream_mv/": "a"})
    assert lin.order == ("b",) and lin.reads_broken == {"b": ("a",)}


def test_topological_order_raises_on_a_cycle() -> None:
    with pytest.raises(MVLineageCycle, match=r"'p'.*p -> q -> p"):
        topological_order({"p": ["q"], "q": ["p"]})
    assert cycles({"p": ["q"], "q": ["r"], "r": []}) == []


NAMES = st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True), min_size=1,
                 max_size=14, unique=True)


@st.composite
def graphs(draw, acyclic: bool) -> dict[str, list[str]]:
    """Each MV reads one or two tables: an external one or another MV's output (in an acyclic
    graph only an MV drawn earlier)."""
    names = draw(NAMES)
    out: dict[str, list[str]] = {}
    for i, name in enumerate(names):
        pool = names[:i] if acyclic else names
        choices = st.one_of(st.sampled_from(["up:1", "up:2", "up:3"]),
                            *([st.sampled_from(pool)] if pool else []))
        out[name] = draw(st.lists(choices, min_size=1, max_size=2, unique=True))
    return out


def _mv_edges(g: dict[str, list[str]]) -> dict[str, list[str]]:
    return {n: [t for t in ts if t in g] for n, ts in g.items()}


@settings(max_examples=300)
@given(graphs(acyclic=True), st.randoms())
def test_generated_dags_are_ordered(g: dict[str, list[str]], rnd) -> None:
    nodes = [node(n, *ts) for n, ts in g.items()]
    rnd.shuffle(nodes)
    lin = build_lineage(nodes)
    assert lin.refused == {} and sorted(lin.order) == sorted(g)
    assert lin.order == build_lineage(list(reversed(nodes))).order  # input order is irrelevant
    edges = _mv_edges(g)
    pos = {n: i for i, n in enumerate(lin.order)}
    for name, ups in edges.items():
        assert all(pos[u] < pos[name] for u in ups)
        assert set(lin.reads[name]) == set(ups)
    waves = lin.waves()
    assert lin.order == tuple(n for w in waves for n in w)  # wave by wave, each by name
    assert all(list(w) == sorted(w) for w in waves)
    depth = {n: i for i, wave in enumerate(waves) for n in wave}
    for name, ups in edges.items():
        assert depth[name] == 1 + max((depth[u] for u in ups), default=-1)
    for ext in ("up:1", "up:2", "up:3"):
        direct = {n for n, ts in g.items() if ext in ts}
        reached = direct | {n for n in g if reach(edges, n) & direct}
        assert lin.to_run([f"/up/{ext[3:]}"]) == tuple(n for n in lin.order if n in reached)
        busy = set(rnd.sample(sorted(g), k=min(2, len(g))))
        ready = lin.ready([f"/up/{ext[3:]}"], in_flight=busy)
        assert ready == tuple(n for n in lin.order if n in reached and n not in busy
                              and not reach(edges, n) & (reached | busy))


@settings(max_examples=300)
@given(graphs(acyclic=False))
def test_generated_graphs_refuse_exactly_the_cycles(g: dict[str, list[str]]) -> None:
    edges = _mv_edges(g)
    on_cycle = {n for n in g if n in reach(edges, n)}
    lin = build_lineage([node(n, *ts) for n, ts in g.items()])
    assert set(lin.refused) == on_cycle
    assert set(lin.order) == set(g) - on_cycle
    pos = {n: i for i, n in enumerate(lin.order)}
    for name in lin.order:
        assert all(pos[u] < pos[name] for u in edges[name] if u not in on_cycle)
        assert set(lin.reads_broken.get(name, ())) == set(edges[name]) & on_cycle
    for name, err in lin.refused.items():
        assert isinstance(err, MVLineageCycle) and f"MV {name!r}" in str(err)
        path = re.search(r"cycle (\S+(?: -> \S+)+)", str(err)).group(1).split(" -> ")
        assert path[0] == path[-1] and name in reach(edges, name)
        assert all(b in edges[a] for a, b in zip(path, path[1:], strict=False))


def test_external_tables_keyed_by_table() -> None:
    paths = external_asset_paths(["/wh/upstream", "file:///wh/upstream/", "s3a://bk/x/t",
                                  "/other/t", "/wh/a.b/c", "/wh/a_b/c"], "/wh/")
    assert paths["/wh/upstream"] == ("tables", "upstream")
    assert paths["s3://bk/x/t"] == ("tables", "s3", "bk", "x", "t")
    assert paths["/other/t"] == ("tables", "file", "other", "t")
    # a.b and a_b reduce alike: each keeps its own asset by a hash of its table
    assert paths["/wh/a.b/c"] != paths["/wh/a_b/c"]
    assert paths["/wh/a.b/c"][:2] == ("tables", "a_b") and len(paths) == 5


TABLE = st.lists(st.sampled_from(["a", "a.", "a_", "b-c", "b_c", "é", "_", ".x"]),
                 min_size=1, max_size=3).map("/".join)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from(["/wh/", "/elsewhere/", "s3://bk/", "s3a://bk/"]),
                          TABLE), min_size=1, max_size=8))
def test_generated_external_keys_are_valid_and_one_per_table(tables) -> None:
    uris = [base + t for base, t in tables]
    paths = external_asset_paths(uris, "/wh")
    assert set(paths) == {table_key(u) for u in uris}
    assert len(set(paths.values())) == len(paths)
    assert all(re.fullmatch(r"[A-Za-z0-9_]+", p) for path in paths.values() for p in path)
    assert external_asset_paths(list(reversed(uris)), "file:///wh/") == paths
