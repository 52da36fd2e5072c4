"""The kubelet's read-only HTTPS endpoint for `kubectl logs`: the apiserver proxies
``GET /containerLogs/<ns>/<pod>/<container>?follow=&previous=&tailLines=`` to it (the port is each
node's ``status.daemonEndpoints.kubeletEndpoint``). Serves the log files the pod workers write."""

from __future__ import annotations

import http.server
import logging
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from trtforge_dev.testbed.paths import StatePaths
from trtforge_dev.testbed.podlogs import PodLogError, log_name, pod_log_dir

log = logging.getLogger(__name__)

Running = Callable[[str, str, str], bool]  # (namespace, pod, container) -> still running


def tail_lines(data: bytes, n: int | None) -> bytes:
    """The last `n` lines of `data` (all when n is None)."""
    if n is None:
        return data
    if n <= 0:
        return b""
    lines = data.splitlines(keepends=True)
    return b"".join(lines[-n:])


def _handler(paths: StatePaths, running: Running, stopping: threading.Event) -> type:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, format: str, *args: object) -> None:
            log.debug(format, *args)

        def _fail(self, code: int, msg: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(msg.encode())

        def do_GET(self) -> None:
            url = urlparse(self.path)
            if url.path in ("/healthz", "/readyz"):
                return self._fail(200, "ok")
            parts = url.path.strip("/").split("/")
            if len(parts) != 4 or parts[0] != "containerLogs":
                return self._fail(
                    404, f"{url.path} is not served by the emulated kubelet (only containerLogs)"
                )
            _, ns, pod, container = parts
            q = {k: v[-1] for k, v in parse_qs(url.query).items()}
            previous = q.get("previous") == "true"
            try:
                f = pod_log_dir(paths, ns, pod) / log_name(container, previous)
            except PodLogError as e:
                return self._fail(404, str(e))
            if not f.is_file():
                return self._fail(
                    404, f"container {container} of {ns}/{pod} has no {'previous ' if previous else ''}log"
                )
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            n = int(q["tailLines"]) if q.get("tailLines", "").lstrip("-").isdigit() else None
            self._stream(f, n, follow=q.get("follow") == "true" and not previous, key=(ns, pod, container))

        def _stream(self, f: Path, n: int | None, follow: bool, key: tuple[str, str, str]) -> None:
            with f.open("rb") as fh:
                self.wfile.write(tail_lines(fh.read(), n))
                self.wfile.flush()
                while follow and not stopping.is_set():
                    chunk = fh.read()
                    if chunk:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                    elif not running(*key):
                        return
                    else:
                        time.sleep(0.2)

    return Handler


class LogServer(threading.Thread):
    def __init__(
        self, paths: StatePaths, port: int, cert: Path, key: Path, running: Running, stopping: threading.Event
    ) -> None:
        super().__init__(name="kubelet-logs", daemon=True)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _handler(paths, running, stopping))
        self.server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)

    def run(self) -> None:
        self.server.serve_forever(poll_interval=0.5)

    def stop(self) -> None:
        self.server.shutdown()
