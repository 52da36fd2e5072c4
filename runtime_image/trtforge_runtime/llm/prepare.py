"""Before the server starts: the GPU probe, the artefacts fetched and verified, the tuning record
checked against this pod (:mod:`trtforge_runtime.llm.artefacts`), and the server's command line
(:mod:`trtforge_runtime.llm.plans`); and the GPU fault monitor while it runs.

A refusal (a tampered file, a tuning record for another GPU or server version) raises
:class:`trtforge_runtime.errors.Refusal` with a message that names the file or field, what was found
and what was expected; the CLI writes it as the termination message.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from trtforge.contract.gpu_probe import GPUProbe, GPUProbeError, XidEvent, probe_from_env
from trtforge.contract.llm import GoldenTokens
from trtforge.logs import fields
from trtforge_runtime.errors import Refusal
from trtforge_runtime.lifecycle.faults import FaultMonitor, exit_on_gpu_fault
from trtforge_runtime.llm import plans
from trtforge_runtime.llm.supervisor import ServerPlan, Supervisor

if TYPE_CHECKING:
    from trtforge_runtime.llm.group import WorkerSupervisor
    from trtforge_runtime.llm.mpi_worker import MpiWorkerSupervisor

log = logging.getLogger(__name__)


def parse_golden(text: str) -> tuple[int, ...]:
    """``--golden-tokens``: comma-separated token ids."""
    try:
        out = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError as e:
        raise ValueError(f"--golden-tokens {text!r}: expected comma-separated token ids ({e})") from e
    if not out:
        raise ValueError("--golden-tokens is empty: expected at least one token id")
    return out


def plan_from_args(args: argparse.Namespace, extra: list[str]) -> tuple[ServerPlan, GPUProbe]:
    """The server plan and the GPU probe; Refusal or ValueError with the reason."""
    try:
        probe = probe_from_env()
    except GPUProbeError as e:
        raise Refusal("GPUMismatch", f"GPU probe: {e}") from e
    if args.checkpoint is not None:
        from trtforge_runtime.llm import artefacts

        return artefacts.plan_from_store(args, extra, probe), probe
    model = Path(args.model)
    if not model.is_file():
        raise ValueError(f"--model {model}: no such file (expected a GGUF file)")
    canary = None
    if args.canary_prompt is not None or args.golden_tokens is not None:
        if args.canary_prompt is None or args.golden_tokens is None:
            raise ValueError("--canary-prompt and --golden-tokens go together")
        tokens = parse_golden(args.golden_tokens)
        canary = GoldenTokens(prompt=args.canary_prompt, n_predict=len(tokens), tokens=list(tokens), text="")
    name = args.model_name or model.stem
    return plans.llama_plan(args, extra, model, name, canary), probe


def start_fault_monitor(
    probe: GPUProbe, sup: Supervisor | WorkerSupervisor | MpiWorkerSupervisor, key: str
) -> FaultMonitor | None:
    """Watch the GPU (Xid/ECC) as engine pods do: on a fault the server dies at once and the pod
    ends with the GPUFault message (docs/design.md §"GPU faults"). None without a GPU."""
    if not probe.devices():
        return None

    def on_fault(e: XidEvent) -> None:
        detail = e.message or f"Xid {e.xid} on {e.gpu_uuid}"
        log.error("GPU fault; stopping the LLM server", extra=fields(xid=e.xid, gpu=e.gpu_uuid))
        sup.kill_server_now()
        exit_on_gpu_fault(probe, key, e.xid, e.gpu_uuid, detail)

    m = FaultMonitor(probe, on_fault)
    m.start()
    return m
