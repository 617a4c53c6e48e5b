"""The catalog of MV definitions: a folder (or one file) in, healthy and broken MVs out.

Real files in a temporary folder, read by resources/catalog.py; no Spark, no table. Every bad
definition must be refused by name while the others load.
"""

from __future__ import annotations

import os

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.core.catalog import Source
from backfill_assets.core.errors import (
    InvalidMVDefinition,
    InvalidSettings,
    MVLineageCycle,
    MVNameClash,
    UnknownMV,
)
from resources.catalog import catalog_of, describe, load_catalog, main, read_source
from resources.mv import load_mv_definition
from resources.settings import Settings, load_settings

BASE = {"upstream": "upstream", "primary_key": ["id"], "columns": ["id", "qty"]}


def write(folder, file: str, body: object) -> str:
    path = os.path.join(folder, file)
    with open(path, "w", encoding="utf-8") as f:
        f.write(body if isinstance(body, str) else yaml.safe_dump(body))
    return path


def folder_catalog(tmp_path, files: dict[str, object], **env: str):
    mvs = tmp_path / "mvs"
    mvs.mkdir(exist_ok=True)
    for name, body in files.items():
        if name.endswith("/"):
            (mvs / name).mkdir()  # a folder, whatever its name, is not a definition
        else:
            write(mvs, name, body)
    s = load_settings({"BACKFILL_WAREHOUSE": str(tmp_path / "wh"), "BACKFILL_MV_DIR": str(mvs),
                       "BACKFILL_VNODE_COUNT": "16", **env})
    return load_catalog(s), str(tmp_path / "wh")


def broken(catalog) -> dict[str, tuple[str, str]]:
    return {os.path.basename(b.source): (b.name, type(b.error).__name__)
            for b in catalog.broken}


def test_folder_of_three_a_chain_and_a_sibling(tmp_path) -> None:
    cat, wh = folder_catalog(tmp_path, {
        "orders.yaml": {**BASE, "filter": "qty > 0"},
        "big.yml": {**BASE, "upstream": "orders/downstream_mv", "mode": "no_shuffle"},
        "small.yaml": {**BASE, "filter": "qty < 5", "vnode_count": 8},
        "notes.txt": "not a definition", ".draft.yaml": "{{{", "sub.yaml/": None,
    })
    assert cat.names == ("orders", "small", "big") and cat.broken == ()
    assert cat.lineage.reads["big"] == ("orders",)
    assert cat.lineage.waves() == (("orders", "small"), ("big",))
    assert cat.upstreams == {"orders": f"{wh}/upstream", "small": f"{wh}/upstream",
                             "big": f"{wh}/orders/downstream_mv"}
    assert cat.lineage.external == {f"{wh}/upstream": ("orders", "small")}
    assert cat.lineage.to_run([f"{wh}/upstream"]) == ("orders", "small", "big")
    # the settings' defaults, under each file's own values
    assert (cat.definition("orders").vnode_count, cat.definition("small").vnode_count) == (16, 8)
    assert cat.sources["big"].endswith("mvs/big.yml")


def test_bad_definitions_refused_by_name_the_rest_load(tmp_path) -> None:
    cat, _ = folder_catalog(tmp_path, {
        "good.yaml": BASE,
        "syntax.yaml": "upstream: [unclosed\n",
        "empty.yaml": "",
        "listy.yaml": "- 1\n- 2\n",
        "bad_mode.yaml": {**BASE, "mode": "no_shufle"},
        "unknown_field.yaml": {**BASE, "colums": ["id"]},
        "bad-name.yaml": BASE,
        "named.yaml": {**BASE, "name": "has space"},
        "newline.yaml": {**BASE, "name": "line\n"},
        "bad_pk.yaml": {**BASE, "primary_key": 5},
    })
    assert cat.names == ("good",)
    assert broken(cat) == {
        "syntax.yaml": ("syntax", "InvalidMVDefinition"),
        "empty.yaml": ("empty", "InvalidMVDefinition"),
        "listy.yaml": ("listy", "InvalidMVDefinition"),
        "bad_mode.yaml": ("bad_mode", "InvalidMVDefinition"),
        "unknown_field.yaml": ("unknown_field", "InvalidMVDefinition"),
        "bad-name.yaml": ("bad-name", "InvalidMVDefinition"),
        "named.yaml": ("has space", "InvalidMVDefinition"),
        "newline.yaml": ("line\n", "InvalidMVDefinition"),
        "bad_pk.yaml": ("bad_pk", "InvalidMVDefinition"),
    }
    msg = {os.path.basename(b.source): str(b.error) for b in cat.broken}
    assert "not valid YAML at line 2" in msg["syntax.yaml"]
    assert "holds nothing" in msg["empty.yaml"] and "holds list" in msg["listy.yaml"]
    assert "mode 'no_shufle' is not one of snapshot, arrangement" in msg["bad_mode.yaml"]
    assert "unknown fields ['colums']" in msg["unknown_field.yaml"]
    assert "letters, digits and _" in msg["bad-name.yaml"] and "file name" in msg["bad-name.yaml"]
    assert "its name: field" in msg["named.yaml"]
    # a run of a broken MV is refused with its own error, an unknown one by UnknownMV
    with pytest.raises(InvalidMVDefinition, match=r"'bad_mode' .*bad_mode.yaml\) is broken"):
        cat.definition("bad_mode")
    with pytest.raises(UnknownMV, match=r"'nope'.*its MVs are good; broken: .*bad_mode"):
        cat.definition("nope")


def test_name_clashes_owner_keeps_its_name(tmp_path) -> None:
    cat, _ = folder_catalog(tmp_path, {
        "orders.yaml": BASE, "copy.yaml": {**BASE, "name": "Orders"},
        "x.yaml": {**BASE, "name": "twin"}, "y.yaml": {**BASE, "name": "twin"},
        "twice.yaml": BASE, "twice.yml": BASE,
    })
    assert cat.names == ("orders",)
    assert broken(cat) == {"copy.yaml": ("Orders", "MVNameClash"),
                           "x.yaml": ("twin", "MVNameClash"), "y.yaml": ("twin", "MVNameClash"),
                           "twice.yaml": ("twice", "MVNameClash"),
                           "twice.yml": ("twice", "MVNameClash")}
    msg = {os.path.basename(b.source): str(b.error) for b in cat.broken}
    assert "belongs to" in msg["copy.yaml"] and "orders.yaml" in msg["copy.yaml"]
    assert "x.yaml" in msg["y.yaml"] and "no single one of them" in msg["y.yaml"]
    with pytest.raises(MVNameClash):
        cat.definition("twin")


def test_cycle_in_a_folder_refused_by_name(tmp_path) -> None:
    cat, _ = folder_catalog(tmp_path, {
        "a.yaml": {**BASE, "upstream": "c/downstream_mv"},
        "b.yaml": {**BASE, "upstream": "a/downstream_mv"},
        "c.yaml": {**BASE, "upstream": "b/downstream_mv"},
        "d.yaml": {**BASE, "upstream": "a/downstream_mv"},
        "e.yaml": BASE, "f.yaml": {**BASE, "upstream": "e/backfill_progress"},
    })
    assert cat.names == ("d", "e")
    assert broken(cat) == {"a.yaml": ("a", "MVLineageCycle"), "b.yaml": ("b", "MVLineageCycle"),
                           "c.yaml": ("c", "MVLineageCycle"),
                           "f.yaml": ("f", "InvalidMVDefinition")}
    with pytest.raises(MVLineageCycle, match=r"a -> c -> b -> a"):
        cat.definition("b")
    assert cat.lineage.reads_broken == {"d": ("a",)}


def test_reader_of_a_broken_mv_stays_and_is_told(tmp_path) -> None:
    cat, _ = folder_catalog(tmp_path, {"a.yaml": {**BASE, "mode": "bogus"},
                                       "b.yaml": {**BASE, "upstream": "a/downstream_mv"}})
    assert cat.names == ("b",) and cat.lineage.reads_broken == {"b": ("a",)}


def test_one_file_is_a_catalog_of_one(tmp_path) -> None:
    path = write(tmp_path, "mv.yaml", {**BASE, "name": "orders_mv"})
    s = load_settings({"BACKFILL_WAREHOUSE": str(tmp_path), "BACKFILL_MV_CONFIG": path})
    cat = load_catalog(s)
    assert cat.names == ("orders_mv",) and cat.definition("orders_mv") == load_mv_definition(s)
    default = load_catalog(load_settings({"BACKFILL_WAREHOUSE": str(tmp_path)}))
    assert default.names == (load_mv_definition(load_settings({})).name,)
    missing = load_catalog(Settings(str(tmp_path), mv_config=str(tmp_path / "gone.yaml")))
    assert missing.names == () and "cannot read the MV definition" in str(missing.broken[0].error)


def test_folder_settings_refused_by_name(tmp_path) -> None:
    with pytest.raises(InvalidSettings, match="BACKFILL_MV_CONFIG and BACKFILL_MV_DIR"):
        load_settings({"BACKFILL_MV_DIR": str(tmp_path), "BACKFILL_MV_CONFIG": "x.yaml"})
    with pytest.raises(InvalidSettings, match=r"BACKFILL_MV_DIR=.*cannot be listed"):
        load_catalog(Settings(str(tmp_path), mv_dir=str(tmp_path / "none")))
    (tmp_path / "empty").mkdir()
    assert load_catalog(Settings(str(tmp_path), mv_dir=str(tmp_path / "empty"))).names == ()


def test_unreadable_files_are_broken_not_fatal(tmp_path) -> None:
    bad = tmp_path / "latin.yaml"
    bad.write_bytes(b"name: caf\xe9\n")
    assert "not UTF-8" in str(read_source(str(bad)).error)
    (tmp_path / "mvs").mkdir()
    os.symlink(tmp_path / "gone.yaml", tmp_path / "mvs" / "dangling.yaml")
    cat, _ = folder_catalog(tmp_path, {"ok.yaml": BASE})
    assert cat.names == ("ok",) and broken(cat) == {"dangling.yaml": ("dangling",
                                                                      "InvalidMVDefinition")}
    assert "cannot read the MV definition" in str(cat.broken[0].error)


STEMS = st.sampled_from(["a", "b", "c", "A", "d", "bad-x", "e"])
BODIES = st.sampled_from(["good", "chained", "garbage", "named_a", "bad_mode", "loop"])
KINDS = {"good": BASE, "chained": {**BASE, "upstream": "a/downstream_mv"}, "garbage": None,
         "named_a": {**BASE, "name": "a"}, "bad_mode": {**BASE, "mode": "x"},
         "loop": {**BASE, "upstream": "b/downstream_mv"}}


@settings(max_examples=200)
@given(st.lists(st.tuples(STEMS, BODIES), max_size=7, unique_by=lambda t: t[0]),
       st.sampled_from(["z1", "z2"]))
def test_a_broken_file_never_takes_others_down(files, extra) -> None:
    """Whatever the catalog holds, adding a broken file under a fresh name changes nothing
    else; each file ends healthy or broken exactly once; healthy names are unique."""
    sources = [Source(f"/mvs/{stem}.yaml", KINDS[kind]) for stem, kind in files]
    s = Settings("/wh")
    cat = catalog_of(sources, s)
    with_bad = catalog_of([*sources, Source(f"/mvs/{extra}.yaml", "not a mapping")], s)
    assert with_bad.definitions == cat.definitions
    assert (with_bad.lineage.reads, with_bad.lineage.order) == (cat.lineage.reads, cat.names)
    assert {(b.name, b.source, str(b.error)) for b in cat.broken} \
        < {(b.name, b.source, str(b.error)) for b in with_bad.broken}
    assert sorted([*cat.sources.values(), *(b.source for b in cat.broken)]) \
        == sorted(x.path for x in sources)
    lowered = [n.lower() for n in cat.names]
    assert len(lowered) == len(set(lowered))


def test_one_mv_loader_takes_a_folder_of_one_and_refuses_a_folder_of_many(tmp_path) -> None:
    """A script serving one MV reads a folder's only MV; of several it guesses none."""
    write(tmp_path, "a.yaml", BASE)
    s = load_settings({"BACKFILL_WAREHOUSE": str(tmp_path), "BACKFILL_MV_DIR": str(tmp_path)})
    assert load_mv_definition(s).name == "a"
    write(tmp_path, "b.yaml", BASE)
    with pytest.raises(UnknownMV, match="holds 2 healthy MVs \\(a, b\\).*BACKFILL_MV_CONFIG"):
        load_mv_definition(s)


def test_check_command_lists_waves_and_broken(tmp_path, capsys, monkeypatch) -> None:
    cat, wh = folder_catalog(tmp_path, {
        "a.yaml": BASE, "b.yaml": {**BASE, "upstream": "a/downstream_mv", "mode": "no_shuffle"},
        "c.yaml": {**BASE, "upstream": "x/downstream_mv"}, "x.yaml": {**BASE, "mode": "?"}})
    assert describe(cat).splitlines() == [
        f"wave 0: a (snapshot) reads {wh}/upstream",
        f"wave 0: c (snapshot) reads {wh}/x/downstream_mv",
        "  reads the output of broken MV x as it last was",
        "wave 1: b (no_shuffle) reads MV a",
        f"broken: x ({tmp_path}/mvs/x.yaml): InvalidMVDefinition: MV definition 'x' is invalid: "
        "mode '?' is not one of snapshot, arrangement, no_shuffle",
    ]
    monkeypatch.setenv("BACKFILL_WAREHOUSE", wh)
    assert main([str(tmp_path / "mvs")]) == 1 and "broken: x" in capsys.readouterr().out
    (tmp_path / "mvs" / "x.yaml").unlink()
    assert main([str(tmp_path / "mvs")]) == 0
