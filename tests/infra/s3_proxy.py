"""An S3-compatible endpoint WITHOUT conditional writes: a loopback proxy in front of moto.

Why: stores that predate conditional writes (S3 before August 2024, older MinIO/Ceph, some
appliances) accept ``PUT`` with ``If-None-Match: *`` and simply overwrite. No pip-installable
server behaves like that, so this real HTTP server forwards every request to the moto server
unchanged except that it drops the ``If-None-Match`` header - exactly what such a store does.
The platform must refuse it by name before it writes
(storage.store.conditional.check_conditional_writes).
moto does not check request signatures, so dropping a signed header is accepted.
"""

from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from tests.infra import procs

DROPPED = "if-none-match"
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
        "proxy-connection", "content-length"}


@dataclass
class HeaderDroppingProxy:
    """A running proxy: ``endpoint`` replaces the moto endpoint in the storage options."""

    endpoint: str
    server: ThreadingHTTPServer
    thread: threading.Thread

    def storage_options(self, base: dict[str, str]) -> dict[str, str]:
        return {**base, "AWS_ENDPOINT_URL": self.endpoint}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def _handler(target: str) -> type[BaseHTTPRequestHandler]:
    parts = urlsplit(target)

    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            body = self._body()
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in _HOP and k.lower() != DROPPED}
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            finally:
                conn.close()
            self.send_response(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in _HOP:
                    self.send_header(k, v)
            length = resp.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _body(self) -> bytes | None:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = b""
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if size == 0:
                        self.rfile.readline()
                        return out
                    out += self.rfile.read(size)
                    self.rfile.readline()
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else None

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
            """Quiet: the tests read results, not access logs."""

    return Forward


def start_proxy(target_endpoint: str) -> HeaderDroppingProxy:
    """Serve on a free loopback port, forwarding to ``target_endpoint`` (http://host:port)."""
    server = ThreadingHTTPServer((procs.LOOPBACK, 0), _handler(target_endpoint))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="s3-proxy", daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    return HeaderDroppingProxy(f"http://{host}:{port}", server, thread)
