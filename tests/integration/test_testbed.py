"""The test bed itself, against the real control plane: scheduling by GPU labels and resources, the
emulated kubelet running pods as processes, probes, faults."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from trtforge_dev.testbed.handle import TestBed
from trtforge_dev.testbed.wait import wait_for

from trtforge.contract.gpu_probe import EmulatedGPUProbe

pytestmark = pytest.mark.integration

H100 = "NVIDIA-H100-80GB-HBM3"


def apply(tb: TestBed, ns: str, obj: dict[str, Any]) -> None:
    tb.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(obj))


def pod(name: str, command: list[str], **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "ignored", "command": command}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [container],
            **spec,
        },
    }


def get_pod(core: client.CoreV1Api, ns: str, name: str) -> client.V1Pod:
    return core.read_namespaced_pod(name, ns)


def test_job_on_h100_runs_its_command(testbed: TestBed, namespace: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "on-h100"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"nvidia.com/gpu.product": H100},
                    "containers": [
                        {
                            "name": "main",
                            "image": "ignored",
                            "command": [
                                "sh",
                                "-c",
                                f'echo "$NODE $POD_IP $NVIDIA_VISIBLE_DEVICES" > {marker}; '
                                "echo ok > /dev/termination-log",
                            ],
                            "env": [
                                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
                            ],
                            "resources": {"limits": {"nvidia.com/gpu": 1}},
                        }
                    ],
                }
            },
        },
    }
    apply(testbed, namespace, job)
    with testbed.api_client() as api:
        batch = client.BatchV1Api(api)
        wait_for(
            lambda: (batch.read_namespaced_job("on-h100", namespace).status.succeeded or 0) >= 1,
            timeout=60,
            desc="job on-h100 to succeed",
        )
        pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector="job-name=on-h100").items
    assert len(pods) == 1
    p = pods[0]
    assert p.spec.node_name.startswith("gpu-h100-")
    node, ip, visible = marker.read_text().split()
    assert node == p.spec.node_name
    assert ip == p.status.pod_ip and ip.startswith("127.") and ip != "127.0.0.1"
    assert visible.startswith("GPU-")
    term = p.status.container_statuses[0].state.terminated
    assert term.exit_code == 0 and term.message.strip() == "ok"


def test_mig_request_lands_on_b200(testbed: TestBed, namespace: str) -> None:
    apply(
        testbed,
        namespace,
        pod(
            "mig",
            ["sh", "-c", "trtforge gpu probe"],
            container={"resources": {"limits": {"nvidia.com/mig-3g.90gb": 1}}},
        ),
    )
    with testbed.api_client() as api:
        core = client.CoreV1Api(api)
        p = wait_for(
            lambda: (q := get_pod(core, namespace, "mig")).status.phase == "Succeeded" and q,
            timeout=60,
            desc="pod mig to succeed",
        )
    assert p.spec.node_name == "gpu-b200-mig-0"
    out = testbed.pod_log(namespace, "mig")
    assert "3g.90gb" in out and "NVIDIA B200 MIG 3g.90gb" in out


def test_too_many_gpus_stays_pending(testbed: TestBed, namespace: str) -> None:
    apply(
        testbed,
        namespace,
        pod("greedy", ["true"], container={"resources": {"limits": {"nvidia.com/gpu": 9}}}),
    )
    with testbed.api_client() as api:
        core = client.CoreV1Api(api)

        def unschedulable() -> bool:
            conds = get_pod(core, namespace, "greedy").status.conditions or []
            return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conds)

        wait_for(unschedulable, timeout=30, desc="pod greedy to be marked Unschedulable")
        p = get_pod(core, namespace, "greedy")
    assert p.status.phase == "Pending" and not p.spec.node_name


def test_readiness_probe_gates_ready(testbed: TestBed, namespace: str, tmp_path: Path) -> None:
    gate = tmp_path / "ready"
    server = (
        "import http.server,os,pathlib\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "  def do_GET(s):\n"
        f"    ok=pathlib.Path({str(gate)!r}).exists(); s.send_response(200 if ok else 503); s.end_headers()\n"
        "  def log_message(s,*a): pass\n"
        "http.server.HTTPServer((os.environ['POD_IP'],8080),H).serve_forever()\n"
    )
    apply(
        testbed,
        namespace,
        pod(
            "probed",
            ["python", "-c", server],
            restartPolicy="Always",
            container={
                "ports": [{"name": "http", "containerPort": 8080}],
                "readinessProbe": {
                    "httpGet": {"path": "/", "port": "http"},
                    "periodSeconds": 1,
                    "failureThreshold": 1,
                },
            },
        ),
    )
    with testbed.api_client() as api:
        core = client.CoreV1Api(api)

        def ready() -> bool:
            return any(
                c.type == "Ready" and c.status == "True"
                for c in get_pod(core, namespace, "probed").status.conditions or []
            )

        wait_for(
            lambda: get_pod(core, namespace, "probed").status.phase == "Running",
            timeout=30,
            desc="pod probed Running",
        )
        # Running, the server answers 503: the probe keeps it not Ready.
        wait_for(
            lambda: get_pod(core, namespace, "probed").status.container_statuses[0].started,
            timeout=15,
            desc="container started",
        )
        with pytest.raises(TimeoutError):
            wait_for(ready, timeout=3, desc="Ready while the probe fails")
        gate.write_text("")
        wait_for(ready, timeout=15, desc="Ready once the probe passes")


def test_fault_drops_allocatable_and_shows_in_probe(testbed: TestBed) -> None:
    node = "gpu-h100-1"
    with testbed.api_client() as api:
        core = client.CoreV1Api(api)
        before = int(core.read_node(node).status.allocatable["nvidia.com/gpu"])
        gpu_file = testbed.gpu_file(node)
        probe = EmulatedGPUProbe(gpu_file, visible="all", poll_interval_s=0.05)
        try:
            dev = testbed.fault(node, gpu=3, xid=79)
            event = probe.wait_for_fault(timeout_s=5)
            assert event is not None and event.xid == 79 and event.gpu_uuid == dev.uuid
            assert not dev.healthy
            wait_for(
                lambda: int(core.read_node(node).status.allocatable["nvidia.com/gpu"]) == before - 1,
                timeout=15,
                desc=f"{node} allocatable to drop by one",
            )
            assert core.read_node(node).status.capacity["nvidia.com/gpu"] == str(before)
        finally:
            testbed.heal(node)
        wait_for(
            lambda: int(core.read_node(node).status.allocatable["nvidia.com/gpu"]) == before,
            timeout=15,
            desc=f"{node} allocatable back after heal",
        )


def test_deleting_a_pod_ends_its_process(testbed: TestBed, namespace: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    apply(
        testbed,
        namespace,
        pod(
            "sleeper",
            [
                "python",
                "-c",
                f"import os; open({str(pidfile)!r}, 'w').write(str(os.getpid())); "
                "os.execvp('sleep', ['sleep', '600'])",
            ],
        ),
    )
    pid = int(
        wait_for(
            lambda: pidfile.exists() and pidfile.read_text().strip(),
            timeout=30,
            desc="sleeper to write its pid",
        )
    )
    assert Path(f"/proc/{pid}").exists()
    testbed.kubectl("delete", "pod", "sleeper", "-n", namespace, "--wait=false")
    wait_for(
        lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), timeout=15, desc=f"process {pid} to end"
    )
    with testbed.api_client() as api:
        core = client.CoreV1Api(api)
        wait_for(
            lambda: (
                not [p for p in core.list_namespaced_pod(namespace).items if p.metadata.name == "sleeper"]
            ),
            timeout=15,
            desc="pod object removed",
        )


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_get_nodes_lists_gpu_nodes_ready(testbed: TestBed) -> None:
    out = testbed.kubectl("get", "nodes", "-L", "nvidia.com/gpu.product", "--no-headers").stdout
    rows = {line.split()[0]: line.split() for line in out.splitlines()}
    for node, product in (
        ("gpu-h100-0", H100),
        ("gpu-h100-1", H100),
        ("gpu-gh200-0", "NVIDIA-GH200-480GB"),
        ("gpu-b200-mig-0", "NVIDIA-B200"),
    ):
        assert rows[node][1] == "Ready" and rows[node][-1] == product
    assert rows["cpu-0"][1] == "Ready"
    labels = json.loads(testbed.kubectl("get", "node", "gpu-gh200-0", "-o", "json").stdout)["metadata"][
        "labels"
    ]
    assert labels["kubernetes.io/arch"] == "arm64"
    assert os.path.isabs(str(testbed.kubeconfig))
