"""A class archive for the driver's JVM (Java's AppCDS), so a new Spark session starts faster.

Every process that starts a classic Spark session loads and verifies some 20,000 classes
before its first job: a `dagster job execute` of one barrier, each run the barrier sensor
starts, each child of the crash tests. A dynamic class archive written at the exit of a JVM
that ran typical work lets the next JVM map those classes instead: the session starts and
runs its first job markedly sooner.

The JVM checks the archive against its own build and class path and ignores one that does
not match (another JDK, other jars) without failing, so a stale archive costs only the time it
no longer saves. ``make env`` builds it (``python -m resources.class_archive_build``); the setting
``BACKFILL_SPARK_CLASS_ARCHIVE`` names another file, or ``off``. Only the local driver JVM
uses it: executors of a cluster start with their own class path, and a Spark Connect client
starts no JVM.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import version

ENV_CLASS_ARCHIVE = "BACKFILL_SPARK_CLASS_ARCHIVE"
OFF = ("off", "0", "none", "false", "no")


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
