"""The LLM part of `trtforge demo`: SmolLM2 quantized by its Job, served by llama.cpp's server under
`trtforge serve-llm` on the CPU node, and a chat completion with the `openai` client.

On the test bed this is llama.cpp (backend `llama.cpp`), never TensorRT-LLM (docs/llm.md).
"""

from __future__ import annotations

import logging
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

from trtforge_dev.demo_groups import STEPS as GROUP_STEPS
from trtforge_dev.demo_groups import group_story

STEPS = 3 + GROUP_STEPS
QUESTION = "What is the capital of France?"


class Story(Protocol):
    def step(self, title: str) -> None: ...
    def say(self, text: str) -> None: ...


def llm_story(tb: Any, story: Story, keep: bool) -> None:
    """Quantize, serve, chat; everything it made goes unless `keep`."""
    from kubernetes.client.rest import ApiException

    from trtforge_dev.localdev import OperatorEnv, deployment_manifest
    from trtforge_dev.testbed import llama, smollm2
    from trtforge_dev.testbed.endpoints import openai_addresses
    from trtforge_dev.testbed.wait import wait_for

    ns = f"demo-llm-{secrets.token_hex(2)}"
    story.step("An LLM: a TRTEngine naming SmolLM2-135M (GGUF), recipe bf16, quantized by its Job")
    env = OperatorEnv(
        tb,
        Path(tempfile.mkdtemp(prefix="trtforge-demo-llm-")),
        [ns],
        build={"llama_bin_dir": str(llama.bin_dir()), "cpu": "1", "memory": "2Gi"},
    )
    try:
        env.start()  # LLM pods read their checkpoint through the broker, as engine pods do
        gguf = smollm2.smollm2_gguf()
        shutil.copyfile(gguf, env.models_dir / gguf.name)
        engine = smollm2.engine_manifest()
        t0 = time.monotonic()
        env.apply(engine, ns)
        eng = env.wait_true("trtengines", ns, "smollm2", timeout=600)
        ck = eng["status"]["checkpoint"]
        ppl = ck.get("perplexity") or {}
        story.say(
            f"checkpoint {ck['checkpointKey'][:12]}… {ck.get('quantizedType')} by {ck.get('backend')} "
            f"in {time.monotonic() - t0:.0f}s; perplexity {ppl.get('source')} -> {ppl.get('result')}"
        )

        story.step("An InferenceDeployment: trtforge serve-llm starts llama-server, Ready on its canary")
        path = f"{llama.llama_bin('llama-server').parent}:{Path(sys.executable).parent}:/usr/bin:/bin"
        pod_env = [{"name": "PATH", "value": path}]  # llama-server and ggml-rpc-server, as in the image
        infd = deployment_manifest("chat", "smollm2", llm={"server": "llama.cpp"}, runtime={"env": pod_env})
        t1 = time.monotonic()
        env.apply(infd, ns)
        got = env.wait_true("inferencedeployments", ns, "chat", timeout=600)
        story.say(
            f"Ready {got['status']['ready']} in {time.monotonic() - t1:.0f}s; {got['status']['endpoint']}"
        )
        for line in tb.kubectl("get", "infd", "-n", ns, "-o", "wide").stdout.splitlines():
            story.say(f"  {line}")

        story.step("A chat completion with the openai client, through the Service's openai port")
        for name in ("httpx", "httpx2"):  # the openai client's per-request log lines
            logging.getLogger(name).setLevel(logging.WARNING)
        found = wait_for(
            lambda: openai_addresses(env.api, ns, "chat"),
            timeout=120,
            desc="the Service's endpoints",
            ignore=(ApiException,),
        )
        story.say(f"user: {QUESTION}  smollm2: {_chat(*found[0], 'chat')!r}")

        group_story(env, story, ns, pod_env, _chat)
        if keep:
            story.say(f"LLM operator log: {env.op.log}")
    finally:
        if not keep:
            env.close()


def _chat(ip: str, port: int, model: str) -> str:
    """One greedy chat completion with the openai client."""
    from openai import OpenAI

    chat = OpenAI(base_url=f"http://{ip}:{port}/v1", api_key="none", max_retries=0, timeout=120)
    reply = chat.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=24, temperature=0
    )
    return str(reply.choices[0].message.content)
