"""The group part of `trtforge demo`'s LLM story: SmolLM2 mapped to tensor 16 on H100 (two of the
test bed's 8-GPU nodes), so one replica is a group of two rank pods that the operator makes; rank 1's
process is killed and the group is torn down whole, recreated and answers again.

On the test bed the ranks are llama.cpp's RPC backend (`ggml-rpc-server` on rank 1, `llama-server
--rpc` on rank 0) on CPUs, never TensorRT-LLM (docs/llm.md §"Groups").
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any, Protocol

STEPS = 2
H100 = "NVIDIA-H100-80GB-HBM3"
RANK = "trtforge.io/rank"
RANK_PORT = 50052


class Story(Protocol):
    def step(self, title: str) -> None: ...
    def say(self, text: str) -> None: ...


Chat = Callable[[str, int, str], str]  # (ip, port, model) -> the reply


def group_story(env: Any, story: Story, ns: str, pod_env: list[dict[str, str]], chat: Chat) -> None:
    from kubernetes.client.rest import ApiException

    from trtforge_dev.localdev import condition, deployment_manifest
    from trtforge_dev.testbed import llama, smollm2
    from trtforge_dev.testbed.endpoints import openai_addresses
    from trtforge_dev.testbed.wait import wait_for

    story.step("A 2-rank group: tensor 16 on H100 is two 8-GPU nodes, so a replica is two rank pods")
    t0 = time.monotonic()
    env.apply(
        smollm2.engine_manifest("smollm2-tp16", targets=[{"gpu": H100, "parallelism": {"tensor": 16}}]), ns
    )
    eng = env.wait_true("trtengines", ns, "smollm2-tp16", timeout=600)
    target = eng["status"]["targets"][0]
    story.say(
        f"TRTEngine smollm2-tp16 Ready in {time.monotonic() - t0:.0f}s: the same checkpoint from the store, "
        f"a tune Job for the mapping (tuning {str(target.get('tuningKey'))[:12]}…)"
    )
    infd = deployment_manifest(
        "grp", "smollm2-tp16", llm={"server": "llama.cpp"}, runtime={"env": pod_env}, targets=[{"gpu": H100}]
    )
    t1 = time.monotonic()
    env.apply(infd, ns)

    def whole() -> dict[str, Any] | None:
        obj = env.get("inferencedeployments", ns, "grp")
        groups, ready = condition(obj, "Groups"), condition(obj, "Ready")
        return obj if groups and groups["status"] == "True" and ready and ready["status"] == "True" else None

    def endpoint() -> tuple[str, int]:
        found = wait_for(
            lambda: openai_addresses(env.api, ns, "grp"),
            timeout=120,
            desc="the Service's endpoint",
            ignore=(ApiException,),
        )
        return found[0]

    wait_for(whole, timeout=600, desc="the group whole and Ready")
    story.say(
        f"group grp-g0 whole in {time.monotonic() - t1:.0f}s (the Service selects whole groups' leaders)"
    )
    pods = _pods(env, ns)
    for p in sorted(pods, key=lambda p: p.metadata.labels[RANK]):
        role = "leader: llama-server --rpc" if p.metadata.labels[RANK] == "0" else "worker: ggml-rpc-server"
        story.say(f"  {p.metadata.name:<10} rank {p.metadata.labels[RANK]} on {p.spec.node_name:<12} {role}")
    ip, port = endpoint()
    story.say(f"grp answers: {chat(ip, port, 'grp')!r}")

    story.step("A rank fault: rank 1's process dies; the group is torn down whole and recreated")
    worker = next(p for p in pods if p.metadata.labels[RANK] == "1")
    before = {p.metadata.uid for p in pods}
    t2 = time.monotonic()
    os.kill(llama.rpc_server_pid(worker.status.pod_ip, RANK_PORT), signal.SIGKILL)
    story.say(f"kill -9 ggml-rpc-server of {worker.metadata.name} on {worker.spec.node_name}")
    wait_for(
        lambda: not openai_addresses(env.api, ns, "grp"),
        timeout=120,
        desc="the leader out of the Service",
        ignore=(ApiException,),
    )
    left = time.monotonic() - t2
    story.say(f"the leader left the Service after {left:.1f}s: no traffic reaches a group that is not whole")

    def recreated() -> bool:
        now = _pods(env, ns)
        return len(now) == 2 and not ({p.metadata.uid for p in now} & before) and whole() is not None

    wait_for(recreated, timeout=600, desc="the group recreated whole")
    ip, port = endpoint()
    reply = chat(ip, port, "grp")
    story.say(f"both rank pods new, whole and answering {time.monotonic() - t2:.0f}s after the kill")
    story.say(f"grp answers: {reply!r}")


def _pods(env: Any, ns: str) -> list[Any]:
    return [p for p in env.pods(ns, "trtforge.io/group=grp-g0") if not p.metadata.deletion_timestamp]
