"""The trtllm-serve contract (trtforge_runtime.llm.trtllm_serve).

These tests check a contract written from TensorRT-LLM's source at the commits the module names, not
a run: no trtllm-serve runs here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from trtforge_runtime.llm import trtllm_serve as t
from trtforge_runtime.llm.probes import Health


def test_contract_argv_uses_the_upstream_option_names() -> None:
    a = t.TrtllmServeArgs(
        model_dir=Path("/ckpt"),
        port=8080,
        tensor_parallel=2,
        pipeline_parallel=1,
        max_batch_size=64,
        kv_cache_free_gpu_memory_fraction=0.85,
        config_path=Path("/etc/llm.yaml"),
    )
    argv = t.argv(a)
    assert argv[:2] == ["trtllm-serve", "/ckpt"]
    pairs = dict(zip(argv[2::2], argv[3::2], strict=False))
    assert pairs["--port"] == "8080" and pairs["--backend"] == "pytorch"
    assert pairs["--tp_size"] == "2" and pairs["--pp_size"] == "1"
    assert pairs["--max_batch_size"] == "64"
    assert pairs["--kv_cache_free_gpu_memory_fraction"] == "0.85"
    assert pairs["--config"] == "/etc/llm.yaml"
    assert "--max_num_tokens" not in argv  # unset options are left to the server's defaults


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("tensor_parallel", 0, "parallelism"),
        ("log_level", "loud", "log level"),
        ("kv_cache_free_gpu_memory_fraction", 1.5, "kv_cache"),
    ],
)
def test_contract_argv_refuses_bad_values_by_name(field: str, value: object, named: str) -> None:
    a = t.TrtllmServeArgs(model_dir=Path("/ckpt"), port=1, **{field: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=named):
        t.argv(a)


def test_contract_prometheus_route_needs_return_perf_metrics() -> None:
    assert t.PROMETHEUS == "/prometheus/metrics"
    assert t.ITERATION_STATS == "/metrics"  # JSON, not an exposition
    assert t.llm_api_options({"max_seq_len": 4096}) == {"max_seq_len": 4096, "return_perf_metrics": True}


def test_contract_autotuner_cache_goes_through_its_environment_variable() -> None:
    assert t.environment(Path("/cache/autotuner.cache")) == {
        "TLLM_AUTOTUNER_CACHE_PATH": "/cache/autotuner.cache"
    }
    assert t.environment(None) == {}


@pytest.mark.parametrize(
    ("status", "headers", "want"),
    [
        (200, {}, Health.UP),
        (503, {"X-TRTLLM-Server-State": "starting"}, Health.STARTING),
        (503, {}, Health.UNAVAILABLE),  # issue #18663: 503 without the start-up state
        (503, {"x-trtllm-server-state": "ready"}, Health.UNAVAILABLE),
        (500, {}, Health.ERROR),
        (None, {}, Health.DOWN),  # dead is a refused connection, never a state
    ],
)
def test_contract_health_states(status: int | None, headers: dict[str, str], want: Health) -> None:
    assert t.classify_health(status, headers) is want


def test_contract_metric_names_for_autoscaling() -> None:
    assert t.NUM_REQUESTS_WAITING == "trtllm_num_requests_waiting"
    assert t.NUM_REQUESTS_RUNNING == "trtllm_num_requests_running"
    assert t.KV_CACHE_UTILIZATION == "trtllm_kv_cache_utilization"


def test_contract_canary_is_a_greedy_completion_compared_as_text() -> None:
    body = t.canary_request("m", "The capital of France is", 8)
    assert (body["max_tokens"], body["temperature"], body["ignore_eos"], body["stream"]) == (
        8,
        0.0,
        True,
        False,
    )
    assert t.canary_text({"choices": [{"index": 0, "text": " Paris"}]}) == " Paris"
    with pytest.raises(ValueError, match=r"choices\[0\].text"):
        t.canary_text({"choices": []})


def test_contract_host_cache_is_the_kv_cache_configs_host_cache_size_in_bytes() -> None:
    # llm_args.py @ fcd3f31: KvCacheConfig.host_cache_size, "Size of the host cache in bytes", under the
    # LLM API's kv_cache_config, which the --config YAML overrides.
    opts = t.llm_api_options({"kv_cache_config": {"enable_block_reuse": True}}, host_cache_bytes=8 << 30)
    assert opts == {
        "kv_cache_config": {"enable_block_reuse": True, "host_cache_size": 8 << 30},
        "return_perf_metrics": True,
    }
    assert "kv_cache_config" not in t.llm_api_options(host_cache_bytes=0)  # 0: no host tier at all
    with pytest.raises(ValueError, match="--host-cache-bytes"):
        t.llm_api_options(host_cache_bytes=-1)
    with pytest.raises(ValueError, match="kv_cache_config"):
        t.llm_api_options({"kv_cache_config": "big"}, host_cache_bytes=1)
