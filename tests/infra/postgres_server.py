"""A throwaway PostgreSQL server on loopback for the Postgres-backed Dagster instance test.

Why Debian's server: it is part of this project's machine image (``postgresql-15``) and
``make postgres`` installs it with apt-get where it is missing. The server runs from a fresh
data folder with trust auth on 127.0.0.1 only, no unix socket, and dies with the test process.
PostgreSQL refuses to run as root, so under root it runs as the ``postgres`` system user that
the Debian package creates (the data folder is made theirs).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from jobs.ports import free_port
from tests.infra import procs

DB_NAME = "dagster"
DB_USER = "postgres"


class PostgresNotInstalled(RuntimeError):
    """No PostgreSQL server binaries: run `make postgres` (apt-get install postgresql)."""


def bin_dir() -> str:
    """The folder holding initdb and postgres (the newest Debian version, or PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    if initdb:
        return os.path.dirname(initdb)
    raise PostgresNotInstalled(
        "PostgreSQL server binaries (initdb, postgres) not found: run `make postgres` "
        "(apt-get install postgresql) and retry")


@dataclass
class PostgresServer:
    host: str
    port: int
    user: str
    db_name: str
    server: procs.Server
    data_dir: str

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.db_name}"

    def env(self) -> dict[str, str]:
        """The variables deploy/dagster.postgres.yaml reads."""
        return {"DAGSTER_PG_HOST": self.host, "DAGSTER_PG_PORT": str(self.port),
                "DAGSTER_PG_USER": self.user, "DAGSTER_PG_PASSWORD": "unused-trust-auth",
                "DAGSTER_PG_DB": self.db_name}

    def stop(self) -> None:
        self.server.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)


def start_postgres() -> PostgresServer:
    """initdb a fresh cluster, start it on a free loopback port, create the dagster database."""
    bins = bin_dir()
    as_user = "postgres" if os.geteuid() == 0 else None
    base = tempfile.mkdtemp(prefix="backfill-pg-")  # not under pytest's 0700 root-owned tmp
    data = os.path.join(base, "data")
    if as_user:
        import pwd

        pw = pwd.getpwnam(as_user)
        os.chown(base, pw.pw_uid, pw.pw_gid)
    subprocess.run([os.path.join(bins, "initdb"), "-D", data, "-U", DB_USER, "--auth=trust",
                    "-E", "UTF8", "--no-sync"], check=True, capture_output=True, user=as_user,
                   env=procs.clean_env({"LC_ALL": "C.UTF-8"}), timeout=120)
    port = free_port()
    server = procs.start("postgres", [
        os.path.join(bins, "postgres"), "-D", data, "-h", procs.LOOPBACK, "-p", str(port),
        "-k", "", "-c", "fsync=off", "-c", "max_connections=50",
        "-c", "shared_buffers=32MB",
    ], os.path.join(base, "postgres.log"), user=as_user, cwd=base)
    pg = PostgresServer(procs.LOOPBACK, port, DB_USER, DB_NAME, server, base)
    try:
        server.wait_until(lambda: _accepts(pg, "postgres"), timeout=60)
        _sql(pg, "postgres", f"CREATE DATABASE {DB_NAME}")
    except BaseException:
        pg.stop()
        raise
    return pg


def _accepts(pg: PostgresServer, db: str) -> bool:
    try:
        _sql(pg, db, "SELECT 1")
        return True
    except Exception:
        return False


def _sql(pg: PostgresServer, db: str, statement: str) -> None:
    import psycopg2  # dagster-postgres' driver

    conn = psycopg2.connect(host=pg.host, port=pg.port, user=pg.user, dbname=db,
                            connect_timeout=2)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(statement)
    finally:
        conn.close()
