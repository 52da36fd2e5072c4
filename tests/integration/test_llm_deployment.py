"""An LLM engine end to end on the test bed: a TRTEngine naming the SmolLM2 GGUF (recipe bf16, a
cpu and an H100 target) is quantized by its Job and tuned per target, an InferenceDeployment serves
it on the CPU node with a real llama.cpp server under `trtforge serve-llm`, the real `openai` client
gets a chat completion through the Service's `openai` port (resolved to a pod IP from the Service's
EndpointSlices: the test bed has no kube-proxy), the canary's golden tokens are the quantize Job's,
and a bounded burst of concurrent requests on loopback makes requests wait (llama.cpp's
`requests_deferred`) so the real HPA adds a replica.

A second InferenceDeployment serves the H100 target (llama.cpp on the emulated GPU node): an emulated
Xid on its pod's GPU ends the pod with the GPU-fault message, the operator moves it to the other H100
node and re-runs that target's tune Job (a re-tune, no quantize Job), and it serves again.

Runtime pods read the checkpoint and tuning cache through the engine broker, the default (no
`runtime_store_uri`), presenting their projected token, as engine pods do.
"""

from __future__ import annotations

import json
import secrets
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from trtforge_dev.localdev import OperatorEnv, delete_with_cleanup, deployment_manifest
from trtforge_dev.testbed import llama, smollm2
from trtforge_dev.testbed.endpoints import openai_addresses
from trtforge_dev.testbed.wait import wait_for

from trtforge.contract.llm import ArtefactKind, ArtefactManifest, golden_request, manifest_path

pytestmark = [pytest.mark.integration, pytest.mark.long]

RUNTIME = "app.kubernetes.io/component=runtime"
CANARY = smollm2.CANARY_PROMPT
H100 = "NVIDIA-H100-80GB-HBM3"
BUILD_KIND = "trtforge.io/build-kind"


@pytest.fixture(scope="module")
def env(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorEnv]:
    tag = secrets.token_hex(3)
    bins = str(llama.bin_dir())
    e = OperatorEnv(
        testbed,
        tmp_path_factory.mktemp("llm-deploy"),
        [f"llm-{tag}"],
        build={
            "llama_bin_dir": bins,
            "cpu": "1",
            "memory": "2Gi",
            "llm_perplexity_chunks": 3,
            "llm_bench_repetitions": 1,
        },
    )
    e.start()
    try:
        yield e
    finally:
        e.close()


@pytest.fixture(scope="module")
def custom_metrics(env: OperatorEnv) -> Iterator[None]:
    """The test bed's custom metrics API, serving the runtime pods' own /metrics (port `http`)."""
    from trtforge_dev.testbed import metrics_adapter

    with metrics_adapter.registered(env.tb, env.api):
        yield


def _post(ip: str, port: int, path: str, body: dict[str, Any], timeout: float = 120) -> tuple[int, Any]:
    import http.client

    c = http.client.HTTPConnection(ip, port, timeout=timeout)
    try:
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        return r.status, json.loads(raw) if raw else None
    finally:
        c.close()


@pytest.fixture(scope="module")
def smollm2_engine(env: OperatorEnv) -> dict[str, Any]:
    """The SmolLM2 TRTEngine, quantized and tuned for its cpu and H100 targets (Ready)."""
    ns = env.tenants[0]
    gguf = smollm2.smollm2_gguf()
    model = env.models_dir / gguf.name
    if not model.exists():
        shutil.copyfile(gguf, model)
    env.apply(smollm2.engine_manifest(targets=[{"gpu": "cpu"}, {"gpu": H100}]), ns)
    return env.wait_true("trtengines", ns, "smollm2", timeout=600)


def _server_path() -> str:
    """The pods find llama-server on PATH, as they would in the runtime image."""
    return (
        f"{llama.llama_bin('llama-server').parent}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
    )


def test_a_quantized_llm_is_served_chats_through_its_service_and_scales_on_waiting_requests(
    env: OperatorEnv, custom_metrics: None, smollm2_engine: dict[str, Any]
) -> None:
    from openai import OpenAI

    ns = env.tenants[0]
    eng = smollm2_engine
    ckpt = eng["status"]["checkpoint"]
    assert ckpt["phase"] == "Ready" and ckpt["backend"] == "llama.cpp", ckpt
    key = ckpt["checkpointKey"]
    manifest = ArtefactManifest.model_validate_json(
        (env.store_dir / manifest_path(ArtefactKind.CHECKPOINT, key)).read_text()
    )
    assert manifest.checkpoint is not None and manifest.checkpoint.golden is not None
    golden = manifest.checkpoint.golden
    assert golden.prompt == CANARY and len(golden.tokens) == 8

    auto = {"minReplicas": 1, "maxReplicas": 2, "metric": "QueueDepth", "targetValue": "1"}
    infd = deployment_manifest(
        "chat",
        "smollm2",
        replicas=1,
        llm={"server": "llama.cpp"},
        runtime={"env": [{"name": "PATH", "value": _server_path()}]},
        autoscaling=auto,
        targets=[{"gpu": "cpu"}],
    )
    env.apply(infd, ns)
    try:
        got = env.wait_true("inferencedeployments", ns, "chat", timeout=600)
        assert got["status"]["server"] == "llama.cpp"
        assert got["status"]["endpoint"] == f"http://chat.{ns}.svc:8080/v1"
        wide = env.tb.kubectl("get", "infd", "chat", "-n", ns, "-o", "wide").stdout
        assert "llama.cpp" in wide and "1/1" in wide, wide
        # the ready pod fetched its checkpoint through the broker (the default --store)
        (pod,) = [p for p in env.pods(ns, RUNTIME) if not p.metadata.deletion_timestamp]
        cmd = pod.spec.containers[0].command
        assert cmd[cmd.index("--store") + 1].startswith("http://"), cmd

        addrs = wait_for(
            lambda: openai_addresses(env.api, ns, "chat"),
            timeout=120,
            desc="the Service's endpoints",
            ignore=(ApiException,),
        )
        ip, port = addrs[0]
        c = OpenAI(base_url=f"http://{ip}:{port}/v1", api_key="none", max_retries=0, timeout=120)
        reply = c.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=8,
            temperature=0,
        )
        assert reply.choices[0].message.content
        assert reply.usage is not None and reply.usage.completion_tokens > 0

        # The served model's greedy tokens for the canary are the quantize Job's golden tokens.
        status, body = _post(ip, port, "/completion", golden_request(golden.prompt, len(golden.tokens)))
        assert status == 200 and body["tokens"] == golden.tokens, body

        _waiting_requests_add_a_replica(env, ns, ip, port)
    finally:
        delete_with_cleanup(env.api, ns, "inferencedeployments", "chat")


def _chat(env: OperatorEnv, ns: str, service: str) -> str:
    """One chat completion with the `openai` client through the Service's first ready endpoint."""
    from openai import OpenAI

    ip, port = wait_for(
        lambda: openai_addresses(env.api, ns, service),
        timeout=120,
        desc="the Service's endpoints",
        ignore=(ApiException,),
    )[0]
    c = OpenAI(base_url=f"http://{ip}:{port}/v1", api_key="none", max_retries=0, timeout=120)
    reply = c.chat.completions.create(
        model=service, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0
    )
    content = reply.choices[0].message.content
    assert content
    return content


def test_an_xid_under_an_llm_pod_moves_it_re_tunes_its_target_and_it_serves_again(
    env: OperatorEnv, smollm2_engine: dict[str, Any]
) -> None:
    ns = env.tenants[0]
    ckey = smollm2_engine["status"]["checkpoint"]["checkpointKey"]
    target = next(t for t in smollm2_engine["status"]["targets"] if t["gpu"] == H100)
    infd = deployment_manifest(
        "chat-h100",
        "smollm2",
        replicas=1,
        llm={"server": "llama.cpp"},
        runtime={"env": [{"name": "PATH", "value": _server_path()}]},
        targets=[{"gpu": H100}],
    )
    selector = f"{RUNTIME},trtforge.io/inferencedeployment=chat-h100"
    env.apply(infd, ns)
    try:
        env.wait_true("inferencedeployments", ns, "chat-h100", timeout=600)
        _chat(env, ns, "chat-h100")
        (victim_pod,) = env.pods(ns, selector)
        victim = victim_pod.spec.node_name
        assert env.node_labels(victim)["nvidia.com/gpu.product"] == H100
        jobs_before = {j.metadata.name for j in env.jobs()}
        injected = time.time() - 1
        env.tb.fault(victim, xid=79)
        try:

            def recovered() -> dict[str, Any] | None:
                obj = env.get("inferencedeployments", ns, "chat-h100")
                done = [
                    f
                    for f in (obj.get("status") or {}).get("faults") or []
                    if f.get("node") == victim
                    and f.get("recoveredSeconds") is not None
                    and _after(f, injected)
                ]
                ready = any(
                    c["type"] == "Ready" and c["status"] == "True" for c in obj["status"]["conditions"]
                )
                return obj if done and ready else None

            obj = wait_for(recovered, timeout=480, desc="chat-h100 recovered and Ready after the Xid")
        finally:
            env.tb.heal(victim)
        fault = next(f for f in obj["status"]["faults"] if f["node"] == victim and _after(f, injected))
        print(f"\nLLM fault on {victim}: {fault}")
        assert (fault["action"], fault["xid"], fault["target"]) == ("PodMovedAndRebuild", 79, target["name"])
        # moved: every pod on another H100 node
        pods = env.pods(ns, selector)
        assert pods and all(p.spec.node_name != victim for p in pods)
        assert {env.node_labels(p.spec.node_name)["nvidia.com/gpu.product"] for p in pods} == {H100}
        # re-tuned: exactly one new Job, the target's tune again (--rebuild) off the faulty node; no quantize
        forged = ("quantize", "tune", "rebuild")
        new = [
            j
            for j in env.jobs()
            if j.metadata.name not in jobs_before and j.metadata.labels.get(BUILD_KIND) in forged
        ]
        (retune,) = new
        assert retune.metadata.labels[BUILD_KIND] == "rebuild"
        assert retune.metadata.name.startswith(f"trtforge-build-{ckey[:20]}-rb")
        command = retune.spec.template.spec.containers[0].command
        assert command[:2] == ["trtforge", "tune"] and "--rebuild" in command and H100 in command
        assert retune.status.succeeded == 1
        (rt_pod,) = env.pods(env.build_ns, f"job-name={retune.metadata.name}")
        assert rt_pod.spec.node_name != victim
        eng = env.get("trtengines", ns, "smollm2")
        assert eng["status"]["checkpoint"]["checkpointKey"] == ckey
        again = next(t for t in eng["status"]["targets"] if t["name"] == target["name"])
        assert (again["phase"], again["tuningKey"]) == ("Ready", target["tuningKey"])
        # and it serves again
        _chat(env, ns, "chat-h100")
    finally:
        delete_with_cleanup(env.api, ns, "inferencedeployments", "chat-h100")


def _after(f: dict[str, Any], t: float) -> bool:
    from datetime import datetime

    return datetime.fromisoformat(f["time"].replace("Z", "+00:00")).timestamp() >= t


def _waiting_requests_add_a_replica(env: OperatorEnv, ns: str, ip: str, port: int) -> None:
    """A bounded burst on loopback: 12 workers, each sending completions one after another to one pod
    (4 slots decode, the rest wait) until the HPA has scaled the target to 2 Ready pods."""
    apps: Any = client.AppsV1Api(env.api)
    infd = env.get("inferencedeployments", ns, "chat")
    dname = infd["status"]["targets"][0]["deploymentName"]
    stop = threading.Event()
    answered = [0]

    def worker() -> None:
        body = {"prompt": "Once upon a time", "n_predict": 48, "temperature": 0}
        while not stop.is_set():
            try:
                if _post(ip, port, "/completion", body)[0] == 200:
                    answered[0] += 1
            except OSError:
                stop.wait(0.5)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(12)]
    for t in threads:
        t.start()
    try:

        def scaled() -> bool:
            d = apps.read_namespaced_deployment(dname, ns)
            ready = [p for p in env.pods(ns, RUNTIME) if p.status.container_statuses and all(
                s.ready for s in p.status.container_statuses
            )]  # fmt: skip
            return bool(d.spec.replicas == 2 and len(ready) == 2)

        wait_for(scaled, timeout=600, desc="the HPA added a replica on waiting requests")
    finally:
        stop.set()
        for t in threads:
            t.join(150)
    assert answered[0] > 0
