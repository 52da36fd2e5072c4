"""The emulated kubelet's pod features: env from fields/secrets/configMaps, volumes mounted at their
real paths, PVCs from the test StorageClass, projected tokens that TokenReview accepts, init
containers in order, restarts with back-off, liveness and exec probes, graceful deletion, node-down."""

from __future__ import annotations

import base64
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from trtforge_dev.testbed.handle import TestBed
from trtforge_dev.testbed.wait import wait_for

pytestmark = pytest.mark.integration


def apply(tb: TestBed, ns: str, *objs: dict[str, Any]) -> None:
    tb.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(objs))


def pod(name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    for c in containers + spec.get("initContainers", []):
        c.setdefault("image", "ignored")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": containers,
            **spec,
        },
    }


def read(tb: TestBed, ns: str, name: str) -> Any:
    with tb.api_client() as api:
        core: Any = client.CoreV1Api(api)
        return core.read_namespaced_pod(name, ns)


def wait_phase(tb: TestBed, ns: str, name: str, phase: str, timeout: float = 60) -> Any:
    return wait_for(
        lambda: (p := read(tb, ns, name)).status.phase == phase and p,
        timeout=timeout,
        desc=f"pod {name} phase {phase}",
    )


def test_env_and_volumes_at_real_paths(testbed: TestBed, namespace: str) -> None:
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cfg"},
        "data": {"greeting": "hello", "file.txt": "from-configmap"},
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "sec"},
        "data": {"password": base64.b64encode(b"s3cret").decode()},
    }
    script = (
        'echo "name=$MY_NAME ns=$MY_NS ip=$MY_IP pod_ip=$POD_IP node=$MY_NODE greet=$GREET pw=$PW '
        'combined=$COMBINED"; cat /etc/trtforge-cfg/file.txt; echo; cat /secret/password; echo; '
        "echo scratch > /scratch/x; cat /scratch/x; ls /var/run/secrets/tokens/; "
        "test -s /var/run/secrets/tokens/token && echo token-ok"
    )
    main = {
        "name": "main",
        "command": ["sh", "-c", script],
        "env": [
            {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "MY_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "GREET", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "greeting"}}},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "password"}}},
            {"name": "COMBINED", "value": "$(GREET)-$(MY_NAME)"},
        ],
        "volumeMounts": [
            {"name": "cfg", "mountPath": "/etc/trtforge-cfg", "readOnly": True},
            {"name": "sec", "mountPath": "/secret"},
            {"name": "scratch", "mountPath": "/scratch"},
            {"name": "tok", "mountPath": "/var/run/secrets/tokens"},
        ],
    }
    vols = [
        {"name": "cfg", "configMap": {"name": "cfg"}},
        {"name": "sec", "secret": {"secretName": "sec"}},
        {"name": "scratch", "emptyDir": {}},
        {
            "name": "tok",
            "projected": {
                "sources": [
                    {
                        "serviceAccountToken": {
                            "path": "token",
                            "audience": "trtforge-test",
                            "expirationSeconds": 3600,
                        }
                    }
                ]
            },
        },
    ]
    apply(testbed, namespace, cm, secret, pod("envvol", [main], volumes=vols, nodeName="cpu-0"))
    p = wait_phase(testbed, namespace, "envvol", "Succeeded")
    out = testbed.pod_log(namespace, "envvol")
    ip = p.status.pod_ip
    assert (
        f"name=envvol ns={namespace} ip={ip} pod_ip={ip} node=cpu-0 greet=hello pw=s3cret "
        "combined=hello-envvol" in out
    )
    assert "from-configmap" in out and "s3cret" in out and "scratch" in out and "token-ok" in out
    # The mount was private to the container: the host has no /scratch/x.
    assert not Path("/scratch/x").exists()


def test_projected_token_passes_tokenreview(testbed: TestBed, namespace: str, tmp_path: Path) -> None:
    out = tmp_path / "token"
    main = {
        "name": "main",
        "command": ["sh", "-c", f"cat /var/run/secrets/tokens/token > {out}"],
        "volumeMounts": [{"name": "tok", "mountPath": "/var/run/secrets/tokens"}],
    }
    vols = [
        {
            "name": "tok",
            "projected": {
                "sources": [{"serviceAccountToken": {"path": "token", "audience": "engine-broker"}}]
            },
        }
    ]
    apply(testbed, namespace, pod("tok", [main], volumes=vols))
    wait_phase(testbed, namespace, "tok", "Succeeded")
    token = out.read_text().strip()
    with testbed.api_client() as api:
        auth: Any = client.AuthenticationV1Api(api)
        review = auth.create_token_review(
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token, "audiences": ["engine-broker"]},
            }
        )
    assert review.status.authenticated, review.status.error
    assert review.status.user.username == f"system:serviceaccount:{namespace}:default"
    assert review.status.user.extra["authentication.kubernetes.io/pod-name"] == ["tok"]


def test_pvc_is_provisioned_and_shared(testbed: TestBed, namespace: str) -> None:
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    mount = [{"name": "data", "mountPath": "/mnt/trtforge/pvc/data"}]
    vols = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    writer = pod(
        "writer",
        [
            {
                "name": "main",
                "command": ["sh", "-c", "echo shared > /mnt/trtforge/pvc/data/f"],
                "volumeMounts": mount,
            }
        ],
        volumes=vols,
    )
    apply(testbed, namespace, pvc, writer)
    wait_phase(testbed, namespace, "writer", "Succeeded")
    reader = pod(
        "reader",
        [{"name": "main", "command": ["cat", "/mnt/trtforge/pvc/data/f"], "volumeMounts": mount}],
        volumes=vols,
    )
    apply(testbed, namespace, reader)
    wait_phase(testbed, namespace, "reader", "Succeeded")
    assert testbed.pod_log(namespace, "reader").strip() == "shared"
    bound = testbed.kubectl("get", "pvc", "data", "-n", namespace, "-o", "jsonpath={.status.phase}").stdout
    assert bound == "Bound"


def test_init_containers_run_in_order_first(testbed: TestBed, namespace: str) -> None:
    shared = [{"name": "work", "mountPath": "/work-dir"}]
    inits = [
        {
            "name": f"init-{i}",
            "command": ["sh", "-c", f"echo init-{i} >> /work-dir/order"],
            "volumeMounts": shared,
        }
        for i in (1, 2)
    ]
    main = {
        "name": "main",
        "command": ["sh", "-c", "echo main >> /work-dir/order; cat /work-dir/order"],
        "volumeMounts": shared,
    }
    apply(
        testbed,
        namespace,
        pod("inits", [main], initContainers=inits, volumes=[{"name": "work", "emptyDir": {}}]),
    )
    p = wait_phase(testbed, namespace, "inits", "Succeeded")
    assert testbed.pod_log(namespace, "inits", "main").split() == ["init-1", "init-2", "main"]
    assert [s.state.terminated.exit_code for s in p.status.init_container_statuses] == [0, 0]


def test_failing_init_container_fails_pod_with_restart_never(testbed: TestBed, namespace: str) -> None:
    apply(
        testbed,
        namespace,
        pod(
            "badinit",
            [{"name": "main", "command": ["true"]}],
            initContainers=[{"name": "init", "command": ["sh", "-c", "exit 3"]}],
        ),
    )
    p = wait_phase(testbed, namespace, "badinit", "Failed")
    assert p.status.init_container_statuses[0].state.terminated.exit_code == 3
    assert p.status.container_statuses[0].state.waiting is not None


def test_restart_on_failure_with_backoff_then_exit_code_and_message(
    testbed: TestBed, namespace: str, tmp_path: Path
) -> None:
    count = tmp_path / "count"
    script = (
        f"n=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {count}; "
        'echo "attempt $n" > /dev/termination-log; [ $n -ge 3 ] && exit 0; exit 7'
    )
    apply(
        testbed,
        namespace,
        pod("flaky", [{"name": "main", "command": ["sh", "-c", script]}], restartPolicy="OnFailure"),
    )
    t0 = time.monotonic()
    p = wait_phase(testbed, namespace, "flaky", "Succeeded")
    elapsed = time.monotonic() - t0
    st = p.status.container_statuses[0]
    assert st.restart_count == 2
    assert st.last_state.terminated.exit_code == 7
    assert st.state.terminated.message.strip() == "attempt 3"
    assert elapsed >= 3.0  # back-off: 1s then 2s between the three attempts


def test_failed_container_reports_exit_code(testbed: TestBed, namespace: str) -> None:
    apply(
        testbed,
        namespace,
        pod(
            "fails",
            [
                {
                    "name": "main",
                    "command": ["sh", "-c", "echo boom; exit 42"],
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                }
            ],
        ),
    )
    p = wait_phase(testbed, namespace, "fails", "Failed")
    term = p.status.container_statuses[0].state.terminated
    assert term.exit_code == 42 and term.reason == "Error" and "boom" in term.message


def test_liveness_exec_probe_restarts_container(testbed: TestBed, namespace: str, tmp_path: Path) -> None:
    alive = "/tmp/alive"
    main = {
        "name": "main",
        "command": ["sh", "-c", f"touch {alive}; sleep 2; rm -f {alive}; exec sleep 600"],
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "livenessProbe": {
            "exec": {"command": ["test", "-e", alive]},
            "periodSeconds": 1,
            "failureThreshold": 2,
        },
    }
    apply(
        testbed,
        namespace,
        pod("live", [main], restartPolicy="Always", volumes=[{"name": "tmp", "emptyDir": {}}]),
    )
    p = wait_for(
        lambda: (
            (q := read(testbed, namespace, "live")).status.container_statuses
            and q.status.container_statuses[0].restart_count >= 1
            and q
        ),
        timeout=40,
        desc="liveness failure to restart the container",
    )
    assert p.status.container_statuses[0].last_state.terminated is not None


def test_graceful_deletion_sends_sigterm_first(testbed: TestBed, namespace: str, tmp_path: Path) -> None:
    seen = tmp_path / "sigterm"
    script = (
        f"import signal, sys, time, pathlib\n"
        f"def bye(*a):\n    pathlib.Path({str(seen)!r}).write_text('term'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\nprint('up', flush=True)\ntime.sleep(600)\n"
    )
    apply(testbed, namespace, pod("graceful", [{"name": "main", "command": ["python", "-c", script]}]))
    wait_for(lambda: "up" in _log(testbed, namespace, "graceful"), timeout=30, desc="graceful to start")
    testbed.kubectl("delete", "pod", "graceful", "-n", namespace, "--wait=false")
    wait_for(seen.exists, timeout=15, desc="the container to see SIGTERM")
    assert seen.read_text() == "term"


def _log(tb: TestBed, ns: str, name: str) -> str:
    try:
        return tb.pod_log(ns, name)
    except LookupError:
        return ""


def test_node_down_stops_heartbeats_and_pods(testbed: TestBed, namespace: str, tmp_path: Path) -> None:
    node = "gpu-gh200-0"
    pidfile = tmp_path / "pid"
    cmd = [
        "python",
        "-c",
        f"import os; open({str(pidfile)!r}, 'w').write(str(os.getpid())); "
        "os.execvp('sleep', ['sleep', '600'])",
    ]
    apply(testbed, namespace, pod("victim", [{"name": "main", "command": cmd}], nodeName=node))
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=30, desc="pid"))
    try:
        testbed.node_down(node)
        wait_for(lambda: not _running(pid), timeout=15, desc=f"pod process {pid} to end")
        with testbed.api_client() as api:
            core: Any = client.CoreV1Api(api)
            n = core.read_node(node)
            ready = next(c for c in n.status.conditions if c.type == "Ready")
            assert ready.status == "Unknown"
            assert any(t.key == "node.kubernetes.io/unreachable" for t in n.spec.taints or [])
            lease = client.CoordinationV1Api(api).read_namespaced_lease(node, "kube-node-lease")
            renewed = lease.spec.renew_time
            with pytest.raises(TimeoutError):
                wait_for(
                    lambda: (
                        client.CoordinationV1Api(api)
                        .read_namespaced_lease(node, "kube-node-lease")
                        .spec.renew_time
                        != renewed
                    ),
                    timeout=7,
                    desc="lease renewal",
                )
    finally:
        testbed.node_up(node)
    out = testbed.kubectl("get", "node", node, "--no-headers").stdout.split()
    assert out[1] == "Ready"


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_cluster_logs_cli(testbed: TestBed, namespace: str) -> None:
    apply(testbed, namespace, pod("chatty", [{"name": "main", "command": ["echo", "hello-logs"]}]))
    wait_phase(testbed, namespace, "chatty", "Succeeded")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "trtforge.cli",
            "cluster",
            "--root",
            str(testbed.root),
            "logs",
            "chatty",
            "-n",
            namespace,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert r.stdout.strip() == "hello-logs"


def test_kubectl_logs_through_the_apiserver(testbed: TestBed, namespace: str) -> None:
    apply(
        testbed,
        namespace,
        pod(
            "talker",
            [{"name": "main", "command": ["sh", "-c", "for i in 1 2 3; do echo line-$i; sleep 0.3; done"]}],
        ),
    )
    wait_for(
        lambda: read(testbed, namespace, "talker").status.phase in ("Running", "Succeeded"),
        timeout=30,
        desc="talker started",
    )
    followed = testbed.kubectl("logs", "-f", "talker", "-n", namespace, timeout=30).stdout
    assert followed.split() == ["line-1", "line-2", "line-3"]
    assert testbed.kubectl("logs", "talker", "-n", namespace, "--tail=1").stdout.strip() == "line-3"
    missing = testbed.kubectl("logs", "talker", "-n", namespace, "-c", "nope", check=False)
    assert missing.returncode != 0


def test_deployment_becomes_available(testbed: TestBed, namespace: str) -> None:
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "containers": [
                        {
                            "name": "main",
                            "image": "ignored",
                            "command": ["python", "-m", "http.server", "8000", "--bind", "$(POD_IP)"],
                            "readinessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 1},
                        }
                    ],
                },
            },
        },
    }
    apply(testbed, namespace, dep)
    with testbed.api_client() as api:
        apps: Any = client.AppsV1Api(api)
        wait_for(
            lambda: apps.read_namespaced_deployment("web", namespace).status.available_replicas == 2,
            timeout=60,
            desc="deployment web to have 2 available replicas",
        )
        pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector="app=web").items
    assert len({p.status.pod_ip for p in pods}) == 2
