"""A class archive for the driver's JVM (Java's AppCDS), so a new Spark session starts faster.

Every process that starts a classic Spark session loads and verifies some 20,000 classes
before its first job: a `dagster job execute` of one barrier, each run the barrier sensor
starts, each child of the crash tests. A dynamic class archive written at the exit of a JVM
that ran typical work lets the next JVM map those classes instead. Measured on this 2-core
machine (Java 17, local[2]): the session starts in 6.7 s instead of 10.6 s, and its first job
takes 2.2 s instead of 4.0 s.

The JVM checks the archive against its own build and class path and ignores one that does
not match (another JDK, other jars) without failing, so a stale archive costs only the time it
no longer saves. ``make env`` builds it (``python -m resources.class_archive``); the setting
``BACKFILL_SPARK_CLASS_ARCHIVE`` names another file, or ``off``. Only the local driver JVM
uses it: executors of a cluster start with their own class path, and a Spark Connect client
starts no JVM.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version

ENV_CLASS_ARCHIVE = "BACKFILL_SPARK_CLASS_ARCHIVE"
OFF = ("off", "0", "none", "false", "no")
DUMP_SECONDS = 300  # the JVM writes the archive as it exits (~190 MB)


def default_path() -> str:
    """Beside the interpreter's packages: the archive belongs to this pyspark's jars."""
    return os.path.join(sys.prefix, "share", "backfill-assets",
                        f"spark-{version('pyspark')}-classes.jsa")


def chosen_path(raw: str | None) -> str | None:
    """The archive a setting names: unset = the default, ``off`` = none."""
    raw = (raw or "").strip()
    if raw.lower() in OFF:
        return None
    return os.path.abspath(os.path.expanduser(raw)) if raw else default_path()


def java_options(path: str | None) -> str:
    """The driver JVM's options that map ``path`` (nothing when it is absent); mismatches are
    not logged, since the JVM then runs as if the option were not given."""
    if not path or not os.path.isfile(path):
        return ""
    return f"-XX:SharedArchiveFile={path} -Xlog:cds=off -Xlog:cds+dynamic=off"


def _typical_work(spark) -> None:
    """What a barrier's driver does, in small: SQL expressions, a window, Arrow both ways
    (Python tasks), a join, a parquet write and a filtered read back."""
    import pyarrow as pa
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    df = spark.range(0, 2000, 1, 2).selectExpr(
        "id", "id % 7 AS k", "cast(id AS string) AS s", "id * 1.5 AS x",
        "timestamp_seconds(id) AS ts", "cast(id AS decimal(12, 2)) AS d", "id % 3 = 0 AS flag")
    w = Window.partitionBy("k").orderBy(F.col("id").desc())
    df.withColumn("rn", F.row_number().over(w)).where("rn <= 5").collect()
    df.mapInArrow(lambda batches: (b for b in batches), df.schema).groupBy("k").count().collect()
    spark.createDataFrame(pa.table({"k": list(range(7)), "v": ["a"] * 7})).join(
        df, "k").where("upper(v) = 'A' AND NOT flag").count()
    with tempfile.TemporaryDirectory() as folder:
        df.repartition(2, "k").sortWithinPartitions("k", "id").write.parquet(folder + "/t")
        spark.read.parquet(folder + "/t").where("id > 100").toArrow()


def _dump(path: str) -> None:
    """Child: run typical work in a session whose JVM writes ``path`` at exit; print its pid."""
    from resources.settings import load_settings
    from resources.spark import get_spark

    spark = get_spark(load_settings())
    _typical_work(spark)
    print(json.dumps({"jvm_pid": spark.sparkContext._jvm.ProcessHandle.current().pid()}),
          flush=True)
    spark.stop()


def build(path: str, force: bool = False) -> bool:
    """Write the archive at ``path`` (atomically: a half-written archive is never seen);
    False when it already exists and ``force`` is not set."""
    if os.path.isfile(path) and not force:
        return False
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    env = {**os.environ, ENV_CLASS_ARCHIVE: "off", "BACKFILL_SPARK_MASTER": "local[2]",
           "BACKFILL_SPARK_CONF": json.dumps(
               {"spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={tmp} "
                                                 "-Xlog:cds=off -Xlog:cds+dynamic=off"})}
    env.pop("BACKFILL_SPARK_REMOTE", None)
    out = subprocess.run([sys.executable, "-m", "resources.class_archive", "--dump", tmp],
                         env=env, capture_output=True, text=True, check=False)
    pid = next((json.loads(line)["jvm_pid"] for line in out.stdout.splitlines()
                if line.startswith('{"jvm_pid"')), None)
    if out.returncode != 0 or pid is None:
        raise RuntimeError(f"the class archive run failed (rc {out.returncode}):\n"
                           f"{out.stdout[-2000:]}{out.stderr[-2000:]}")
    deadline = time.monotonic() + DUMP_SECONDS
    while _alive(pid) and time.monotonic() < deadline:  # the JVM dumps as it exits
        time.sleep(0.2)
    if _alive(pid) or not os.path.isfile(tmp):
        raise RuntimeError(f"the JVM (pid {pid}) wrote no class archive at {tmp}")
    os.replace(tmp, path)
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the driver JVM's class archive.")
    parser.add_argument("--force", action="store_true", help="rebuild an existing archive")
    parser.add_argument("--dump", help=argparse.SUPPRESS)  # the child that runs the work
    args = parser.parse_args(argv)
    if args.dump:
        _dump(args.dump)
        return 0
    path = chosen_path(os.environ.get(ENV_CLASS_ARCHIVE))
    if path is None:
        print(f"{ENV_CLASS_ARCHIVE} is off: no class archive")
        return 0
    t0 = time.monotonic()
    made = build(path, force=args.force)
    print(f"class archive {'written' if made else 'present'}: {path}"
          + (f" ({time.monotonic() - t0:.0f} s)" if made else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
