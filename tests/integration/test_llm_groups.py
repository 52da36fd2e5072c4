"""Rank groups made by the operator on the test bed (docs/llm.md §"Groups"): a TRTEngine whose H100
target maps tensor 16 (two of the test bed's four 8-GPU H100 nodes) is quantized and tuned, and an
InferenceDeployment of it (group backend native) is one group of two rank pods, made and owned by the
operator: rank 1 runs llama.cpp's `ggml-rpc-server` under `serve-llm --rank 1`, rank 0
`llama-server --rpc` under `serve-llm`, on two emulated nodes, under the emulated kubelet's probes.
The ranks meet across the pods, and the real `openai` client chats through the Service, which selects
only a whole group's leader (resolved to a pod IP from its EndpointSlices: the test bed has no
kube-proxy).

Killing rank 1's process tears the whole group down (both pods deleted, the leader out of the Service
meanwhile) and the operator recreates it under the same names; it answers again. An emulated Xid on
rank 1's GPU does the same with the fault recorded from rank 1's termination message: the group is
recreated whole on two other H100 nodes while the faulted GPU is still down, and answers again.

With groupBackend lws and no LeaderWorkerSet CRD, the deployment is refused with a condition and
nothing is made; with kubernetes-sigs/lws's real CRD, the operator's LeaderWorkerSet is accepted and
its `Available` condition (written here as LWS's controller would: none runs on the test bed) makes
the groups whole. Waiting requests on the leader make the real HPA scale the InferenceDeployment (its
replicas count groups) and the operator adds a second group, which becomes whole on the other two
H100 nodes.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from trtforge_dev.localdev import OperatorEnv, condition, delete_with_cleanup, deployment_manifest
from trtforge_dev.testbed import llama, smollm2
from trtforge_dev.testbed.endpoints import openai_addresses
from trtforge_dev.testbed.wait import wait_for
from trtforge_operator.apply import lws

from tests.integration import lws_crd

pytestmark = [pytest.mark.integration, pytest.mark.long]

H100 = "NVIDIA-H100-80GB-HBM3"
GROUP = "trtforge.io/group"
RANK = "trtforge.io/rank"
WHOLE = "trtforge.io/group-whole"
RANK_PORT = 50052
SUSPECT_TTL_S = 5  # the node stays avoided while its GPU is unhealthy; this long after it heals


@pytest.fixture(scope="module")
def env(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorEnv]:
    e = OperatorEnv(
        testbed,
        tmp_path_factory.mktemp("llm-groups"),
        [f"grp-{secrets.token_hex(3)}"],
        build={
            "llama_bin_dir": str(llama.bin_dir()),
            "cpu": "1",
            "memory": "2Gi",
            "llm_perplexity_chunks": 3,
            "llm_bench_repetitions": 1,
        },
        faults={"suspect_node_ttl_seconds": SUSPECT_TTL_S},
    )
    e.start()
    try:
        yield e
    finally:
        e.close()


@pytest.fixture(scope="module")
def engine(env: OperatorEnv) -> dict[str, Any]:
    """SmolLM2 quantized, and tuned for H100 with tensor 16: two whole 8-GPU nodes per replica."""
    ns = env.tenants[0]
    gguf = smollm2.smollm2_gguf()
    model = env.models_dir / gguf.name
    if not model.exists():
        shutil.copyfile(gguf, model)
    env.apply(smollm2.engine_manifest(targets=[{"gpu": H100, "parallelism": {"tensor": 16}}]), ns)
    return env.wait_true("trtengines", ns, "smollm2", timeout=600)


def _path() -> str:
    """The pods find llama-server and ggml-rpc-server on PATH, as in the runtime image."""
    return (
        f"{llama.llama_bin('llama-server').parent}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
    )


@pytest.fixture(scope="module")
def group(env: OperatorEnv, engine: dict[str, Any]) -> Iterator[str]:
    ns = env.tenants[0]
    infd = deployment_manifest(
        "grp",
        "smollm2",
        replicas=1,
        llm={"server": "llama.cpp"},
        runtime={"env": [{"name": "PATH", "value": _path()}]},
        targets=[{"gpu": H100}],
    )
    env.apply(infd, ns)
    try:
        yield ns
    finally:
        delete_with_cleanup(env.api, ns, "inferencedeployments", "grp")


def _group_pods(env: OperatorEnv, ns: str) -> list[Any]:
    pods = env.pods(ns, f"{GROUP}=grp-g0")
    # Never a duplicate: one pod per rank name, whatever the pass or the moment.
    assert len(pods) <= 2 and len({p.metadata.name for p in pods}) == len(pods), [
        p.metadata.name for p in pods
    ]
    return pods


def _ready(p: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())


def _chat(env: OperatorEnv, ns: str) -> str:
    from openai import OpenAI

    ip, port = wait_for(
        lambda: openai_addresses(env.api, ns, "grp"),
        timeout=300,
        desc="a whole group behind the Service",
        ignore=(ApiException,),
    )[0]
    leader = next(p for p in _group_pods(env, ns) if p.metadata.labels.get(RANK) == "0")
    assert ip == leader.status.pod_ip, "the Service sends traffic to the group's leader only"
    c = OpenAI(base_url=f"http://{ip}:{port}/v1", api_key="none", max_retries=0, timeout=120)
    reply = c.chat.completions.create(
        model="grp", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8, temperature=0
    )
    content = reply.choices[0].message.content
    assert content
    return content


def _whole(env: OperatorEnv, ns: str) -> dict[str, Any] | None:
    obj = env.get("inferencedeployments", ns, "grp")
    groups, ready = condition(obj, "Groups"), condition(obj, "Ready")
    ok = groups and groups["status"] == "True" and ready and ready["status"] == "True"
    return obj if ok else None


def _recreated(env: OperatorEnv, ns: str, before: set[str]) -> bool:
    pods = _group_pods(env, ns)
    return len(pods) == 2 and not ({p.metadata.uid for p in pods} & before)


def test_the_operator_makes_a_two_rank_group_whose_ranks_meet_and_serve_through_its_service(
    env: OperatorEnv, group: str
) -> None:
    ns = group
    obj = wait_for(lambda: _whole(env, ns), timeout=600, desc="grp's group whole and Ready")
    assert condition(obj, "Groups")["reason"] == "GroupsWhole"
    assert obj["status"]["selector"] == (
        "app.kubernetes.io/name=trtforge,trtforge.io/inferencedeployment=grp,trtforge.io/rank=0"
    )
    assert _chat(env, ns)  # once the leader is labelled whole, the Service has it
    pods = {p.metadata.labels[RANK]: p for p in _group_pods(env, ns)}
    assert sorted(pods) == ["0", "1"]
    assert {p.metadata.name for p in pods.values()} == {"grp-g0-0", "grp-g0-1"}
    # each rank a whole H100 node of its own, owned by the InferenceDeployment, under the group's
    # headless Service, never restarted by the kubelet
    nodes = {p.spec.node_name for p in pods.values()}
    assert len(nodes) == 2 and all(n.startswith("gpu-h100-") for n in nodes), nodes
    for p in pods.values():
        (owner,) = p.metadata.owner_references
        assert (owner.kind, owner.name, owner.controller) == ("InferenceDeployment", "grp", True)
        assert (p.spec.hostname, p.spec.subdomain, p.spec.restart_policy) == (
            p.metadata.name,
            "grp-g0",
            "Never",
        )
        assert p.spec.containers[0].resources.limits["nvidia.com/gpu"] == "8"
    assert pods["0"].metadata.labels.get(WHOLE) == "true" and WHOLE not in pods["1"].metadata.labels
    leader_cmd = pods["0"].spec.containers[0].command
    assert f"{pods['1'].status.pod_ip}:{RANK_PORT}:8000" in leader_cmd
    worker_cmd = pods["1"].spec.containers[0].command
    assert worker_cmd[worker_cmd.index("--rank") + 1] == "1" and "--checkpoint" not in worker_cmd
    core: Any = client.CoreV1Api(env.api)
    headless = core.read_namespaced_service("grp-g0", ns)
    assert headless.spec.cluster_ip == "None" and headless.spec.publish_not_ready_addresses
    net: Any = client.NetworkingV1Api(env.api)
    policy = net.read_namespaced_network_policy("grp-g0-ranks", ns)
    assert policy.spec.ingress[0].ports[0].port == RANK_PORT


def test_a_dead_rank_tears_the_group_down_whole_and_it_is_recreated_and_answers_again(
    env: OperatorEnv, group: str
) -> None:
    ns = group
    wait_for(lambda: _whole(env, ns), timeout=600, desc="grp whole")
    pods = {p.metadata.labels[RANK]: p for p in _group_pods(env, ns)}
    before = {p.metadata.uid for p in pods.values()}
    os.kill(llama.rpc_server_pid(pods["1"].status.pod_ip, RANK_PORT), signal.SIGKILL)  # rank 1's process dies
    # No traffic while the group is not whole: the leader leaves the Service at once.
    wait_for(
        lambda: not openai_addresses(env.api, ns, "grp"), timeout=120, desc="the leader out of the Service"
    )
    wait_for(lambda: _recreated(env, ns, before), timeout=300, desc="the whole group recreated")
    obj = wait_for(lambda: _whole(env, ns), timeout=600, desc="the new group whole")
    assert _chat(env, ns)
    events: Any = client.CoreV1Api(env.api).list_namespaced_event(
        ns, field_selector="involvedObject.name=grp"
    )
    assert any(e.reason == "GroupTornDown" for e in events.items), [e.reason for e in events.items]
    assert not obj["status"].get("faults"), "a dead rank process is no GPU fault"


def test_an_xid_under_rank_1_tears_the_group_down_keeps_its_node_out_and_the_group_serves_again(
    env: OperatorEnv, group: str
) -> None:
    ns = group
    wait_for(lambda: _whole(env, ns), timeout=600, desc="grp whole")
    pods = {p.metadata.labels[RANK]: p for p in _group_pods(env, ns)}
    victim = pods["1"].spec.node_name
    before = {p.metadata.uid for p in pods.values()}
    injected = time.time() - 1
    env.tb.fault(victim, xid=79)
    try:

        def recorded() -> dict[str, Any] | None:
            obj = env.get("inferencedeployments", ns, "grp")
            return next(
                (
                    f
                    for f in (obj.get("status") or {}).get("faults") or []
                    if f.get("node") == victim and f.get("pod") == "grp-g0-1" and _after(f, injected)
                ),
                None,
            )

        fault = wait_for(recorded, timeout=180, desc="rank 1's GPU fault recorded")
        # From rank 1's termination message (Xid and GPU), or first from the node's GPU count dropping
        # (the emulated device plugin's), whichever the operator saw first.
        assert fault.get("xid") == 79 or fault.get("nodeProblem") == "AllocatableDropped", fault
        assert fault["action"].startswith("PodMoved"), fault
        wait_for(lambda: not openai_addresses(env.api, ns, "grp"), timeout=120, desc="no endpoint")

        def avoiding() -> bool:
            new = [p for p in _group_pods(env, ns) if p.metadata.uid not in before]
            required = [
                p.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution for p in new
            ]
            terms = [e for r in required for t in r.node_selector_terms for e in t.match_fields or ()]
            return bool(new) and all(victim in (e.values or ()) for e in terms) and len(terms) == len(new)

        # Recreated away from the faulted node: every new rank pod keeps off it, and the group forms
        # whole on two other H100 nodes while the faulted GPU is still down.
        wait_for(avoiding, timeout=300, desc="the recreated group's pods avoiding the faulted node")
        wait_for(
            lambda: _recreated(env, ns, before) and _whole(env, ns), timeout=600, desc="the group whole again"
        )
        now_on = {p.spec.node_name for p in _group_pods(env, ns)}
        assert victim not in now_on and len(now_on) == 2, now_on
        assert _chat(env, ns)
    finally:
        env.tb.heal(victim)


def _after(f: dict[str, Any], t: float) -> bool:
    from datetime import datetime

    return datetime.fromisoformat(f["time"].replace("Z", "+00:00")).timestamp() >= t


def test_lws_is_refused_without_its_crd_and_with_it_the_apiserver_takes_the_operators_leaderworkerset(
    env: OperatorEnv, engine: dict[str, Any]
) -> None:
    ns = env.tenants[0]
    infd = deployment_manifest(
        "grp-lws",
        "smollm2",
        replicas=1,
        llm={"server": "llama.cpp", "groupBackend": "lws"},
        targets=[{"gpu": H100}],
    )
    env.tb.kubectl("delete", "crd", lws.CRD_NAME, "--ignore-not-found", "--wait=true")
    env.apply(infd, ns)
    co: Any = client.CustomObjectsApi(env.api)
    try:

        def groups_reason(reason: str) -> dict[str, Any] | None:
            c = condition(env.get("inferencedeployments", ns, "grp-lws"), "Groups")
            return c if c and c["reason"] == reason else None

        c = wait_for(
            lambda: groups_reason(lws.CRD_MISSING), timeout=120, desc="grp-lws refused without the CRD"
        )
        assert c["status"] == "False" and lws.CRD_NAME in c["message"]
        assert not env.pods(ns, "trtforge.io/inferencedeployment=grp-lws")
        apps: Any = client.AppsV1Api(env.api)
        assert not apps.list_namespaced_deployment(
            ns, label_selector="trtforge.io/inferencedeployment=grp-lws"
        ).items

        lws_crd.install(env.tb)  # the real CRD: the operator's next passes make the LeaderWorkerSet
        args = (lws.GROUP, lws.VERSION, ns, lws.PLURAL)
        name = "grp-lws-h100-80gb-hbm3"
        live = wait_for(
            lambda: _get_or_none(co, args, name),
            timeout=120,
            desc="the LeaderWorkerSet",
            ignore=(ApiException,),
        )
        tmpl = live["spec"]["leaderWorkerTemplate"]
        assert (live["spec"]["replicas"], tmpl["size"], tmpl["restartPolicy"]) == (
            1,
            2,
            lws.RESTART_RECREATE_GROUP,
        )
        assert tmpl["leaderTemplate"]["metadata"]["labels"]["trtforge.io/rank"] == "0"
        assert "--lws" in tmpl["workerTemplate"]["spec"]["containers"][0]["command"]
        assert live["metadata"]["ownerReferences"][0]["kind"] == "InferenceDeployment"
        wait_for(lambda: groups_reason("GroupsForming"), timeout=120, desc="grp-lws forming")
        # Available, as LeaderWorkerSet's controller writes it: the groups are whole
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        available = {
            "type": "Available",
            "status": "True",
            "reason": "AllGroupsReady",
            "message": "All replicas are ready",
            "lastTransitionTime": now,
        }
        status = {"conditions": [available], "observedGeneration": live["metadata"]["generation"]}
        co.patch_namespaced_custom_object_status(*args, name, {"status": status})
        wait_for(lambda: groups_reason("GroupsWhole"), timeout=120, desc="grp-lws whole from Available")
        # the operator's passes since wrote nothing more: its semantic-equality check sees no change
        assert (
            co.get_namespaced_custom_object(*args, name)["metadata"]["generation"]
            == live["metadata"]["generation"]
        )
    finally:
        delete_with_cleanup(env.api, ns, "inferencedeployments", "grp-lws")
        lws_crd.remove(env.tb)


def _get_or_none(co: Any, args: tuple[str, ...], name: str) -> dict[str, Any] | None:
    try:
        return dict(co.get_namespaced_custom_object(*args, name))
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def test_waiting_requests_make_the_hpa_add_one_whole_group(env: OperatorEnv, group: str) -> None:
    """The HPA scales the InferenceDeployment (its scale subresource counts groups and selects their
    leaders) on the leader's waiting requests; the operator adds group g1, which becomes whole on the
    two H100 nodes g0 leaves free, while g0 is left as it was."""
    from trtforge_dev.testbed import metrics_adapter

    ns = group
    wait_for(lambda: _whole(env, ns), timeout=600, desc="grp whole")
    ip, port = openai_addresses(env.api, ns, "grp")[0]
    auto = {"minReplicas": 1, "maxReplicas": 2, "metric": "QueueDepth", "targetValue": "1"}
    co: Any = client.CustomObjectsApi(env.api)
    with metrics_adapter.registered(env.tb, env.api):
        co.patch_namespaced_custom_object(
            "trtforge.io", "v1alpha1", ns, "inferencedeployments", "grp", {"spec": {"autoscaling": auto}}
        )
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

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(12)]  # 4 slots decode
        for t in threads:
            t.start()
        try:

            def second_group() -> list[Any] | None:
                # Read while the load lasts: once it stops, the HPA scales back to one group.
                obj = env.get("inferencedeployments", ns, "grp")
                g1 = env.pods(ns, f"{GROUP}=grp-g1")
                c = condition(obj, "Groups")
                counted = c is not None and "2/2 groups whole" in c["message"]
                return g1 if obj["spec"]["replicas"] == 2 and len(g1) == 2 and counted else None

            g1 = wait_for(second_group, timeout=600, desc="the HPA asked for a second group and it is whole")
        finally:
            stop.set()
            for t in threads:
                t.join(150)
    assert answered[0] > 0
    hpa: Any = client.AutoscalingV1Api(env.api).read_namespaced_horizontal_pod_autoscaler(
        "grp-h100-80gb-hbm3", ns
    )
    assert (hpa.spec.scale_target_ref.kind, hpa.spec.scale_target_ref.name) == ("InferenceDeployment", "grp")
    assert {p.metadata.name for p in g1} == {"grp-g1-0", "grp-g1-1"}
    g0 = _group_pods(env, ns)
    assert len(g0) == 2  # group g0 untouched
    assert not {p.spec.node_name for p in g1} & {p.spec.node_name for p in g0}


def _post(ip: str, port: int, path: str, body: dict[str, Any], timeout: float = 120) -> tuple[int, Any]:
    import http.client
    import json

    c = http.client.HTTPConnection(ip, port, timeout=timeout)
    try:
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        return r.status, json.loads(raw) if raw else None
    finally:
        c.close()
