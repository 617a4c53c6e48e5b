"""A commit's create-only PUT across a store that stops answering (storage/store/create_put.py).

Real parts: a closed loopback port for a store that never answers; moto's S3 server behind a
real loopback HTTP server that carries out the first create-only PUT and then hangs up without
answering, as a store whose link drops right after it wrote does (the host test cuts a real
link: tests/scale/test_hosts.py). And a store silent elsewhere in a run: the step fails led by
``StoreUnavailable`` (wiring/named_errors.py), not by the client's raw report.
"""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from backfill_assets.core.errors import StoreUnavailable
from backfill_assets.storage import objects
from backfill_assets.storage.store.create_put import put_create

OPTIONS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_ALLOW_HTTP": "true"}


def _store(endpoint: str, bucket: str):
    return objects._s3_store(bucket, objects.canonical_options(
        {**OPTIONS, "AWS_ENDPOINT_URL": endpoint}))


def test_a_store_that_never_answers_fails_the_commit_by_name():
    start = time.monotonic()
    with pytest.raises(StoreUnavailable, match="did not answer for 2 s.*rerun once"):
        put_create(_store("http://127.0.0.1:1", "b"), "t/_delta_log/1.json", b"x",
                   "s3://b/t/_delta_log/1.json", retry_seconds=2)
    assert time.monotonic() - start < 30


def _hanging_up_once(target: str) -> tuple[ThreadingHTTPServer, list[str]]:
    """A forwarder to ``target`` that hangs up on the first create-only PUT after moto
    carried it out; the requests it hung up on are listed."""
    parts, dropped = urlsplit(target), []

    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in ("connection", "content-length")}
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
            if self.command == "PUT" and "If-None-Match" in self.headers and not dropped:
                dropped.append(self.path)
                self.close_connection = True  # written, never answered
                return
            self.send_response(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in ("connection", "content-length", "transfer-encoding"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = do_HEAD = _forward

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, dropped


@pytest.mark.cluster
def test_a_commit_whose_answer_was_lost_is_found_landed(s3_server):
    """The retry finds the name taken by its own bytes: committed (True), not a lost race;
    a name holding another writer's bytes stays a lost race (False)."""
    server, dropped = _hanging_up_once(s3_server.endpoint)
    try:
        host, port = server.server_address[:2]
        store = _store(f"http://{host}:{port}", s3_server.bucket)
        key = f"lost-{time.monotonic_ns()}/_delta_log/00000000000000000001.json"
        assert put_create(store, key, b'{"ours": 1}', key) is True
        assert dropped == [f"/{s3_server.bucket}/{key}"]
        assert put_create(store, key, b'{"theirs": 1}', key) is False
        direct = _store(s3_server.endpoint, s3_server.bucket)
        from obstore import get

        assert bytes(get(direct, key).bytes()) == b'{"ours": 1}'
    finally:
        server.shutdown()
        server.server_close()


def test_a_store_gone_silent_mid_run_fails_the_step_by_name():
    """An op that meets a silent store elsewhere than a commit (obstore's raw GenericError, a
    real one from the closed port) fails its step led by StoreUnavailable, the cause kept."""
    import dagster as dg
    from obstore import put

    from backfill_assets.wiring.named_errors import named_first

    @named_first
    def op_body() -> None:
        put(_store("http://127.0.0.1:1", "b"), "k", b"x")

    with pytest.raises(dg.Failure, match="^StoreUnavailable: the object store did not") as got:
        op_body()
    assert type(got.value.__cause__).__name__ == "GenericError"

    @named_first
    def other() -> None:
        raise KeyError("not a store's")

    with pytest.raises(KeyError):
        other()
