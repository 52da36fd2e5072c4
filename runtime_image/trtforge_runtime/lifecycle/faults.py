"""GPU fault handling: a monitor thread on the probe, and the one way out after a fault.

On a fault (a critical Xid/ECC event from the probe, or a device error during execution) the server
turns not-ready, writes a ``GPUFault`` termination message and exits with ``EXIT_GPU_FAULT`` at once:
results computed on that GPU can no longer be trusted, so in-flight requests are not drained. The
operator reads the message and moves the pod (docs/design.md §"GPU faults").
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable

from trtforge.contract.gpu_probe import GPUProbe, GPUProbeError, XidEvent
from trtforge.contract.termination import EXIT_GPU_FAULT, TerminationMessage, write_termination_message
from trtforge.logs import fields

log = logging.getLogger(__name__)


def exit_now(msg: TerminationMessage) -> None:
    """Write the termination message, flush the logs and end the process with the message's code."""
    write_termination_message(msg)
    for h in logging.getLogger().handlers:
        try:
            h.flush()
        except Exception:
            pass
    try:
        sys.stderr.flush()
    except Exception:
        pass
    os._exit(msg.exit_code)


class FaultMonitor:
    """Waits on the probe in a daemon thread; calls `on_fault` once for the first critical event."""

    def __init__(self, probe: GPUProbe, on_fault: Callable[[XidEvent], None], poll_s: float = 0.5) -> None:
        self._probe = probe
        self._on_fault = on_fault
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-fault-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                event = self._probe.wait_for_fault(self._poll_s)
                failures = 0
            except GPUProbeError as e:
                failures += 1
                log.warning("GPU probe failed", extra=fields(error=str(e), failures=failures))
                self._stop.wait(min(5.0, 0.5 * failures))
                continue
            except Exception:
                log.exception("GPU fault monitor failed; stopping it")
                return
            if event is not None and not self._stop.is_set():
                self._on_fault(event)
                return


def given_gpus(probe: GPUProbe) -> list[str] | None:
    """The uuids of the devices this container was given, as the probe sees them (None: unreadable).
    The operator believes a fault only on one of these (operator planning/fault_trust.py)."""
    try:
        return [d.uuid for d in probe.devices()]
    except Exception:
        return None


def exit_on_gpu_fault(
    probe: GPUProbe, engine_key: str, xid: int | None, gpu: str | None, detail: str
) -> None:
    """The one way out after a GPU fault, for engine and LLM pods alike: the ``GPUFault`` termination
    message (with the devices this container was given) and ``EXIT_GPU_FAULT``, at once."""
    exit_now(gpu_fault_message(engine_key, xid, gpu, detail, given_gpus(probe)))


def gpu_fault_message(
    engine_key: str, xid: int | None, gpu: str | None, detail: str, gpus: list[str] | None = None
) -> TerminationMessage:
    """`gpus`: the uuids of the devices this container was given (what the probe sees)."""
    msg = TerminationMessage(
        reason="GPUFault", message=detail, engine_key=engine_key, xid=xid, gpu=gpu, gpus=gpus
    )
    assert msg.exit_code == EXIT_GPU_FAULT
    return msg
