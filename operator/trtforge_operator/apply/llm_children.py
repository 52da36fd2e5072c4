"""Pure builders of an LLM engine's runtime children (docs/llm.md §"Serving").

A runtime pod of an LLM engine runs ``trtforge serve-llm``: it verifies the checkpoint and the tuning
record named by the TRTEngine's status, starts the server (llama.cpp's ``llama-server`` or
``trtllm-serve``) on its own port and keeps the probes and ``/metrics`` on the port named ``http``,
where the readiness and liveness probes and the metrics adapter look. The Service exposes both: the
OpenAI API goes from the Service straight to the server (port ``openai``), nothing in between.

The Deployment is the engine runtime's (:func:`children.runtime_deployment`) with this container's
command and ports: everything else (security, store access, GPU limits, node moves) is shared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from trtforge.contract.gpu import GPUTarget
from trtforge_operator.api import LLMServer
from trtforge_operator.apply import children
from trtforge_operator.config import OperatorConfig
from trtforge_operator.labels import ANNOTATION_SPEC_HASH, APP_COMPONENT, BASE_LABELS, COMPONENT_RUNTIME
from trtforge_operator.labels import LABEL_INFERENCEDEPLOYMENT as LABEL_INFD

OPENAI_PORT_NAME = "openai"
ANNOTATION_TUNING_KEY = "trtforge.io/tuning-key"


def default_server(target: GPUTarget) -> LLMServer:
    """llama.cpp on a cpu target, trtllm-serve on a GPU."""
    return LLMServer.LLAMA_CPP if target.is_cpu else LLMServer.TRTLLM_SERVE


@dataclass(frozen=True)
class LLMRuntime:
    """What an LLM runtime pod serves and how: the TRTEngine's artefact keys and the server."""

    server: LLMServer
    checkpoint_key: str
    tuning_key: str | None
    openai_port: int = 8080
    server_args: tuple[str, ...] = ()
    # serve-llm's own flags planned by the operator (the GH200 host tier's `--host-cache-bytes`)
    supervisor_args: tuple[str, ...] = ()


def serve_llm_command(req: children.RuntimeRequest, llm: LLMRuntime, store: str) -> list[str]:
    """The ``trtforge serve-llm`` command line of one target's pods (probe port: ``req.port``)."""
    args = [
        "trtforge",
        "serve-llm",
        "--server",
        llm.server.value,
        "--store",
        store,
        "--checkpoint",
        llm.checkpoint_key,
    ]
    if llm.tuning_key:
        args += ["--tuning", llm.tuning_key]
    args += [
        "--model-name",
        req.infd,
        "--host",
        "$(POD_IP)",
        "--port",
        str(llm.openai_port),
        "--probe-port",
        str(req.port),
        "--cache-dir",
        "/cache",
        *llm.supervisor_args,
    ]
    if llm.server_args:
        args += ["--", *llm.server_args]
    return args


def llm_runtime_deployment(
    req: children.RuntimeRequest, llm: LLMRuntime, cfg: OperatorConfig
) -> dict[str, Any]:
    """The runtime Deployment of one target of an LLM engine: the engine runtime's, running
    ``trtforge serve-llm``, with the tuning key beside the checkpoint key in the pod template (a new
    checkpoint, recipe, tuning record or server version rolls, gated on the canary's readiness)."""
    command = serve_llm_command(req, llm, cfg.engine_source())
    ports = ({"name": OPENAI_PORT_NAME, "containerPort": llm.openai_port, "protocol": "TCP"},)
    annotations = {ANNOTATION_TUNING_KEY: llm.tuning_key or ""}
    return children.runtime_deployment(
        replace(req, command=tuple(command), extra_ports=ports, template_annotations=annotations), cfg
    )


def llm_service(
    namespace: str,
    infd: str,
    infd_uid: str,
    probe_port: int,
    openai_port: int,
    selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One Service over every target's pods of an LLM InferenceDeployment: ``openai`` (the server's
    own port, the token path) and ``http`` (probes and metrics). `selector`: rank groups' leaders
    instead (apply/group_services.py)."""
    spec = {
        "selector": dict(selector) if selector is not None else children.selector_labels(infd),
        "ports": [
            {"name": OPENAI_PORT_NAME, "port": openai_port, "targetPort": openai_port, "protocol": "TCP"},
            {"name": "http", "port": probe_port, "targetPort": probe_port, "protocol": "TCP"},
        ],
    }
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": children.service_name(infd),
            "namespace": namespace,
            "labels": {**BASE_LABELS, LABEL_INFD: children.dns_name(infd), APP_COMPONENT: COMPONENT_RUNTIME},
            "annotations": {ANNOTATION_SPEC_HASH: children.spec_hash(spec)},
            "ownerReferences": [children.owner_reference("InferenceDeployment", infd, infd_uid)],
        },
        "spec": spec,
    }


def openai_endpoint(infd: str, namespace: str, openai_port: int) -> str:
    """The OpenAI base URL of the Service, in the cluster."""
    return f"http://{children.service_name(infd)}.{namespace}.svc:{openai_port}/v1"
