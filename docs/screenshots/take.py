"""Screenshots of the main UI views after `make demo`, with headless Chromium (Debian's package).

    make demo && make screenshots        # = .venv/bin/python -m docs.screenshots.take

Starts `dagster dev` over the demo's platform (the settings `make demo` left in demo.env and
a copy of its DAGSTER_HOME, so the screenshots change nothing) on a free loopback port, with
the barrier sensor held still (`quiet`, see jobs/dagster_dev.py), saves one PNG per view next
to this file, and stops the server. Regenerate them whenever the UI or the metadata changes.
`--env FILE --home DIR --out DIR` shoot another platform (e.g. one caught mid-backfill).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from jobs.dagster_dev import ROOT, dagster_dev, graphql

HERE = os.path.dirname(os.path.abspath(__file__))
DEMO_ENV = os.path.join(ROOT, "demo.env")
LOCATION = "__repository__@backfill_assets"
LATEST_JOB_RUN = """query Runs($job: String!) { runsOrError(filter: {pipelineName: $job}, limit: 1)
  { ... on Runs { results { runId } } } }"""


def views(env: dict[str, str]) -> dict[str, str]:
    """File name -> path in the UI (what README shows, in reading order). Over a folder
    catalog (the demo's): the global lineage (every MV's group and what reads what), the
    per-MV views of its first MV (`orders_mv` in the demo) under its prefix, and the Overview
    of its aggregate MV when it has one; over one MV, that MV's group and unprefixed keys."""
    folder = env.get("BACKFILL_MV_DIR")
    names = sorted(os.path.splitext(n)[0] for n in os.listdir(folder)
                   if n.endswith((".yaml", ".yml"))) if folder else []
    mv = "orders_mv" if "orders_mv" in names else (names[0] if names else "")
    at = f"/assets/{mv}/" if mv else "/assets/"
    out = {
        "lineage.png": "/asset-groups" if mv else f"/locations/{LOCATION}/asset-groups/backfill",
        "mv_partitions.png": f"{at}downstream_mv?view=partitions",
        "progress_partitions.png": f"{at}backfill_progress?view=partitions",
        "mv_overview.png": f"{at}downstream_mv",
        "mv_events.png": f"{at}downstream_mv?view=events",
        "mv_progress_check.png": f"{at}downstream_mv?view=checks&checkDetail=backfill_finished",
        "mv_oracle_check.png": f"{at}downstream_mv?view=checks&checkDetail=matches_oracle",
        "controls_launchpad.png": f"/locations/{LOCATION}/jobs/set_controls_job/playground",
        "runs.png": "/runs",
        "timeline.png": "/overview/activity/timeline",
    }
    aggregate = [n for n in names if _is_aggregate(os.path.join(folder, n))]
    if aggregate:
        out["aggregate_overview.png"] = f"/assets/{aggregate[0]}/downstream_mv"
    return out


def _is_aggregate(stem: str) -> bool:
    """Whether the definition file (`stem` + .yaml/.yml) declares an aggregate MV."""
    import yaml

    for path in (stem + ".yaml", stem + ".yml"):
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                body = yaml.safe_load(f) or {}
            return bool(body.get("aggregates") or body.get("group_by"))
    return False


class ScreenshotsNeedTheDemo(RuntimeError):
    """There is no demo state to show: run `make demo` first."""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("no Chromium found: `apt-get install chromium` (Debian) and rerun")


def platform_env(path: str) -> dict[str, str]:
    """The environment `make ui` would serve: the settings file over this process's env."""
    if not os.path.exists(path):
        raise ScreenshotsNeedTheDemo(f"{path} is missing: run `make demo` first")
    env = dict(os.environ)
    with open(path, encoding="utf-8") as f:
        for line in f:
            if "=" in line and not line.startswith("#"):
                key, value = line.rstrip("\n").split("=", 1)
                env[key] = shlex.split(value)[0] if value else ""
    return env


def shoot(browser: str, url: str, path: str, width: int = 1600, height: int = 1000) -> None:
    """One PNG of `url` once the page has settled (virtual time lets its queries finish)."""
    cmd = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--window-size={width},{height}", "--virtual-time-budget=20000",
           f"--screenshot={path}", url]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    print(f"  {os.path.relpath(path, ROOT)}  <- {url}")


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--env", default=DEMO_ENV, help="settings file (default: demo.env)")
    args.add_argument("--home", default=os.environ.get("DAGSTER_HOME") or
                      os.path.join(ROOT, ".dagster_home"), help="the DAGSTER_HOME to show")
    args.add_argument("--out", default=HERE, help="folder for the PNGs")
    opts = args.parse_args(argv)
    browser = chromium()
    env = platform_env(opts.env)
    with tempfile.TemporaryDirectory(prefix="screenshots_home_") as home:
        shutil.copytree(opts.home, home, dirs_exist_ok=True)
        env["DAGSTER_HOME"] = home
        return _shoot_all(browser, env, opts.out)


def _shoot_all(browser: str, env: dict[str, str], out: str) -> int:
    os.makedirs(out, exist_ok=True)
    with dagster_dev(env, os.path.join(out, ".dagster_dev.log"), quiet=True) as url:
        graphql(url, "mutation { setNuxSeen }")  # no "join the community" dialog on top
        shots = views(env)
        for job in ("backfill_job", "__ASSET_JOB", "__ephemeral_asset_job__"):
            runs = graphql(url, LATEST_JOB_RUN, {"job": job})["runsOrError"]["results"]
            if runs:  # the latest barrier: from backfill_job, else from the asset pages
                shots["barrier_run.png"] = f"/runs/{runs[0]['runId']}"
                break
        for name, path in shots.items():
            shoot(browser, url + path, os.path.join(out, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
