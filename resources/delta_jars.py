"""Delta Lake's JVM jars for the platform's Spark sessions: fetched once, checked, kept in the
virtual environment.

Why not ``spark.jars.packages`` or delta-spark's ``configure_spark_with_delta_pip``: both
resolve the jars through Ivy when a session starts, so every session (a barrier, a sensor's
run, a test) would reach Maven Central at run time, and a machine without it could not start
one. Instead ``make env`` runs ``python -m resources.delta_jars fetch``: Maven copies the jars
named by ``resources/maven/pom.xml`` into ``<venv>/share/backfill-assets/delta-jars``, each
jar's SHA-256 is checked against ``resources/maven/delta-jars.sha256``, and sessions list them
in ``spark.jars`` (the driver and, on a cluster, every executor load them from there).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

from backfill_assets.core.errors import BackfillError

HERE = os.path.dirname(os.path.abspath(__file__))
POM = os.path.join(HERE, "maven", "pom.xml")
MANIFEST = os.path.join(HERE, "maven", "delta-jars.sha256")
DELTA_SQL_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Delta-Spark replays a log in 50 partitions and lists files for VACUUM in 10,000 tasks
    # by default: a VACUUM of a small table then spends much of its time scheduling tasks
    # on a few cores. The platform's own reads do not go through either.
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
}


class DeltaJarsMissing(BackfillError):
    """Delta's jars are not in this environment (or not the pinned ones)."""


def jars_dir() -> str:
    """Beside the interpreter's packages: the jars belong to this venv's pyspark."""
    return os.path.join(sys.prefix, "share", "backfill-assets", "delta-jars")


def pinned() -> dict[str, str]:
    """Jar file name -> its SHA-256, as the manifest pins them."""
    with open(MANIFEST, encoding="utf-8") as f:
        return {name: digest for digest, name in (line.split() for line in f if line.strip())}


def jar_paths(folder: str | None = None) -> list[str]:
    """The pinned jars' paths; DeltaJarsMissing (saying what to run) when one is absent."""
    folder = folder or jars_dir()
    missing = [n for n in pinned() if not os.path.isfile(os.path.join(folder, n))]
    if missing:
        raise DeltaJarsMissing(
            f"Delta's jars are missing from {folder} ({', '.join(missing[:3])}...): run "
            "`make env` (it fetches them with Maven once; nothing is fetched at run time)")
    return [os.path.join(folder, n) for n in sorted(pinned())]


def session_conf() -> dict[str, str]:
    """What a classic session (local or cluster) needs for Delta: the jars, its SQL extension
    and its catalog. A Spark Connect server takes the same at its own start."""
    return {"spark.jars": ",".join(jar_paths()), **DELTA_SQL_CONF}


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check(folder: str) -> list[str]:
    """The pinned jars whose bytes in ``folder`` differ from the manifest (or are absent), and
    any jar there the manifest does not name."""
    want = pinned()
    wrong = [n for n, d in want.items() if not os.path.isfile(os.path.join(folder, n))
             or _sha256(os.path.join(folder, n)) != d]
    extra = [n for n in os.listdir(folder) if n.endswith(".jar") and n not in want]
    return wrong + [f"{n} (not pinned)" for n in extra]


def fetch(folder: str | None = None, mvn: str = "mvn") -> str:
    """Copy the pinned jars into ``folder`` with Maven (skipped when they are there and
    check out), verify them, and return the folder."""
    folder = folder or jars_dir()
    if os.path.isdir(folder) and not check(folder):
        return folder
    staging = tempfile.mkdtemp(prefix="delta-jars-")
    cmd = [mvn, "-B", "-q", "-C", "-f", POM, "dependency:copy-dependencies",
           "-DincludeScope=runtime", f"-DoutputDirectory={staging}"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise DeltaJarsMissing(f"`{mvn}` is not installed: install Maven (apt-get install "
                               "maven) and run `make env` again") from None
    if out.returncode != 0:
        raise DeltaJarsMissing(
            f"Maven could not fetch Delta's jars (is Maven Central reachable?): "
            f"{' '.join(cmd)} exited {out.returncode}:\n{(out.stdout + out.stderr)[-3000:]}")
    wrong = check(staging)
    if wrong:
        raise DeltaJarsMissing(f"the jars Maven fetched differ from {MANIFEST}: {wrong}")
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    shutil.move(staging, folder)
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fetch and check Delta's jars for Spark.")
    parser.add_argument("command", choices=["fetch", "check", "path"])
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            print(f"Delta jars: {fetch()}")
        elif args.command == "check":
            wrong = check(jars_dir()) if os.path.isdir(jars_dir()) else ["(no folder)"]
            print("Delta jars: " + ("ok" if not wrong else f"wrong: {wrong}"))
            return 1 if wrong else 0
        else:
            print(jars_dir())
    except DeltaJarsMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
