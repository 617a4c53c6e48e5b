"""The UI in a browser: headless Chromium (Debian's package, driven by Playwright; `make test`
installs it where missing) over `dagster dev`, through four states of a small platform, each
view asserted as a user reads it.

1. mid-backfill (vnodes 0..3 finished, 4..5 in progress, 6..7 not started, verified): the MV's
   Overview leads with the latest barrier's figures, its Partitions tab says 4 materialized,
   `backfill_progress` 6, the lineage 50% / 75% filled, the checks a warning and a pass;
2. paused, with a barrier after the pause: the Overview says "paused", no vnode more started;
3. finished from the asset page: Materialize… for one vnode (one run), a set of vnodes and All
   (Dagster backfills), each ending Success; then 8/8 materialized, 100% filled;
4. after reset_mv_job: 0% filled, nothing materialized, no check result.
The sensor is recorded as stopped before the server starts (it must not run barriers under
the test); runs launched from the UI do run (`dagster_dev(launches=True)`).
"""

from __future__ import annotations

import re
import time

import dagster as dg
import pytest

from backfill_assets.upstream.writer import LoadParams, run_load
from backfill_assets.wiring.partitions import range_tags
from jobs.dagster_dev import dagster_dev, graphql
from jobs.ports import free_port
from jobs.workspace_runs import ASSET_JOB, run_in_workspace, stop_sensor
from tests.test_ui import VNODES, loaded, platform  # noqa: F401 - the fixture, shared

playwright = pytest.importorskip("playwright.sync_api")
CHROMIUM = "/usr/bin/chromium"
GROUP = "/locations/__repository__@backfill_assets/asset-groups/backfill"
BACKFILLS = """{ partitionBackfillsOrError(limit: 10) { ... on PartitionBackfills {
  results { id status numPartitions } } } }"""
RUNS = """{ runsOrError(limit: 20) { ... on Runs { results { runId status } } } }"""
DONE = {"COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED", "COMPLETED"}


class UI:
    """One browser page on the server, with the few moves the test needs."""

    def __init__(self, page, url: str) -> None:
        self.page, self.url = page, url

    def text(self, path: str, settle_ms: int = 2500) -> str:
        self.page.goto(self.url + path, wait_until="networkidle")
        self.page.wait_for_timeout(settle_ms)
        return self.page.inner_text("body")

    def metadata(self, path: str = "/assets/downstream_mv") -> dict[str, str]:
        """The Overview's metadata table: key -> value as the page prints them (three lines
        each: key, timestamp, value); `per_vnode` (the last) -> its table's rows."""
        lines = [x.strip() for x in self.text(path).splitlines() if x.strip()]
        i, out = lines.index("Key\tTimestamp\tValue") + 1, {}
        while i + 2 < len(lines) and lines[i] != "per_vnode":
            out[lines[i]] = lines[i + 2]
            i += 3
        if i < len(lines) and lines[i] == "per_vnode":
            end = lines.index("Lineage", i)
            out["per_vnode"] = "\n".join(x for x in lines[i + 2:end] if x != "Show schema")
        return out

    def partition_counts(self, asset: str) -> dict[str, int]:
        body = self.text(f"/assets/{asset}?view=partitions")
        return {k: int(n) for k, n in re.findall(r"(Materialized|Missing|Failed) \((\d+)\)",
                                                  body)}

    def filled(self, timeout_s: float = 30.0) -> dict[str, str]:
        """asset -> "N% filled" in the group's lineage list, once the MV's and the progress'
        nodes show it (a loaded machine draws the graph after the settle time: looked again
        until `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        while True:
            lines = [x.strip() for x in self.text(GROUP).splitlines() if x.strip()]
            out, current = {}, None
            for x in lines:
                if x in ("upstream_table", "replicated_state", "downstream_mv",
                         "backfill_progress"):
                    current = x
                elif current and x.endswith("% filled"):
                    out[current] = x
            if {"downstream_mv", "backfill_progress"} <= set(out) or \
                    time.monotonic() > deadline:
                return out

    def materialize(self, *vnodes: str) -> str:
        """Materialize… on downstream_mv with `vnodes` ticked (or "All"); the launch button's
        words ("Launch 1 run" or "Launch backfill")."""
        page = self.page
        page.goto(self.url + "/assets/downstream_mv", wait_until="networkidle")
        page.get_by_role("button", name="Materialize…").first.click()
        dialog = page.get_by_role("dialog")
        confirm = dialog.get_by_role("button", name="Confirm")
        confirm.or_(dialog.get_by_text("Partition selection")).first.wait_for()
        if confirm.count():  # "additional assets will be materialized": the multi-asset's
            confirm.click()
        if vnodes == ("All",):
            dialog.get_by_role("button", name="All", exact=True).click()
        else:
            dialog.get_by_text("Select a partition or create one").click()
            menu = page.get_by_role("menu").first
            for v in vnodes:
                menu.locator("span").filter(has_text=re.compile(f"^{v}$")).first.click()
            page.keyboard.press("Escape")
        launch = dialog.get_by_role("button", name=re.compile("^Launch"))
        words = launch.inner_text()
        launch.click()
        page.wait_for_timeout(2000)
        return words


def _wait(what: str, check, timeout: float = 420.0, every: float = 3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def _runs_done(url: str) -> bool:
    runs = graphql(url, RUNS)["runsOrError"]["results"]
    return all(r["status"] in ("SUCCESS", "FAILURE", "CANCELED") for r in runs)


def _backfill_ended(url: str, seen: set[str]) -> dict | None:
    for b in graphql(url, BACKFILLS)["partitionBackfillsOrError"]["results"]:
        if b["id"] not in seen and b["status"] in DONE:
            seen.add(b["id"])
            return b
    return None


@pytest.mark.slow
@pytest.mark.spark
def test_the_ui_tells_the_truth_in_every_state(spark, tmp_path, platform):  # noqa: F811
    env = platform
    settings, d, instance = loaded(env)
    stop_sensor(instance, "upstream_barrier_sensor")
    assert run_in_workspace(instance, ASSET_JOB, tags=range_tags(0, 3, VNODES),
                            asset_selection=set(_barrier_assets())).success
    assert run_in_workspace(instance, "backfill_job", tags=range_tags(4, 5, VNODES)).success
    assert run_in_workspace(instance, "verify_job").success

    with dagster_dev(env, str(tmp_path / "dagster_dev.log"), quiet=True, launches=True,
                     port=free_port()) as url, \
            playwright.sync_playwright() as pw:
        graphql(url, "mutation { setNuxSeen }")
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        ui = UI(browser.new_page(viewport={"width": 1600, "height": 1000}), url)

        # 1. mid-backfill
        meta = ui.metadata()
        assert meta["state"] == "backfilling" and meta["mode"] == d.mode
        assert (meta["vnodes_finished"], meta["vnodes_in_progress"],
                meta["vnodes_not_started"]) == ("4", "2", "2")
        assert 0 < float(meta["percent_done"]) < 100 and int(meta["mv_rows"]) > 0
        assert {"lag_versions", "lag_seconds", "rows_per_second", "eta", "per_vnode"} <= \
            set(meta)
        assert ui.partition_counts("downstream_mv") == {"Failed": 0, "Materialized": 4,
                                                        "Missing": 4}
        assert ui.partition_counts("backfill_progress")["Materialized"] == 6
        filled = ui.filled()
        assert filled["downstream_mv"] == "50% filled"
        assert filled["backfill_progress"] == "75% filled"
        checks = ui.text("/assets/downstream_mv?view=checks")
        assert "backfill_finished" in checks and "matches_oracle" in checks
        assert "Not evaluated" not in checks

        # 2. paused, and a barrier after the pause (a new upstream version)
        assert run_in_workspace(instance, "set_controls_job", run_config={"ops": {
            "set_controls": {"config": {"snapshot": "pause"}}}}).success
        run_load(settings.table_uri("upstream"), LoadParams(seed=6, versions=1,
                                                            changes_per_version=10),
                 vnode_count=VNODES)
        assert run_in_workspace(instance, "backfill_job").success
        meta = ui.metadata()
        assert meta["state"] == "paused" and meta["eta"] == "paused"
        assert ui.partition_counts("backfill_progress")["Materialized"] == 6  # none started
        assert ui.partition_counts("downstream_mv")["Materialized"] == 4
        assert "paused" in ui.text("/assets/downstream_mv?view=checks")

        # 3. resumed, then finished from the asset page: one vnode, a set, then All
        assert run_in_workspace(instance, "set_controls_job", run_config={"ops": {
            "set_controls": {"config": {"snapshot": "resume"}}}}).success
        assert ui.materialize("6") == "Launch 1 run"
        _wait("the run of vnode 6", lambda: _runs_done(url))
        assert ui.partition_counts("downstream_mv")["Materialized"] == 5
        seen: set[str] = set()
        for ticked in (("4", "5", "7"), ("All",)):
            assert ui.materialize(*ticked) == "Launch backfill"
            ended = _wait(f"the backfill of {ticked}", lambda: _backfill_ended(url, seen))
            assert ended["status"] == "COMPLETED_SUCCESS", ended
        assert "Success" in ui.text("/overview/backfills")
        meta = ui.metadata()
        assert meta["state"].startswith("finished") and meta["percent_done"] == "100"
        assert ui.partition_counts("downstream_mv") == {"Failed": 0, "Materialized": 8,
                                                        "Missing": 0}
        assert run_in_workspace(instance, "verify_job").success
        filled = ui.filled()
        assert filled["downstream_mv"] == filled["backfill_progress"] == "100% filled"

        # 4. after reset_mv_job: the statuses and check results are gone with the tables
        assert run_in_workspace(instance, "reset_mv_job", run_config={"ops": {"reset_mv": {
            "config": {"confirm": d.name}}}}).success
        assert ui.partition_counts("downstream_mv")["Materialized"] == 0
        assert ui.partition_counts("backfill_progress")["Materialized"] == 0
        filled = ui.filled()
        assert filled["downstream_mv"] == filled["backfill_progress"] == "0% filled"
        checks = ui.text("/assets/downstream_mv?view=checks")
        assert "Succeeded" not in checks and "Passed" not in checks
        browser.close()


def _barrier_assets() -> list[dg.AssetKey]:
    from backfill_assets.wiring.events import MV, PROGRESS, REPLICA

    return [MV, PROGRESS, REPLICA]  # arrangement mode: the replica is the barrier's too
