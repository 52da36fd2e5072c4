"""`trtforge serve-llm` in front of a real llama.cpp server on SmolLM2-135M, called with the real
`openai` client: readiness is health plus the canary's golden tokens, liveness catches a dead or
silent server, and /metrics carries the server's own gauges and the runtime's."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
from trtforge_dev.testbed.metrics_adapter import parse_pod_metrics

from tests.integration.llm_bed import CANARY_PROMPT, Supervised, golden_tokens, llama_server, smollm2_gguf

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[int]]:
    server, gguf = llama_server(), smollm2_gguf()
    return server, gguf, golden_tokens(server, gguf, tmp_path_factory.mktemp("golden"))


def _args(server: Path, gguf: Path, golden: list[int], *extra: str) -> list[str]:
    return [
        "--model", str(gguf), "--model-name", "smollm2", "--server-binary", str(server),
        "--canary-prompt", CANARY_PROMPT, "--golden-tokens", ",".join(map(str, golden)), *extra,
    ]  # fmt: skip


def test_openai_client_chats_with_the_supervised_server(
    bed: tuple[Path, Path, list[int]], tmp_path: Path
) -> None:
    from openai import OpenAI

    server, gguf, golden = bed
    s = Supervised(tmp_path, _args(server, gguf, golden))
    try:
        ready = s.wait_probe("/v2/health/ready", 200)
        assert "equal the golden tokens" in ready["canary"]
        assert s.probe("/v2/health/live")[0] == 200
        client = OpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="none", max_retries=0, timeout=120)
        reply = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=8,
            temperature=0,
        )
        assert reply.choices[0].message.content
        assert reply.usage is not None and reply.usage.completion_tokens > 0
        stream = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "Count to three."}],
            max_tokens=8,
            stream=True,
        )
        assert sum(1 for chunk in stream if chunk.choices and chunk.choices[0].delta.content) > 0
        status, text = s.probe("/metrics")
        assert status == 200
        assert "llamacpp:requests_deferred" in text and "llamacpp:requests_processing" in text
        assert 'trtforge_runtime_queue_depth{model="smollm2"}' in text
        assert 'trtforge_runtime_requests_in_flight{model="smollm2"}' in text
        # What the test bed's metrics adapter (the HPA's custom metrics) reads from a runtime pod.
        seen = parse_pod_metrics(text)
        assert {"trtforge_runtime_queue_depth", "trtforge_runtime_requests_in_flight"} <= set(seen)
    finally:
        s.stop()
    assert s.proc.returncode == 0
    assert s.termination()["reason"] == "Completed"


def test_wrong_golden_tokens_keep_the_pod_live_but_not_ready(
    bed: tuple[Path, Path, list[int]], tmp_path: Path
) -> None:
    server, gguf, golden = bed
    wrong = [golden[0], golden[1] + 1, *golden[2:]]
    s = Supervised(tmp_path, _args(server, gguf, wrong))
    try:
        # Not ready while loading, and still not ready once the canary has run and failed.
        s.wait_probe("/v2/health/live", 200)
        deadline = time.monotonic() + 300
        while True:
            status, body = s.probe("/v2/health/ready")
            assert status == 503, body
            if body and body.get("canary") != "not run":
                break
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert f"token 1 is {golden[1]}; the checkpoint recorded {golden[1] + 1}" in body["canary"]
        assert s.probe("/v2/health/live")[0] == 200
        assert s.termination()["reason"] == "CanaryFailed"
    finally:
        s.stop()


def test_a_dead_server_ends_the_pod_with_the_cause(bed: tuple[Path, Path, list[int]], tmp_path: Path) -> None:
    server, gguf, golden = bed
    s = Supervised(tmp_path, _args(server, gguf, golden))
    try:
        s.wait_probe("/v2/health/ready", 200)
        os.kill(s.server_pid(), signal.SIGKILL)
        assert s.wait_exit() == 1
        msg = s.termination()
        assert msg["reason"] == "Error"
        assert "server process exited" in msg["message"] and "-9" in msg["message"]
    finally:
        s.stop()


def test_an_xid_on_its_gpu_kills_the_server_and_ends_the_pod_with_the_gpu_fault_message(
    bed: tuple[Path, Path, list[int]], tmp_path: Path
) -> None:
    """The supervisor watches the GPU as engine pods do (an emulated device file stands in for NVML)
    and ends with the same termination message: the Xid, the GPU and the devices it was given, which
    the operator needs to believe the report (planning/fault_trust.py)."""
    from trtforge_dev.testbed import gpus

    from trtforge.contract.gpu_probe import EmulatedGPUFile, GPUDevice
    from trtforge.contract.termination import EXIT_GPU_FAULT

    server, gguf, golden = bed
    dev = GPUDevice(index=0, uuid="GPU-llm-0", name="NVIDIA H100 80GB HBM3", memory_mib=81559,
                    compute_capability="9.0", sm_count=132)  # fmt: skip
    gpu_file = tmp_path / "gpus.json"
    EmulatedGPUFile(node="n1", devices=[dev]).write(gpu_file)
    s = Supervised(tmp_path, _args(server, gguf, golden), gpu_probe=f"emulated:{gpu_file}")
    try:
        s.wait_probe("/v2/health/ready", 200)
        child = s.server_pid()
        gpus.update(gpu_file, lambda f: gpus.with_fault(f, 0, 79, time.time())[0])
        assert s.wait_exit() == EXIT_GPU_FAULT, s.logs()
        msg = s.termination()
        assert (msg["reason"], msg["xid"], msg["gpu"], msg["gpus"]) == ("GPUFault", 79, dev.uuid, [dev.uuid])
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child, os.WNOHANG)
        assert not os.path.exists(f"/proc/{child}") or "zombie" in _state(child), (
            "the server outlived the fault"
        )
    finally:
        s.stop()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:", 1)[1].splitlines()[0].lower()
    except (OSError, IndexError):
        return "gone"


def test_a_silent_server_fails_liveness_after_the_grace_period(
    bed: tuple[Path, Path, list[int]], tmp_path: Path
) -> None:
    """A stopped server accepts no answer: past --unavailable-grace the pod is not live and ends."""
    server, gguf, golden = bed
    s = Supervised(tmp_path, _args(server, gguf, golden, "--unavailable-grace", "3"))
    pid = None
    try:
        s.wait_probe("/v2/health/ready", 200)
        pid = s.server_pid()
        os.kill(pid, signal.SIGSTOP)
        assert s.wait_exit() == 1
        msg = s.termination()
        assert "stopped answering its health endpoint" in msg["message"], msg
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        s.stop()
