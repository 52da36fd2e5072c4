"""httpGet, tcpSocket and exec probes with the kubelet's timing and thresholds."""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
import time
from collections.abc import Mapping
from typing import Any


def resolve_port(port: int | str, container: Mapping[str, Any]) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"probe port {port!r} is not a named port of container {container.get('name')!r}")


def http_get(
    host: str, port: int, path: str, scheme: str, headers: Mapping[str, str], timeout: float
) -> bool:
    """Success is a status in 200..399, as the kubelet judges it."""
    conn: http.client.HTTPConnection
    if scheme.upper() == "HTTPS":
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=ctx)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path or "/", headers=dict(headers))
        return 200 <= conn.getresponse().status < 400
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def tcp_connect(host: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def exec_in(pid: int, argv: list[str], env: Mapping[str, str], timeout: float) -> bool:
    """Run `argv` in the container's mount namespace (nsenter) with its env; success is exit 0."""
    try:
        r = subprocess.run(
            ["nsenter", "-t", str(pid), "-m", "--", *argv],
            env=dict(env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
        )
    except (subprocess.TimeoutExpired, OSError):
        return False
    return r.returncode == 0


class Prober:
    """One probe of one container: call :meth:`tick` often; it runs the check when due and returns
    the probe's current verdict (None until the first result)."""

    def __init__(
        self,
        spec: Mapping[str, Any],
        container: Mapping[str, Any],
        pod_ip: str,
        env: Mapping[str, str],
        started_at: float,
    ) -> None:
        self.spec = spec
        self.container = container
        self.pod_ip = pod_ip
        self.env = env
        self.period = float(spec.get("periodSeconds") or 10)
        self.timeout = float(spec.get("timeoutSeconds") or 1)
        self.success_threshold = int(spec.get("successThreshold") or 1)
        self.failure_threshold = int(spec.get("failureThreshold") or 3)
        self.next_at = started_at + float(spec.get("initialDelaySeconds") or 0)
        self.successes = 0
        self.failures = 0
        self.verdict: bool | None = None

    def check(self, pid: int) -> bool:
        s = self.spec
        try:
            if "httpGet" in s:
                h = s["httpGet"]
                headers = {x["name"]: x["value"] for x in h.get("httpHeaders") or []}
                return http_get(
                    h.get("host") or self.pod_ip,
                    resolve_port(h["port"], self.container),
                    h.get("path", "/"),
                    h.get("scheme", "HTTP"),
                    headers,
                    self.timeout,
                )
            if "tcpSocket" in s:
                t = s["tcpSocket"]
                return tcp_connect(
                    t.get("host") or self.pod_ip, resolve_port(t["port"], self.container), self.timeout
                )
            if "exec" in s:
                return exec_in(pid, list(s["exec"].get("command") or []), self.env, self.timeout)
        except ValueError:
            return False
        return False

    def tick(self, pid: int, now: float | None = None) -> bool | None:
        now = time.time() if now is None else now
        if now < self.next_at:
            return self.verdict
        self.next_at = now + self.period
        if self.check(pid):
            self.successes += 1
            self.failures = 0
            if self.successes >= self.success_threshold:
                self.verdict = True
        else:
            self.failures += 1
            self.successes = 0
            if self.failures >= self.failure_threshold:
                self.verdict = False
        return self.verdict
