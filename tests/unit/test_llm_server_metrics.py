"""The supervisor's /metrics: the server's exposition plus the runtime load gauges read from it."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from trtforge_runtime.llm.server_metrics import (
    IN_FLIGHT,
    KV_CACHE,
    QUEUE_DEPTH,
    ServerKind,
    exposition,
    runtime_gauges,
)

LLAMA = """# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 5
"""

TRTLLM = """# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{model_name="m",engine_type="e"} 3.0
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{model_name="m",engine_type="e"} 7.0
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{model_name="m",engine_type="e"} 0.25
"""


def test_llama_cpp_waiting_and_processing_become_the_runtime_gauges() -> None:
    assert runtime_gauges(ServerKind.LLAMA_CPP, LLAMA) == {QUEUE_DEPTH: 5.0, IN_FLIGHT: 2.0}


def test_trtllm_gauges_include_the_kv_cache() -> None:
    assert runtime_gauges(ServerKind.TRTLLM, TRTLLM) == {QUEUE_DEPTH: 3.0, IN_FLIGHT: 7.0, KV_CACHE: 0.25}


def test_exposition_keeps_the_server_text_and_parses() -> None:
    text = exposition(ServerKind.LLAMA_CPP, 'smol"lm', LLAMA)
    assert text.startswith(LLAMA.rstrip("\n"))
    samples = {s.name: s for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples[QUEUE_DEPTH].value == 5.0 and samples[QUEUE_DEPTH].labels == {"model": 'smol"lm'}
    assert samples["llamacpp:requests_deferred"].value == 5.0


def test_no_server_answer_gives_no_gauges() -> None:
    assert exposition(ServerKind.LLAMA_CPP, "m", "") == "\n"
    assert runtime_gauges(ServerKind.LLAMA_CPP, "not { an exposition") == {}
