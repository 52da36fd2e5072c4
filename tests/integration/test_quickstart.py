"""docs/quickstart.md ("On a cluster"), walked on the test bed: every command of the page's fenced
`sh` blocks, in order and as written, then its Python block. The page is parsed here, so a command
that drifts from what works fails this test.

What the test bed cannot run as written, and what runs instead (only these):
- `make images ...`: skipped (no container tool or registry here; tests/integration/test_make_images.py).
- `kubectl apply --server-side -f crds/`: the page's own Kubernetes 1.20-1.22 alternative
  (`kubectl apply --validate=false -f crds/`), this test bed being 1.20.
- `helm install ...`: the same release, chart, namespace and `--set`s rendered by the real Helm and
  applied (trtforge_dev/testbed/chart.py), with the test-bed adaptations of dev/trtforge_dev/chart_operator.py
  (containers get `command: [trtforge]`, listen on their pod IP, the broker URL is a local forwarder
  to the broker pods), ONNX Runtime backends for the emulated GPUs and one operator replica.
- a `kubectl` that the page lets wait longer than 10 minutes is stopped at 10 minutes.
- the copy Job's MODEL_URL: a loopback HTTP server with a SqueezeNet 1.0 of generated weights (no
  internet here; dev/trtforge_dev/modelzoo.py).
- `squeezenet.team-a.svc`: a ready runtime pod's address (no cluster DNS or Service IPs here).
"""

from __future__ import annotations

import functools
import http.server
import re
import shlex
import shutil
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from trtforge_dev import localdev
from trtforge_dev.chart_operator import TCPProxy
from trtforge_dev.modelzoo import light_model
from trtforge_dev.testbed.chart import apply, delete, for_testbed, kube_version, render
from trtforge_dev.testbed.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "quickstart.md"
SERVICE_HOST = re.compile(r"squeezenet\.team-a\.svc")


def page_blocks(lang: str) -> list[str]:
    """The fenced blocks of the page's "On a cluster" part whose info string is `lang` ("" for plain)."""
    blocks: list[tuple[str, list[str]]] = []
    open_block: list[str] | None = None
    for line in PAGE.read_text().split("## On a cluster", 1)[1].splitlines():
        if open_block is None and line.startswith("```"):
            open_block = []
            blocks.append((line[3:].strip(), open_block))
        elif open_block is not None and line == "```":
            open_block = None
        elif open_block is not None:
            open_block.append(line)
    return ["\n".join(body) + "\n" for info, body in blocks if info == lang]


def commands() -> list[list[str]]:
    out = []
    for block in page_blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                out.append(argv)
    return out


def set_values(argv: list[str]) -> dict[str, Any]:
    """`--set a.b=c` of a helm command line as a values dict (dotted keys only)."""
    values: dict[str, Any] = {}
    for i, a in enumerate(argv):
        if a == "--set":
            key, _, val = argv[i + 1].partition("=")
            node = values
            *path, last = key.split(".")
            for k in path:
                node = node.setdefault(k, {})
            node[last] = val
    return values


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class Walk:
    """The page's world on the test bed: what each adapted command made, for the checks and cleanup."""

    def __init__(self, tb: Any) -> None:
        self.tb = tb
        self.api = tb.api_client()
        self.core: Any = client.CoreV1Api(self.api)
        self.docs: list[dict[str, Any]] = []
        self.broker = TCPProxy(self._broker_endpoint)
        self.model_server: http.server.ThreadingHTTPServer | None = None
        self.outputs: list[str] = []

    def _ready_pods(self, ns: str, selector: str) -> list[Any]:
        return [
            p
            for p in self.core.list_namespaced_pod(ns, label_selector=selector).items
            if p.status.pod_ip
            and not p.metadata.deletion_timestamp
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        ]

    def _broker_endpoint(self) -> tuple[str, int]:
        pods = self._ready_pods("trtforge-system", "app.kubernetes.io/component=broker")
        if not pods:
            raise OSError("no ready broker pod")
        return pods[0].status.pod_ip, 8081

    def kubectl(self, argv: list[str], timeout: float = 600) -> str:
        args = [str(REPO / a) if (REPO / a).exists() and "/" in a else a for a in argv[1:]]
        r = self.tb.kubectl(*args, timeout=timeout, check=False)
        assert r.returncode == 0, f"{shlex.join(argv)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
        self.outputs.append(r.stdout)
        return str(r.stdout)

    def helm_install(self, argv: list[str]) -> None:
        release, chart = argv[2], argv[3]
        ns = argv[argv.index("-n") + 1]
        assert (REPO / chart).is_dir() and chart == "charts/trtforge"
        env = [
            {
                "name": "TRTFORGE_OPERATOR_BIND_ADDRESS",
                "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
            },
            {
                "name": "TRTFORGE_OPERATOR_METRICS_BIND_ADDRESS",
                "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
            },
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(self.tb.state.apiserver_port)},
        ]
        testbed_values = {
            "operator": {"replicas": 1, "extraEnv": env},
            "broker": {"extraEnv": env},
            "engineBackends": {"gpu": "onnxruntime", "cpu": "onnxruntime"},
            "build": {"cpu": "100m", "memory": "1Gi", "retryBaseSeconds": 5},
        }
        docs, _ = render(
            release, ns, merge(set_values(argv), testbed_values), kube_version=kube_version(self.tb)
        )
        self.docs = for_testbed(docs, broker_url=f"http://127.0.0.1:{self.broker.port}")
        apply(self.tb, self.docs)

    def copy_job(self, argv: list[str]) -> None:
        path = REPO / argv[argv.index("-f") + 1]
        ns = argv[argv.index("-n") + 1]
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        for d in docs:
            for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                for e in c.get("env", []):
                    if e["name"] == "MODEL_URL":
                        e["value"] = self.serve_model(Path(e["value"]).name)
        r = self.tb.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(docs), check=False)
        assert r.returncode == 0, r.stderr

    def serve_model(self, name: str) -> str:
        root = Path(self.tb.paths.root) / "quickstart-models"
        root.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(light_model("squeezenet"), root / name)
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
        self.model_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.model_server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.model_server.server_address[1]}/{name}"

    def service_address(self) -> str:
        pods = wait_for(
            lambda: self._ready_pods("team-a", "app.kubernetes.io/component=runtime"),
            timeout=120,
            desc="a ready runtime pod of team-a",
        )
        return str(pods[0].status.pod_ip)

    def run(self, argv: list[str]) -> None:
        if argv[:2] == ["make", "images"]:
            return
        if argv[0] == "kubectl" and "--server-side" in argv and argv[-1] == "crds/":
            self.kubectl(["kubectl", "apply", "--validate=false", "-f", "crds/"])
            return
        if argv[:2] == ["helm", "install"]:
            self.helm_install(argv)
            return
        if argv[0] == "kubectl" and argv[-1].endswith("copy-squeezenet.yaml"):
            self.copy_job(argv)
            return
        if argv[0] == "kubectl":
            self.kubectl(argv)
            return
        if argv[0] == "curl":
            host = self.service_address()
            cmd = [SERVICE_HOST.sub(host, a) for a in argv]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, f"{shlex.join(argv)}: {r.stderr}"
            self.outputs.append(r.stdout)
            return
        raise AssertionError(f"the walk does not know how to run {shlex.join(argv)}")

    def close(self) -> None:
        # The resources first, while the chart's operator runs their finalizers (a loaded machine can
        # leave it too little time before its own Deployment goes: then their finalizers are
        # stripped, or team-a would never finish terminating).
        localdev.delete_resources(self.api, ["team-a"], finalizer_wait_s=60)
        if self.docs:
            delete(self.tb, self.docs)
        namespaces = ("team-a", "trtforge-system")  # gone before another module makes them again
        self.tb.kubectl("delete", "namespace", *namespaces, "--ignore-not-found", "--wait=false", check=False)
        core: Any = client.CoreV1Api(self.api)
        try:
            wait_for(
                lambda: not [n for n in core.list_namespace().items if n.metadata.name in namespaces],
                timeout=180,
                desc="the quick start's namespaces deleted",
            )
        except TimeoutError:
            left = [
                (n.metadata.name, n.status.conditions)
                for n in core.list_namespace().items
                if n.metadata.name in namespaces
            ]
            warnings.warn(f"the quick start's namespaces are still terminating: {left}", stacklevel=1)
        if self.model_server is not None:
            self.model_server.shutdown()
        self.broker.close()
        self.api.close()


@pytest.fixture
def walk(testbed: Any) -> Iterator[Walk]:
    w = Walk(testbed)
    try:
        yield w
    finally:
        w.close()


def test_the_page_has_the_steps_a_platform_engineer_needs() -> None:
    text = "\n".join(shlex.join(c) for c in commands())
    for needle in (
        "make images PUSH=",
        "helm install trtforge charts/trtforge -n trtforge-system --set global.imageRegistry=",
        "kubectl label namespace team-a pod-security.kubernetes.io/enforce=restricted",
        "kubectl -n team-a apply -f examples/model/copy-squeezenet.yaml",
        "kubectl -n team-a apply -f examples/trtengine-squeezenet.yaml",
        "kubectl -n team-a apply -f examples/inferencedeployment-squeezenet.yaml",
        "curl -s http://squeezenet.team-a.svc:8000/v2/models/squeezenet",
    ):
        assert needle in text, needle
    (py,) = page_blocks("python")
    assert "tritonclient.http" in py and "tritonclient.grpc" in py


def test_the_quick_start_runs_as_written(walk: Walk) -> None:
    for argv in commands():
        walk.run(argv)
    out = "\n".join(walk.outputs)
    assert re.search(r"trtforge-engines\s+Bound", out), "the store claim did not bind"
    assert re.search(r"[0-9a-f]{64}\s+/models/squeezenet.onnx", out), "the copy Job printed no sha256"
    # `kubectl get trte squeezenet` prints what the page shows (its AGE aside).
    (shown,) = [b for b in page_blocks("") if b.startswith("NAME ")]
    want = [line.split()[:-1] for line in shown.splitlines()]
    got = [line.split()[:-1] for line in out.splitlines() if line.split()[:1] in (["NAME"], ["squeezenet"])]
    assert want[0] in got and want[1] in got, (want, got)
    assert "200" in out and '"name":"squeezenet"' in out.replace(" ", "")
    (py,) = page_blocks("python")
    script = SERVICE_HOST.sub(walk.service_address(), py)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all("(1, 1000" in line for line in lines), r.stdout
