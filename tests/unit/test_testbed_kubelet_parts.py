"""Kubelet parts that need no cluster: probes against a local server, address allocation, log tails,
pod-log lookup, the test StorageClass's PV."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from trtforge_dev.testbed.kubelet.context import IPAllocator
from trtforge_dev.testbed.kubelet.logserver import tail_lines
from trtforge_dev.testbed.kubelet.probes import Prober, resolve_port
from trtforge_dev.testbed.kubelet.provisioner import STORAGE_CLASS, pv_for
from trtforge_dev.testbed.paths import StatePaths
from trtforge_dev.testbed.podlogs import PodLogError, read_pod_log


@pytest.fixture
def server() -> Iterator[tuple[int, dict[str, int]]]:
    state = {"code": 503}

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(state["code"])
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1], state
    srv.shutdown()


def test_http_probe_thresholds(server: tuple[int, dict[str, int]]) -> None:
    port, state = server
    spec = {
        "httpGet": {"path": "/", "port": "web"},
        "periodSeconds": 1,
        "failureThreshold": 2,
        "successThreshold": 2,
    }
    c = {"name": "c", "ports": [{"name": "web", "containerPort": port}]}
    p = Prober(spec, c, "127.0.0.1", {}, started_at=0.0)
    assert p.tick(0, now=1.0) is None  # one failure, threshold 2
    assert p.tick(0, now=1.5) is None  # not due yet
    assert p.tick(0, now=2.0) is False
    state["code"] = 200
    assert p.tick(0, now=3.0) is False  # one success, threshold 2
    assert p.tick(0, now=4.0) is True


def test_tcp_probe_and_initial_delay(server: tuple[int, dict[str, int]]) -> None:
    port, _ = server
    p = Prober({"tcpSocket": {"port": port}, "initialDelaySeconds": 5}, {"name": "c"}, "127.0.0.1", {}, 100.0)
    assert p.tick(0, now=101.0) is None
    assert p.tick(0, now=105.0) is True


def test_named_port_must_exist() -> None:
    with pytest.raises(ValueError, match="not a named port"):
        resolve_port("metrics", {"name": "c", "ports": []})


def test_ip_allocator_prefers_previous_address_and_never_duplicates() -> None:
    a = IPAllocator()
    first = a.acquire("u1")
    assert a.acquire("u1") == first
    assert a.acquire("u2", prefer=first) != first  # taken: a new one
    assert a.acquire("u3", prefer="127.1.0.200") == "127.1.0.200"
    ips = {a.acquire(f"x{i}") for i in range(300)}
    assert "127.1.0.200" not in ips and first not in ips


def test_tail_lines() -> None:
    assert tail_lines(b"a\nb\nc\n", 2) == b"b\nc\n"
    assert tail_lines(b"a\nb\n", None) == b"a\nb\n"
    assert tail_lines(b"a\n", 0) == b""


def test_pod_log_lookup(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    logs = paths.pods / "ns_p_uid1" / "logs"
    logs.mkdir(parents=True)
    (logs / "main.log").write_text("hi\n")
    assert read_pod_log(paths, "ns", "p") == "hi\n"
    (logs / "side.log").write_text("")
    with pytest.raises(PodLogError, match="has containers main, side: name one"):
        read_pod_log(paths, "ns", "p")
    with pytest.raises(PodLogError, match="no logs for pod ns/q"):
        read_pod_log(paths, "ns", "q")


def test_pv_is_prebound_to_its_claim() -> None:
    pvc = SimpleNamespace(
        metadata=SimpleNamespace(uid="abc", namespace="ns", name="data"),
        spec=SimpleNamespace(
            resources=SimpleNamespace(requests={"storage": "5Gi"}), access_modes=["ReadWriteMany"]
        ),
    )
    pv = pv_for(pvc, "/x/pvc-abc")
    assert pv["metadata"]["name"] == "pvc-abc" and pv["spec"]["storageClassName"] == STORAGE_CLASS
    assert pv["spec"]["claimRef"] == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "namespace": "ns",
        "name": "data",
        "uid": "abc",
    }
    assert pv["spec"]["capacity"] == {"storage": "5Gi"} and pv["spec"]["hostPath"]["path"] == "/x/pvc-abc"


def test_backend_version_env_stands_in_for_another_image(tmp_path: Path) -> None:
    """The test bed ignores images: TRTFORGE_TESTBED_BACKEND_VERSION in a container's env makes its
    ONNX Runtime report that version (what an image with another backend build would do)."""
    import subprocess
    import sys

    from trtforge_dev.testbed.kubelet.podspec import BACKEND_VERSION_ENV, image_stand_in

    assert image_stand_in({"PATH": "/bin"}) == {"PATH": "/bin"}
    env = image_stand_in({"PATH": "/bin", BACKEND_VERSION_ENV: "1.99.0+image2", "PYTHONPATH": "/x"})
    assert env["PYTHONPATH"].endswith(":/x") and "image_shim" in env["PYTHONPATH"]
    p = subprocess.run(
        [sys.executable, "-c", "import onnxruntime; print(onnxruntime.__version__)"],
        env={**env, "PATH": str(Path(sys.executable).parent)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert p.stdout.strip() == "1.99.0+image2"


# --- the pod worker survives API errors (apiserver restarts) -------------------------------------


def test_api_retry_delay_doubles_and_caps() -> None:
    from trtforge_dev.testbed.kubelet.pod import api_retry_delay

    assert [api_retry_delay(n) for n in range(0, 7)] == [0.0, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_which_api_errors_are_transient() -> None:
    import urllib3
    from kubernetes.client.rest import ApiException
    from trtforge_dev.testbed.kubelet.pod import transient

    assert transient(urllib3.exceptions.MaxRetryError(None, "/api", "refused"))  # type: ignore[arg-type]
    assert transient(ConnectionRefusedError())
    assert transient(ApiException(status=503))
    assert transient(ApiException(status=429))
    assert not transient(ApiException(status=422))
    assert not transient(ValueError("a bug"))
