"""The ``llama-server`` contract (llama.cpp as vendored by llama-cpp-python 0.3.36): the test bed's
LLM server on CPUs, labelled ``backend: llama.cpp`` and never passed off as TensorRT-LLM.

From the vendored source (``tools/server/server.cpp``, ``server-http.cpp``, ``server-task.cpp``,
``common/arg.cpp``): ``GET /health`` answers 200 once the model is loaded and, before that, 503
with ``{"error": {"message": "Loading model", "type": "unavailable_error"}}`` (every route does);
``GET /metrics`` is a Prometheus exposition with ``--metrics``, whose gauges
``llamacpp:requests_processing`` and ``llamacpp:requests_deferred`` are the busy slots and the
requests waiting for one (no KV-cache figure); ``POST /completion`` with ``return_tokens`` answers
the generated token ids; the OpenAI routes are ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtforge.contract.llm import golden_request
from trtforge_runtime.llm.probes import Health

COMMAND = "llama-server"

HEALTH = "/health"
METRICS = "/metrics"
COMPLETION = "/completion"  # llama.cpp's own completion route (token ids with return_tokens)
MODELS = "/v1/models"
CHAT_COMPLETIONS = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"

REQUESTS_PROCESSING = "llamacpp:requests_processing"
REQUESTS_DEFERRED = "llamacpp:requests_deferred"
TOKENS_PREDICTED = "llamacpp:tokens_predicted_total"
PROMPT_TOKENS = "llamacpp:prompt_tokens_total"


@dataclass(frozen=True)
class LlamaServerArgs:
    """What the deployment and the tuning record say about the server."""

    model: Path  # the verified GGUF
    port: int
    host: str = "127.0.0.1"
    alias: str | None = None  # the model name the OpenAI API answers with
    ctx_size: int = 2048
    parallel: int = 4  # slots: requests decoded together
    threads: int | None = None  # the deployment's, when no tuning record sets them
    tuning: tuple[str, ...] = ()  # the tuning record's flags (trtforge.contract.llm.llama_server_args)
    gpu_layers: int | None = None  # a CUDA build: layers offloaded to the GPU
    extra: tuple[str, ...] = ()  # the deployment's own further arguments, passed as they are


# Arguments the supervisor sets itself: a deployment's `extra` must not set them again.
OWNED_FLAGS = frozenset(
    {
        "-m",
        "--model",
        "--host",
        "--port",
        "--metrics",
        "-a",
        "--alias",
        "-t",
        "--threads",
        "-b",
        "--batch-size",
    }
    | {
        "-ub",
        "--ubatch-size",
        "-np",
        "--parallel",
        "-c",
        "--ctx-size",
        "-ngl",
        "--n-gpu-layers",
        "--gpu-layers",
        "--rpc",
    }
)


def argv(a: LlamaServerArgs, binary: str = COMMAND) -> list[str]:
    """The command line; ValueError naming the argument when a value or an extra flag is wrong."""
    for name, size in (("ctx_size", a.ctx_size), ("parallel", a.parallel)):
        if size < 1:
            raise ValueError(f"llama-server {name} {size}: must be at least 1")
    if a.threads is not None and a.threads < 1:
        raise ValueError(f"llama-server threads {a.threads}: must be at least 1")
    clash = sorted(f for f in a.extra if f.split("=", 1)[0] in OWNED_FLAGS)
    if clash:
        raise ValueError(
            f"llama-server arguments {clash} are set by the supervisor (model, ports, metrics, tuning); "
            "remove them from the deployment's arguments"
        )
    out = [binary, "-m", str(a.model), "--host", a.host, "--port", str(a.port), "--metrics"]
    out += ["-c", str(a.ctx_size), "-np", str(a.parallel), "--no-webui"]
    if a.alias:
        out += ["-a", a.alias]
    if a.gpu_layers is not None:
        out += ["-ngl", str(a.gpu_layers)]
    if a.tuning:
        out += list(a.tuning)  # the record's threads override the deployment's
    elif a.threads is not None:
        out += ["-t", str(a.threads)]
    return out + list(a.extra)


def classify_health(status: int | None, body: Mapping[str, Any] | None = None) -> Health:
    """What a ``GET /health`` answer means (None: no answer). 503 with ``unavailable_error`` and
    "Loading model" is start-up; any other 503 is not."""
    if status is None:
        return Health.DOWN
    if status == 200:
        return Health.UP
    if status == 503:
        err = (body or {}).get("error")
        if isinstance(err, Mapping) and str(err.get("message", "")).lower().startswith("loading model"):
            return Health.STARTING
        return Health.UNAVAILABLE
    return Health.ERROR


def canary_request(prompt: str, n_tokens: int) -> dict[str, Any]:
    """The body of the greedy, fixed-length ``POST /completion`` that answers its token ids: the
    contract's, the same request the quantize step makes for the golden tokens."""
    return golden_request(prompt, n_tokens)


def canary_tokens(answer: Mapping[str, Any]) -> list[int]:
    """The generated token ids of a ``/completion`` answer; ValueError when it has none."""
    tokens = answer.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise ValueError(
            f"llama-server /completion answer has no token id list under 'tokens': {dict(answer)!r:.200}"
        )
    return list(tokens)
