"""A 2-rank llama.cpp group as two pods on two emulated nodes of the test bed, under the emulated
kubelet's real probes: the worker pod runs `ggml-rpc-server` under `serve-llm --rank 1`, the leader pod
`llama-server --rpc` under `serve-llm --world-size 2`, and the ranks meet across the pods' addresses.
The `openai` client gets a chat completion from the ready endpoint of the leader's Service. Killing rank
1's process makes the leader pod not ready at once and restarts both; the group meets again and answers
again. The pods are made here, as the operator's native backend will make them (not wired yet)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from trtforge_dev.testbed import llama
from trtforge_dev.testbed.handle import TestBed
from trtforge_dev.testbed.wait import wait_for

from tests.integration.llm_bed import CANARY_PROMPT, golden_tokens, llama_server, smollm2_gguf

pytestmark = pytest.mark.integration

GROUP = {"trtforge.io/group": "smollm2-g0"}
RANK_PORT, PROBE_PORT, SERVER_PORT = 50052, 8000, 8080


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> list[int]:
    return golden_tokens(llama_server(), smollm2_gguf(), tmp_path_factory.mktemp("golden"))


def _pod(name: str, node: str, rank: int, args: list[str]) -> dict[str, Any]:
    probe = {"port": PROBE_PORT}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {**GROUP, "trtforge.io/rank": str(rank)}},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "runtime",
                    "image": "ignored",
                    "command": [
                        "python",
                        "-m",
                        "trtforge.cli",
                        "serve-llm",
                        "--host",
                        "$(POD_IP)",
                        "--probe-port",
                        str(PROBE_PORT),
                        "--threads",
                        "1",
                        *args,
                    ],
                    "env": [{"name": "TRTFORGE_GPU_PROBE", "value": "none"}],
                    "readinessProbe": {"httpGet": {"path": "/v2/health/ready", **probe}, "periodSeconds": 1},
                    "livenessProbe": {
                        "httpGet": {"path": "/v2/health/live", **probe},
                        "periodSeconds": 1,
                        "failureThreshold": 3,
                    },
                }
            ],
        },
    }


def _read(tb: TestBed, ns: str, name: str) -> Any:
    with tb.api_client() as api:
        return client.CoreV1Api(api).read_namespaced_pod(name, ns)


def _ready(p: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())


def _restarts(p: Any) -> int:
    return sum(s.restart_count for s in p.status.container_statuses or ())


def _service_endpoint(tb: TestBed, ns: str) -> str | None:
    """The leader Service's ready endpoint, read as kube-proxy would (the test bed's endpoints
    controller leaves its 127.N.x.y pod addresses out)."""
    with tb.api_client() as api:
        core: Any = client.CoreV1Api(api)
        svc = core.read_namespaced_service("smollm2", ns)
        sel = ",".join(f"{k}={v}" for k, v in svc.spec.selector.items())
        pods = [p for p in core.list_namespaced_pod(ns, label_selector=sel).items if _ready(p)]
    return f"http://{pods[0].status.pod_ip}:{SERVER_PORT}/v1" if pods else None


def _chat(base_url: str) -> str:
    from openai import OpenAI

    c = OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)
    reply = c.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8, temperature=0
    )
    content = reply.choices[0].message.content
    assert content
    return content


def _rank_process(worker_ip: str) -> int:
    """The pid of rank 1's ggml-rpc-server (listening on the worker pod's address)."""
    want = ["-H", worker_ip, "-p", str(RANK_PORT)]
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv and argv[0].endswith("ggml-rpc-server") and argv[1:5] == want:
            return int(d.name)
    raise AssertionError(f"no ggml-rpc-server on {worker_ip}:{RANK_PORT}")


@pytest.fixture
def group(testbed: TestBed, namespace: str, golden: list[int]) -> Iterator[tuple[str, str]]:
    worker = _pod("smollm2-g0-1", "gpu-h100-1", 1, [
        "--rank", "1", "--world-size", "2", "--rank-port", str(RANK_PORT),
        "--server-binary", str(llama.llama_bin("ggml-rpc-server")),
    ])  # fmt: skip
    testbed.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(worker))
    ip = wait_for(
        lambda: _read(testbed, namespace, "smollm2-g0-1").status.pod_ip, timeout=120, desc="worker IP"
    )
    leader = _pod("smollm2-g0-0", "gpu-h100-0", 0, [
        "--world-size", "2", "--worker", f"{ip}:{RANK_PORT}:{PROBE_PORT}", "--port", str(SERVER_PORT),
        "--model", str(smollm2_gguf()), "--model-name", "smollm2", "--server-binary", str(llama_server()),
        "--ctx-size", "1024", "--parallel", "1", "--canary-prompt", CANARY_PROMPT,
        "--golden-tokens", ",".join(map(str, golden)), "--rank-loss-linger", "2",
    ])  # fmt: skip
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "smollm2"},
        "spec": {"selector": {**GROUP, "trtforge.io/rank": "0"}, "ports": [{"port": SERVER_PORT}]},
    }
    testbed.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all([leader, svc]))
    yield namespace, ip


def test_ranks_meet_across_pods_serve_through_the_service_and_meet_again_after_a_rank_dies(
    testbed: TestBed, group: tuple[str, str]
) -> None:
    ns, worker_ip = group
    url = wait_for(
        lambda: _service_endpoint(testbed, ns), timeout=300, desc="the leader ready behind its Service"
    )
    assert _chat(url)
    leader_restarts = _restarts(_read(testbed, ns, "smollm2-g0-0"))

    os.kill(_rank_process(worker_ip), signal.SIGKILL)  # rank 1's process dies
    # No endpoint while the group is not whole (the leader's readiness drops; it is then restarted).
    wait_for(
        lambda: _service_endpoint(testbed, ns) is None, timeout=120, desc="the leader out of its Service"
    )
    wait_for(
        lambda: (
            _restarts(_read(testbed, ns, "smollm2-g0-0")) > leader_restarts
            and _restarts(_read(testbed, ns, "smollm2-g0-1")) > 0
        ),
        timeout=180,
        desc="both ranks restarted",
    )
    url = wait_for(lambda: _service_endpoint(testbed, ns), timeout=300, desc="the group whole again")
    assert _chat(url)
