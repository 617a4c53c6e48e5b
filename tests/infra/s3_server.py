"""An S3-compatible server on loopback: moto's server mode (pinned dev dependency moto[server]).

Why moto: it is a pip wheel (nothing to download at test time), speaks the S3 REST API that
pyarrow, obstore and deltalake use, and honours ``If-None-Match: *`` on PUT (412 when the key
exists), which the commit protocol relies on; tests/infra/moto_atomic.py makes that check and
the write one step, as on S3. It keeps objects in memory: one server per test
session, one bucket, a fresh prefix per test.
"""

from __future__ import annotations

import os
import sys
import urllib.request
import uuid
from dataclasses import dataclass, field

from jobs.ports import free_port
from tests.infra import procs

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"
BUCKET = "backfill-test"
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class S3Server:
    """A running server: ``storage_options`` are deltalake-style (what deltalake, pyarrow via
    backfill_assets.storage.store.objects, and BACKFILL_STORAGE_OPTIONS' env vars carry)."""

    endpoint: str
    bucket: str
    server: procs.Server
    storage_options: dict[str, str] = field(default_factory=dict)

    @property
    def bucket_uri(self) -> str:
        return f"s3://{self.bucket}"

    def fresh_uri(self, name: str = "t") -> str:
        """A URI under a prefix no other test uses (moto's objects live as long as it does)."""
        return f"s3://{self.bucket}/{name}-{uuid.uuid4().hex[:10]}"

    def env(self) -> dict[str, str]:
        """Environment for a subprocess reaching this store through settings: the option values
        in AWS_* variables, and BACKFILL_STORAGE_OPTIONS naming them (secrets via EnvVar)."""
        import json

        return {**{k: v for k, v in self.storage_options.items()},
                "BACKFILL_STORAGE_OPTIONS": json.dumps({k: k for k in self.storage_options})}

    def stop(self) -> None:
        self.server.stop()


def _ready(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def start_s3_server(work_dir: str) -> S3Server:
    """Start moto's server on a free loopback port and create the test bucket in it."""
    port = free_port()
    endpoint = f"http://{procs.LOOPBACK}:{port}"
    server = procs.start("moto-s3", [sys.executable, "-m", "tests.infra.moto_atomic",
                                     "-H", procs.LOOPBACK, "-p", str(port)],
                         os.path.join(work_dir, "moto.log"), cwd=_REPO)
    server.wait_until(lambda: _ready(endpoint), timeout=60)
    options = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
        "AWS_ALLOW_HTTP": "true",
    }
    req = urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT")
    try:
        urllib.request.urlopen(req, timeout=10).close()
    except BaseException:
        server.stop()
        raise
    return S3Server(endpoint, BUCKET, server, options)
