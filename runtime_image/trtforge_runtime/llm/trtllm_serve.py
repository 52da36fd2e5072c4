"""The ``trtllm-serve`` contract: its arguments, endpoints, health states and metric names.

Written from TensorRT-LLM's source, not from a run (no GPU here runs it; docs/llm.md says what has
run where). Each fact names the upstream file and the commit it was read at (github.com/NVIDIA/
TensorRT-LLM):

- arguments: ``tensorrt_llm/commands/serve.py`` @ 00209af149e7774406881a37283dce303571eb11
  (``serve``: ``MODEL`` then ``--host``, ``--port``, ``--backend``, ``--tp_size``, ``--pp_size``,
  ``--max_batch_size``, ``--max_num_tokens``, ``--max_seq_len``,
  ``--kv_cache_free_gpu_memory_fraction``, ``--config``/``--extra_llm_api_options`` (a YAML file
  that overrides the LLM API arguments), ``--log_level``);
- routes: ``tensorrt_llm/serve/openai_server.py`` @ e7f7345e31e574b5d0918b756b871882c7346b3c
  (``register_routes``: ``/health``, ``/health_generate``, ``/version``, ``/v1/models``, ``/metrics``
  (iteration statistics as JSON, not Prometheus), ``/v1/completions``, ``/v1/chat/completions``,
  ``/v1/responses``; ``mount_metrics`` mounts ``/prometheus/metrics`` only when the LLM API's
  ``return_perf_metrics`` is on);
- start-up states: ``tensorrt_llm/serve/lifecycle.py`` @ 603e4a6938fafe174691321ebd19a0ff17f1ae77
  (while starting, every route answers 503 with header ``x-trtllm-server-state: starting``; ready
  answers ``/health`` with 200; dead is a refused connection, never a state);
- metric names: ``tensorrt_llm/metrics/collector.py`` @ 050f80def8df236e326949c8bd9dee10fd896a83
  (prefix ``trtllm_``);
- the autotuner cache: ``TLLM_AUTOTUNER_CACHE_PATH`` (TensorRT-LLM PR #7738), which upstream loads
  without checking its version or GPU; the supervisor checks the tuning record first;
- the KV cache's host tier: ``kv_cache_config.host_cache_size`` (bytes; unset: none), a field of the
  LLM API's ``KvCacheConfig`` that the ``--config`` YAML overrides, ``tensorrt_llm/llmapi/llm_args.py``
  @ fcd3f31682808ae56118ae43c1d7864a3a945e6f (mirrored from the C++ ``KvCacheConfig``, passed to it as
  ``host_cache_size``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtforge_runtime.llm.probes import Health

COMMAND = "trtllm-serve"

# Routes (openai_server.py, register_routes and mount_metrics).
HEALTH = "/health"
HEALTH_GENERATE = "/health_generate"  # a one-token greedy chat completion; 200 or 500
VERSION = "/version"
MODELS = "/v1/models"
COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
RESPONSES = "/v1/responses"
ITERATION_STATS = "/metrics"  # JSON iteration statistics, not a Prometheus exposition
PROMETHEUS = "/prometheus/metrics"  # only with return_perf_metrics

# Start-up states (lifecycle.py).
SERVER_STATE_HEADER = "x-trtllm-server-state"
STATE_STARTING = "starting"
STATE_READY = "ready"

# The autotuner cache's path (PR #7738).
AUTOTUNER_CACHE_ENV = "TLLM_AUTOTUNER_CACHE_PATH"

# LLM API options (llm_args.py): the KV cache's settings and, in them, its host tier in bytes.
KV_CACHE_CONFIG = "kv_cache_config"
HOST_CACHE_SIZE = "host_cache_size"

# Metric names (collector.py): the autoscaling signals and the figures a dashboard wants.
NUM_REQUESTS_WAITING = "trtllm_num_requests_waiting"
NUM_REQUESTS_RUNNING = "trtllm_num_requests_running"
KV_CACHE_UTILIZATION = "trtllm_kv_cache_utilization"
TIME_TO_FIRST_TOKEN = "trtllm_time_to_first_token_seconds"
TIME_PER_OUTPUT_TOKEN = "trtllm_time_per_output_token_seconds"
E2E_REQUEST_LATENCY = "trtllm_e2e_request_latency_seconds"
GENERATION_TOKENS = "trtllm_generation_tokens_total"
PROMPT_TOKENS = "trtllm_prompt_tokens_total"
REQUEST_SUCCESS = "trtllm_request_success_total"
REQUEST_ERROR = "trtllm_request_error_total"

LOG_LEVELS = frozenset({"internal_error", "error", "warning", "info", "verbose", "debug", "trace"})


@dataclass(frozen=True)
class TrtllmServeArgs:
    """What the deployment says about the server; the model folder is the verified checkpoint."""

    model_dir: Path
    port: int
    host: str = "0.0.0.0"
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    max_batch_size: int | None = None
    max_num_tokens: int | None = None
    max_seq_len: int | None = None
    kv_cache_free_gpu_memory_fraction: float | None = None
    log_level: str = "info"
    config_path: Path | None = None  # the YAML written by :func:`llm_api_options`


def argv(a: TrtllmServeArgs) -> list[str]:
    """The command line (serve.py's options, by their upstream names); ValueError on a bad value."""
    if a.tensor_parallel < 1 or a.pipeline_parallel < 1:
        raise ValueError(
            f"parallelism: tensor {a.tensor_parallel} x pipeline {a.pipeline_parallel}; "
            "both must be at least 1"
        )
    if a.log_level not in LOG_LEVELS:
        raise ValueError(f"log level {a.log_level!r}: expected one of {sorted(LOG_LEVELS)}")
    frac = a.kv_cache_free_gpu_memory_fraction
    if frac is not None and not 0.0 < frac <= 1.0:
        raise ValueError(f"kv_cache_free_gpu_memory_fraction {frac}: expected a fraction in (0, 1]")
    out = [COMMAND, str(a.model_dir), "--host", a.host, "--port", str(a.port), "--backend", "pytorch"]
    out += ["--tp_size", str(a.tensor_parallel), "--pp_size", str(a.pipeline_parallel)]
    for flag, value in (
        ("--max_batch_size", a.max_batch_size),
        ("--max_num_tokens", a.max_num_tokens),
        ("--max_seq_len", a.max_seq_len),
        ("--kv_cache_free_gpu_memory_fraction", frac),
    ):
        if value is not None:
            out += [flag, str(value)]
    out += ["--log_level", a.log_level]
    if a.config_path is not None:
        out += ["--config", str(a.config_path)]
    return out


def llm_api_options(
    extra: Mapping[str, object] | None = None, host_cache_bytes: int = 0
) -> dict[str, object]:
    """The ``--config`` YAML's content: the deployment's own options, with ``return_perf_metrics`` on
    (without it there is no ``/prometheus/metrics``, so nothing to autoscale on) and, when
    `host_cache_bytes` is above 0, the KV cache's host tier of that many bytes per rank (GH200: Grace
    memory; docs/llm.md §"GH200"). ValueError on a negative size."""
    if host_cache_bytes < 0:
        raise ValueError(f"--host-cache-bytes {host_cache_bytes}: must not be negative")
    out: dict[str, object] = {**(extra or {}), "return_perf_metrics": True}
    if host_cache_bytes:
        kv = out.get(KV_CACHE_CONFIG) or {}
        if not isinstance(kv, Mapping):
            raise ValueError(f"{KV_CACHE_CONFIG}: expected a mapping, got {kv!r:.80}")
        out[KV_CACHE_CONFIG] = {**kv, HOST_CACHE_SIZE: host_cache_bytes}
    return out


def environment(autotuner_cache: Path | None) -> dict[str, str]:
    """Environment for the server: the verified tuning cache, when there is one."""
    return {AUTOTUNER_CACHE_ENV: str(autotuner_cache)} if autotuner_cache is not None else {}


def classify_health(status: int | None, headers: Mapping[str, str]) -> Health:
    """What a ``GET /health`` answer means (None: no answer). Header names are case-insensitive."""
    if status is None:
        return Health.DOWN
    if status == 200:
        return Health.UP
    if status == 503:
        state = {k.lower(): v for k, v in headers.items()}.get(SERVER_STATE_HEADER, "")
        return Health.STARTING if state.strip().lower() == STATE_STARTING else Health.UNAVAILABLE
    return Health.ERROR


def canary_request(model: str, prompt: str, n_tokens: int) -> dict[str, Any]:
    """A greedy, fixed-length ``POST /v1/completions`` (``ignore_eos`` is one of the sampling fields
    trtllm-serve's CompletionRequest takes). Its OpenAI answer is text, so the canary on trtllm-serve
    compares the golden text, not token ids."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": n_tokens,
        "temperature": 0.0,
        "top_k": 1,
        "ignore_eos": True,
        "stream": False,
    }


def canary_text(answer: Mapping[str, Any]) -> str:
    """The generated text of a ``/v1/completions`` answer; ValueError when it has none."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0].get("text"), str):
        raise ValueError(f"trtllm-serve /v1/completions answer has no choices[0].text: {dict(answer)!r:.200}")
    return str(choices[0]["text"])
