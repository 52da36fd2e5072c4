"""The supervisor's ``/metrics``: the server's own Prometheus exposition, as it is, followed by the
runtime's two load gauges read from it, so the autoscaling that reads runtime pods today (HPA through a
metrics adapter, KEDA's Prometheus trigger; docs/operations.md) reads LLM pods the same way:

- ``trtforge_runtime_queue_depth``: requests waiting (llama.cpp ``llamacpp:requests_deferred``,
  TensorRT-LLM ``trtllm_num_requests_waiting``);
- ``trtforge_runtime_requests_in_flight``: requests being decoded (``llamacpp:requests_processing``,
  ``trtllm_num_requests_running``);
- ``trtforge_llm_kv_cache_utilization``, where the server exports one (TensorRT-LLM only).

Pure: text in, text out.
"""

from __future__ import annotations

import enum
import math

from prometheus_client.parser import text_string_to_metric_families

from trtforge_runtime.llm import llama_server, trtllm_serve


class ServerKind(enum.StrEnum):
    LLAMA_CPP = "llama.cpp"
    TRTLLM = "trtllm-serve"


QUEUE_DEPTH = "trtforge_runtime_queue_depth"
IN_FLIGHT = "trtforge_runtime_requests_in_flight"
KV_CACHE = "trtforge_llm_kv_cache_utilization"

# The server's metric that each runtime gauge is read from.
SOURCES: dict[ServerKind, dict[str, str]] = {
    ServerKind.LLAMA_CPP: {
        QUEUE_DEPTH: llama_server.REQUESTS_DEFERRED,
        IN_FLIGHT: llama_server.REQUESTS_PROCESSING,
    },
    ServerKind.TRTLLM: {
        QUEUE_DEPTH: trtllm_serve.NUM_REQUESTS_WAITING,
        IN_FLIGHT: trtllm_serve.NUM_REQUESTS_RUNNING,
        KV_CACHE: trtllm_serve.KV_CACHE_UTILIZATION,
    },
}

_HELP = {
    QUEUE_DEPTH: "Requests waiting for the LLM server (read from the server's own metrics)",
    IN_FLIGHT: "Requests the LLM server is decoding (read from the server's own metrics)",
    KV_CACHE: "KV-cache use of the LLM server, 0 to 1 (read from the server's own metrics)",
}


def sample_sums(text: str) -> dict[str, float]:
    """Every sample's value by sample name, summed over label sets (a malformed exposition: {})."""
    out: dict[str, float] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out[s.name] = out.get(s.name, 0.0) + float(s.value)
    except ValueError:
        return {}
    return out


def runtime_gauges(kind: ServerKind, server_text: str) -> dict[str, float]:
    """The runtime gauges present in the server's exposition (a gauge the server lacks is left out)."""
    values = sample_sums(server_text)
    return {ours: values[theirs] for ours, theirs in SOURCES[kind].items() if theirs in values}


def exposition(kind: ServerKind, model: str, server_text: str) -> str:
    """The supervisor's ``/metrics`` body: the server's text, then the runtime gauges."""
    lines = [server_text.rstrip("\n")] if server_text.strip() else []
    label = model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    for name, value in runtime_gauges(kind, server_text).items():
        shown = "NaN" if math.isnan(value) else repr(float(value))
        lines += [
            f"# HELP {name} {_HELP[name]}",
            f"# TYPE {name} gauge",
            f'{name}{{model="{label}"}} {shown}',
        ]
    return "\n".join(lines) + "\n"
