"""Every `dagster` command the README and docs/OPERATING.md give fits the demo's platform.

Why: the docs once gave a range of `000`..`127` (keys of 256 vnodes) while the demo has 64:
the command failed as written and left a run that wedged the sensor. Each command is read from
the docs as they are (bash blocks, line continuations joined, and inline code), and checked
against the definitions module loaded with the demo's settings (64 vnodes, `jobs/configs/
mv.yaml`): the job exists, its `-c` file exists and is valid run config for it, every partition
key it names (range tags, `--partition-range`) exists, and every selected asset exists. Nothing
runs (no JVM): `tests/test_readme.py` runs the README's blocks after a real demo.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys

import dagster as dg
import pytest
import yaml
from dagster._core.definitions.reconstruct import ReconstructableJob

from jobs.dagster_dev import ROOT
from tests.test_readme import FENCE

DOCS = ("README.md", os.path.join("docs", "OPERATING.md"))
MODULE = "backfill_assets.definitions"
DEMO_VNODES = 64
INLINE = re.compile(r"`(dagster [^`]+)`")
RANGE_TAGS = ("dagster/asset_partition_range_start", "dagster/asset_partition_range_end")


def commands() -> list[list[str]]:
    """Every `dagster job execute` / `dagster asset materialize` of the docs, as argv after
    `dagster` (`$D` expanded as the docs set it)."""
    found = []
    for doc in DOCS:
        with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
            text = f.read()
        lines = [b.replace("\\\n", " ") for kind, b in
                 ((m.group(1), m.group(2)) for m in FENCE.finditer(text)) if kind == "bash"]
        shell = [line.split(" #")[0] for b in lines for line in b.splitlines()]
        inline = [m.group(1).replace("\n", " ") for m in INLINE.finditer(text)]
        for line in shell + inline:
            line = line.replace("$D", f"-m {MODULE}")
            if "<" in line or "..." in line.replace("--partition-range", "").split("...")[0]:
                continue  # a placeholder (`-j <job>`, `dagster job execute ...`)
            argv = shlex.split(line[line.find("dagster "):]) if "dagster " in line else []
            if argv[1:3] in (["job", "execute"], ["asset", "materialize"]) and \
                    ("-j" in argv or "--select" in argv):
                found.append(argv[1:])
    return found


@pytest.fixture
def demo_defs(monkeypatch, tmp_path) -> dg.Definitions:
    """The definitions module as `make ui` / `dagster job execute` load it with one MV (the
    setting the docs' one-MV commands are for)."""
    yield from _loaded(monkeypatch, tmp_path, "BACKFILL_MV_CONFIG",
                       os.path.join(ROOT, "jobs", "configs", "mv.yaml"))


@pytest.fixture
def catalog_defs(monkeypatch, tmp_path) -> dg.Definitions:
    """The same after `make demo`: its catalog of three MVs."""
    yield from _loaded(monkeypatch, tmp_path, "BACKFILL_MV_DIR",
                       os.path.join(ROOT, "jobs", "configs", "mvs"))


def _loaded(monkeypatch, tmp_path, variable: str, value: str):
    monkeypatch.setenv("BACKFILL_WAREHOUSE", str(tmp_path / "warehouse"))
    monkeypatch.setenv("BACKFILL_VNODE_COUNT", str(DEMO_VNODES))
    for other in ("BACKFILL_MV_CONFIG", "BACKFILL_MV_DIR"):
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(variable, value)
    sys.modules.pop(MODULE, None)
    try:
        yield __import__(MODULE, fromlist=["defs"]).defs
    finally:
        sys.modules.pop(MODULE, None)
        ReconstructableJob.get_definition.cache_clear()
        ReconstructableJob.get_repository_definition.cache_clear()


def _option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def _check(argv: list[str], defs: dg.Definitions, keys: set[str]) -> list[str]:
    """What is wrong with one command (nothing: [])."""
    wrong = []
    named = [_option(argv, "--partition-range")] if "--partition-range" in argv else []
    tags = json.loads(_option(argv, "--tags") or "{}")
    named += [tags[t] for t in RANGE_TAGS if t in tags]
    wrong += [f"partition key {k!r} is not one of the demo's" for r in named
              for k in (r.split("...") if r and "..." in r else [r]) if k not in keys]
    if "--select" in argv:
        assets = {k.to_user_string() for k in defs.resolve_all_asset_keys()}
        wrong += [f"no asset {a!r}" for a in _option(argv, "--select").split(",")
                  if a not in assets]
        return wrong
    job_name = _option(argv, "-j")
    try:
        job = defs.resolve_job_def(job_name)
    except dg.DagsterInvariantViolationError:
        return wrong + [f"no job {job_name!r}"]
    config = _option(argv, "-c")
    if config is not None:
        with open(os.path.join(ROOT, config), encoding="utf-8") as f:
            run_config = yaml.safe_load(f)
        try:
            dg.validate_run_config(job, run_config)
        except dg.DagsterInvalidConfigError as exc:
            wrong.append(f"{config} is not valid config of {job_name}: {exc}")
    return wrong


def test_every_documented_command_fits_the_demo(demo_defs, catalog_defs):
    """Each command fits one MV's platform or the demo's catalog (the docs give both)."""
    found = commands()
    assert len(found) >= 12, found  # the docs' commands were all read
    keys = {str(v).zfill(2) for v in range(DEMO_VNODES)}
    problems = {" ".join(argv): wrong for argv in found
                if (wrong := _check(argv, demo_defs, keys))
                and _check(argv, catalog_defs, keys)}
    assert not problems, problems


def test_the_check_catches_the_commands_that_failed_as_written(demo_defs):
    """The issue's command (keys of 256 vnodes) and a wrong job or config are caught."""
    keys = {str(v).zfill(2) for v in range(DEMO_VNODES)}
    tags = json.dumps(dict(zip(RANGE_TAGS, ("000", "127"), strict=True)))
    bad = [["job", "execute", "-m", MODULE, "-j", "backfill_job", "--tags", tags],
           ["asset", "materialize", "-m", MODULE, "--select", "downstream_mv",
            "--partition-range", "000...127"],
           ["job", "execute", "-m", MODULE, "-j", "no_such_job"],
           ["job", "execute", "-m", MODULE, "-j", "reset_mv_job", "-c",
            "jobs/configs/pause.yaml"]]
    assert all(_check(argv, demo_defs, keys) for argv in bad)


def test_make_ui_finds_no_instance_file_to_warn_about():
    """`dagster dev` warns at every start when the current folder holds a dagster.yaml that is
    not DAGSTER_HOME's; `make ui` runs from the repository root, so the project's instance
    config lives in deploy/ and the Makefile copies it from there."""
    assert not any(os.path.exists(os.path.join(ROOT, n)) for n in ("dagster.yaml", "dagster.yml"))
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
        assert "$(DAGSTER_HOME)/dagster.yaml: deploy/dagster.yaml" in f.read()


def test_operating_commands_name_their_mv(catalog_defs):
    """docs/OPERATING.md runs against the demo's catalog of several MVs, where a job run
    that names no MV is refused: each of its commands (but the upstream's load) names one
    of the catalog's MVs by tag or config."""
    with open(os.path.join(ROOT, "docs", "OPERATING.md"), encoding="utf-8") as f:
        text = f.read()
    names = {k.path[0] for k in catalog_defs.resolve_all_asset_keys() if len(k.path) == 2}
    names.add("all")  # every MV, where the job allows it (follower_job, verify_job, ...)
    lines = re.findall(r"dagster (?:job execute|asset materialize)[^\n`]*",
                       text.replace("\\\n", " "))
    unnamed = []
    for line in lines:
        argv = shlex.split(line.split(" #")[0])
        if _option(argv, "-j") in ("upstream_load_job", None) and "--select" not in argv:
            continue
        tags = json.loads(_option(argv, "--tags") or "{}")
        config = _option(argv, "-c")
        mv = tags.get("backfill/mv")
        if mv is None and config:
            with open(os.path.join(ROOT, config), encoding="utf-8") as f:
                mv = re.search(r"\bmv: (\w+)", f.read())
            mv = mv and mv.group(1)
        if "--select" in argv:
            mv = _option(argv, "--select").split("/")[0]
        if mv not in names:
            unnamed.append(line)
    assert len(lines) >= 12 and not unnamed, unnamed
