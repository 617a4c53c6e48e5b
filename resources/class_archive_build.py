"""Builds the driver JVM's class archive (``make classes``): a session that runs typical work
with ``-XX:ArchiveClassesAtExit``; every later session of this venv starts from it
(resources/class_archive.py says where it lives and how a session uses it)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager

from resources.class_archive import ENV_CLASS_ARCHIVE, chosen_path
from resources.settings import load_settings
from resources.spark import get_spark

DUMP_SECONDS = 300  # the JVM writes the archive as it exits (~190 MB)


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
    out = subprocess.run([sys.executable, "-m", "resources.class_archive_build", "--dump", tmp],
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


@contextmanager
def _ticking(what: str, since: float):
    """On a terminal, the seconds spent so far, rewritten in place every second (a person
    watching `make demo` sees it move); nothing when the output is a log."""
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(1.0):
            print(f"\r  {what}: {time.monotonic() - since:.0f} s", end="", flush=True)

    ticker = threading.Thread(target=tick, daemon=True)
    if sys.stdout.isatty():
        ticker.start()
    try:
        yield
    finally:
        stop.set()
        if ticker.is_alive():
            ticker.join()
            print("\r", end="")


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
    if args.force or not os.path.isfile(path):
        print("building the driver JVM's class archive (once per pyspark version, about 75 s; "
              "every later Spark session starts ~4 s sooner)", flush=True)
    with _ticking("class archive", t0):
        made = build(path, force=args.force)
    print(f"class archive {'written' if made else 'present'}: {path}"
          + (f" ({time.monotonic() - t0:.0f} s)" if made else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
