"""The barrier sensor: each new upstream version becomes one run per configured vnode range.

Evaluating it never starts a JVM: it reads two Delta versions (a few ms each). Its cursor is the
last upstream version handed out. While some vnode is unfinished it keeps asking for barriers
even when the upstream is idle (a backfill must progress without writes), keyed by the progress
table's version so the same state never yields two runs.
"""


import datetime
import json

import dagster as dg

from backfill_assets import mv_store
from backfill_assets.core.mv_definition import MVDefinition
from backfill_assets.partitions import range_tags, vnode_ranges
from resources.mv import mv_tables
from resources.settings import Settings

STALE_AFTER = datetime.timedelta(minutes=30)


def build_barrier_sensor(d: MVDefinition, settings: Settings, job_name: str,
                         ranges: int) -> dg.SensorDefinition:
    @dg.sensor(name="upstream_barrier_sensor", job_name=job_name, minimum_interval_seconds=5,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="Turns each new upstream Delta version into backfill runs.")
    def upstream_barrier_sensor(context: dg.SensorEvaluationContext):
        tables = mv_tables(d, settings)
        upstream = mv_store.open_table(tables.upstream, tables.storage_options)
        if upstream is None:
            return dg.SkipReason(f"upstream {tables.upstream} does not exist yet")
        version = upstream.version()
        cursor = json.loads(context.cursor) if context.cursor else {}
        progress = mv_store.open_table(tables.progress, tables.storage_options)
        unfinished = progress is None or _unfinished(progress, d.vnode_count)
        if version == cursor.get("version") and not unfinished:
            return dg.SkipReason(f"no new upstream version after {version}; MV is finished")
        state = progress.version() if progress is not None else -1
        requests = [
            dg.RunRequest(
                run_key=f"{d.name}:v{version}:p{state}:{first}-{last}",
                run_config={"ops": {"vnode_backfill": {"config": {"barrier_version": version}}}},
                tags=range_tags(first, last, d.vnode_count),
            )
            for first, last in vnode_ranges(d.vnode_count, ranges)
            if not _in_flight(context.instance, job_name, range_tags(first, last, d.vnode_count))
        ]
        context.update_cursor(json.dumps({"version": version, "progress": state}))
        return requests

    return upstream_barrier_sensor


def _unfinished(progress, vnode_count: int) -> bool:
    rows = mv_store.read_rows(progress, None, ["backfill_finished"])
    return rows.num_rows < vnode_count or not all(rows["backfill_finished"].to_pylist())


def _in_flight(instance: dg.DagsterInstance, job_name: str, tags: dict[str, str]) -> bool:
    """A run for this vnode range is queued or running: wait for it (never overlap ranges).

    Only runs created in the last STALE_AFTER count: a run whose process was killed stays
    STARTED in the instance (unless run monitoring is on), and must not block its range forever.
    """
    statuses = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED,
                dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]
    since = datetime.datetime.now(datetime.timezone.utc) - STALE_AFTER
    return bool(instance.get_run_records(
        dg.RunsFilter(job_name=job_name, statuses=statuses, tags=tags, created_after=since),
        limit=1))
