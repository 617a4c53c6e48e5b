"""A folder catalog loaded into Dagster: groups, prefixed keys, lineage edges, broken MVs shown,
jobs that address an MV, and a catalog of one keeping today's keys (no Spark here)."""

from __future__ import annotations

import dagster as dg
import pytest
import yaml

from backfill_assets.core.errors import InvalidMVDefinition, UnknownMV
from backfill_assets.definitions import build_definitions
from backfill_assets.wiring.keys import Served
from resources.settings import load_settings

ROW = {"upstream": "upstream", "primary_key": ["id"], "columns": ["id", "region", "qty"],
       "filter": "qty > 0", "vnode_count": 4}


def write(folder, name: str, body: object) -> None:
    (folder / name).write_text(body if isinstance(body, str) else yaml.safe_dump(body))


def folder_settings(tmp_path, files: dict[str, object], **env: str):
    mvs = tmp_path / "mvs"
    mvs.mkdir(exist_ok=True)
    for name, body in files.items():
        write(mvs, name, body)
    return load_settings({"BACKFILL_WAREHOUSE": str(tmp_path / "wh"),
                          "BACKFILL_MV_DIR": str(mvs), **env})


CHAIN = {
    "a.yaml": ROW,
    "b.yaml": {**ROW, "upstream": "a/downstream_mv", "mode": "no_shuffle"},
    "c.yaml": {**ROW, "upstream": "b/downstream_mv", "vnode_count": 2},
    "d.yaml": {**ROW, "filter": "qty > 5", "mode": "arrangement"},
}


def graph_of(defs: dg.Definitions):
    repo = defs.get_repository_def()
    return repo, repo.asset_graph


def test_folder_catalog_groups_keys_lineage_and_a_broken_mv(tmp_path) -> None:
    s = folder_settings(tmp_path, {**CHAIN, "bad.yaml": {**ROW, "mode": "sideways"},
                                   "also bad.yml": "name: [unclosed"})
    repo, graph = graph_of(build_definitions(s))
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    for mv in "abcd":
        assert {f"{mv}/downstream_mv", f"{mv}/backfill_progress", f"{mv}/replicated_state"} \
            <= keys
        assert graph.get(dg.AssetKey([mv, "downstream_mv"])).group_name == mv
    assert "tables/upstream" in keys and "upstream_table" not in keys  # one shared asset

    def parents(key: str) -> set[str]:
        return {p.to_user_string() for p in graph.get(dg.AssetKey.from_user_string(key))
                .parent_keys}

    assert parents("a/downstream_mv") == {"tables/upstream"}  # snapshot mode reads it
    assert parents("d/replicated_state") == {"tables/upstream"}  # arrangement: via its replica
    assert parents("b/downstream_mv") == {"a/downstream_mv"}  # the UI draws a -> b -> c
    assert parents("c/downstream_mv") == {"b/downstream_mv"}
    # partitions: each MV its own vnode count
    assert graph.get(dg.AssetKey(["c", "downstream_mv"])).partitions_def \
        .get_partition_keys() == ["0", "1"]
    assert len(graph.get(dg.AssetKey(["a", "downstream_mv"])).partitions_def
               .get_partition_keys()) == 4
    # its two checks each
    checks = {(c.asset_key.to_user_string(), c.name) for c in graph.asset_check_keys}
    assert ("c/downstream_mv", "matches_oracle") in checks
    assert ("c/downstream_mv", "backfill_finished") in checks
    # broken MVs: a group of their own, not materializable, the error in description and
    # metadata; the name that Dagster refuses is reduced to the file's stem
    bad = graph.get(dg.AssetKey(["bad", "downstream_mv"]))
    assert bad.group_name == "bad" and not bad.is_materializable
    assert "sideways" in bad.description and "InvalidMVDefinition" in bad.description
    assert "sideways" in bad.metadata["broken"].text
    also = graph.get(dg.AssetKey(["also_bad", "downstream_mv"]))
    assert "not valid YAML at line 1" in also.description
    jobs = {j.name for j in repo.get_all_jobs()}
    assert {"backfill_job", "verify_job", "set_controls_job", "reset_mv_job", "resnapshot_job",
            "maintain_job", "follower_job", "stop_follower_job", "start_follower_job"} <= jobs
    assert [s.name for s in repo.sensor_defs] == ["upstream_barrier_sensor"]


def test_a_catalog_of_one_keeps_todays_keys_and_names(tmp_path) -> None:
    """Dagster keys its history by asset key: an existing one-MV deployment keeps its own."""
    path = tmp_path / "mv.yaml"
    path.write_text(yaml.safe_dump({**ROW, "name": "orders"}))
    s = load_settings({"BACKFILL_WAREHOUSE": str(tmp_path / "wh"),
                       "BACKFILL_MV_CONFIG": str(path)})
    repo, graph = graph_of(build_definitions(s))
    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == {
        "upstream_table", "downstream_mv", "backfill_progress", "replicated_state"}
    assert graph.get(dg.AssetKey("downstream_mv")).group_name == "backfill"


def test_jobs_name_their_mv_or_refuse_by_name(tmp_path) -> None:
    s = folder_settings(tmp_path, {**CHAIN, "bad.yaml": {**ROW, "mode": "sideways"}})
    defs = build_definitions(s)
    controls = defs.get_job_def("set_controls_job")
    instance = dg.DagsterInstance.ephemeral()

    def run(mv: str | None, **tags: str):
        config = {"ops": {"set_controls": {"config": {"chunk_size": 7,
                                                      **({"mv": mv} if mv else {})}}}}
        return controls.execute_in_process(run_config=config, instance=instance, tags=tags,
                                           raise_on_error=False)

    unset = run(None)
    assert not unset.success and "several MVs" in _failure(unset) and "a, d, b, c" in \
        _failure(unset)
    unknown = run("zz")
    assert "UnknownMV" in _failure(unknown) and "its MVs are a, d, b, c" in _failure(unknown)
    broken = run("bad")
    assert "InvalidMVDefinition" in _failure(broken) and "sideways" in _failure(broken)
    # nothing written for a refused MV: no controls file under any MV's folder
    assert not (tmp_path / "wh").exists()
    ok = run("c")
    assert ok.success
    assert instance.get_run_by_id(ok.run_id).tags["backfill/mv"] == "c"
    by_tag = run(None, **{"backfill/mv": "b"})
    assert by_tag.success


def _failure(result) -> str:
    failed = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    return str(failed[0].event_specific_data.error) if failed else ""


def test_served_picks_one_or_all_and_a_catalog_of_one_defaults(tmp_path) -> None:
    from backfill_assets.wiring.catalog_assets import serve_folder
    from resources.catalog import load_catalog

    s = folder_settings(tmp_path, {**CHAIN, "bad.yaml": {**ROW, "mode": "sideways"}})
    srv, specs = serve_folder(load_catalog(s), s)
    assert [d.name for d, _ in srv.picks("all")] == ["a", "d", "b", "c"]  # barrier order
    assert srv.pick("b")[1].mv == dg.AssetKey(["b", "downstream_mv"])
    with pytest.raises(UnknownMV, match="several MVs"):
        srv.pick(None)
    with pytest.raises(InvalidMVDefinition, match="broken"):
        srv.pick("bad")
    assert [spec.key.to_user_string() for spec in specs] == ["tables/upstream"]
    one = Served.of_one(srv.definition("a"))
    assert one.pick(None)[1].mv == dg.AssetKey("downstream_mv")


def test_an_empty_or_all_broken_folder_still_loads(tmp_path) -> None:
    """No healthy MV: the code location loads (the broken one shown), jobs refuse by name."""
    s = folder_settings(tmp_path, {"bad.yaml": {**ROW, "mode": "sideways"}})
    defs = build_definitions(s)
    _, graph = graph_of(defs)
    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == {"bad/downstream_mv"}
    result = defs.get_job_def("verify_job").execute_in_process(
        instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert "serves no healthy MV" in _failure(result)
    tick = defs.get_sensor_def("upstream_barrier_sensor")(
        dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral()))
    assert isinstance(tick, dg.SkipReason) and "no MV" in tick.skip_message


def test_an_mv_waits_only_for_the_mvs_it_reads(tmp_path) -> None:
    """a -> b -> c, d beside a over the same upstream: a reader waits for an upstream MV due
    or in flight, never for a sibling's backfill (d due for many barriers must not hold b)."""
    from backfill_assets.wiring.catalog_sensor import ready_now
    from resources.catalog import load_catalog

    lineage = load_catalog(folder_settings(tmp_path, CHAIN)).lineage
    assert ready_now(lineage, ["a", "b", "c", "d"], []) == ["a", "d"]
    assert ready_now(lineage, ["b", "d"], []) == ["d", "b"]  # barrier order: d's wave first
    assert ready_now(lineage, ["b", "c"], []) == ["b"]
    assert ready_now(lineage, ["c"], ["b"]) == []  # b's barrier in flight: c after it
    assert ready_now(lineage, ["c"], ["a"]) == []  # through b
    assert ready_now(lineage, ["c", "d"], ["d"]) == ["c"]  # d in flight: itself only


JOIN = {"upstream": "upstream", "primary_key": ["id"], "vnode_count": 4,
        "joins": [{"table": "customers", "key": ["customer"], "on": {"name": "customer"},
                   "columns": ["segment"], "kind": "left"},
                  {"table": "a", "key": ["id"], "on": {"id": "id"}, "columns": ["region"]}],
        "group_by": ["segment", "region"], "aggregates": {"orders": "count(*)"}}


def test_a_join_mv_reads_its_dimensions_in_lineage(tmp_path) -> None:
    """A dimension is an upstream asset of the join MV: a shared external table, or another
    MV's output by its name (the way join/ resolves it), so the UI draws it and that MV's
    barrier runs first."""
    s = folder_settings(tmp_path, {"a.yaml": ROW, "j.yaml": JOIN})
    _, graph = graph_of(build_definitions(s))
    parents = {p.to_user_string() for p in graph.get(dg.AssetKey(["j", "downstream_mv"]))
               .parent_keys}
    assert parents == {"tables/upstream", "tables/customers", "a/downstream_mv"}
    from resources.catalog import load_catalog

    catalog = load_catalog(s)
    assert catalog.lineage.reads["j"] == ("a",) and catalog.names[0] == "a"
    assert catalog.upstreams["j"].endswith("/upstream")  # the fact stays the upstream
    assert "customers" in {k.rsplit("/", 1)[-1] for k in catalog.lineage.external}
