"""How builder and runtime processes end: exit codes and the termination message the operator reads.

A pod's container writes one JSON object (:class:`TerminationMessage`) to its
``terminationMessagePath`` (``$TRTFORGE_TERMINATION_LOG``, else ``/dev/termination-log`` when it
exists) and prints the same line as its last stdout line; the kubelet copies the file into
``status.containerStatuses[].state.terminated.message`` next to the exit code. The operator reads
both: the exit code says *what kind* of ending it was, the message carries the details (which Xid on
which GPU, which file failed its checksum).

Exit codes (runtime, ``trtforge serve``):

====  ===========================  ===================================================================
code  constant                     meaning; what the operator should do
====  ===========================  ===================================================================
0     ``EXIT_OK``                  clean stop (SIGTERM, drained)
1     ``EXIT_ERROR``               unexpected crash (a bug); restart as usual
2     ``EXIT_USAGE``               bad command line (argparse); fix the pod spec
80    ``EXIT_STORE_UNAVAILABLE``   the store could not be read (network, credentials); retry
81    ``EXIT_ENGINE_INTEGRITY``    the engine or its manifest is missing, corrupt or tampered; rebuild
82    ``EXIT_GPU_MISMATCH``        the engine was built for another GPU than the pod got; fix placement
83    ``EXIT_ENGINE_LOAD_FAILED``  the backend refused to load the engine (e.g. TensorRT version); rebuild
84    ``EXIT_CANARY_FAILED``       reserved: a canary mismatch keeps the server running *not ready*
                                   (it does not exit), but writes this reason so a later kill shows it
86    ``EXIT_GPU_FAULT``           a GPU fault (Xid/ECC, or a device error during execution); move the
                                   pod off the GPU, and rebuild per the fault policy
====  ===========================  ===================================================================
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TERMINATION_LOG_ENV = "TRTFORGE_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = Path("/dev/termination-log")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_STORE_UNAVAILABLE = 80
EXIT_ENGINE_INTEGRITY = 81
EXIT_GPU_MISMATCH = 82
EXIT_ENGINE_LOAD_FAILED = 83
EXIT_CANARY_FAILED = 84
EXIT_GPU_FAULT = 86

Reason = Literal[
    "Completed",
    "Error",
    "StoreUnavailable",
    "EngineIntegrity",
    "GPUMismatch",
    "EngineLoadFailed",
    "CanaryFailed",
    "GPUFault",
]

EXIT_CODES: dict[Reason, int] = {
    "Completed": EXIT_OK,
    "Error": EXIT_ERROR,
    "StoreUnavailable": EXIT_STORE_UNAVAILABLE,
    "EngineIntegrity": EXIT_ENGINE_INTEGRITY,
    "GPUMismatch": EXIT_GPU_MISMATCH,
    "EngineLoadFailed": EXIT_ENGINE_LOAD_FAILED,
    "CanaryFailed": EXIT_CANARY_FAILED,
    "GPUFault": EXIT_GPU_FAULT,
}
REASON_BY_EXIT_CODE: dict[int, Reason] = {v: k for k, v in EXIT_CODES.items()}


class TerminationMessage(BaseModel):
    """One JSON object; unknown fields are kept by readers (``extra`` is ignored, never refused)."""

    model_config = ConfigDict(defer_build=True)

    reason: Reason
    message: str = ""
    component: Literal["runtime", "builder"] = "runtime"
    engine_key: str | None = None
    # GPU faults: the Xid (None when the fault came from an execution error) and the device uuid.
    xid: int | None = None
    gpu: str | None = None
    # The uuids of the GPUs this container was given (the device plugin's NVIDIA_VISIBLE_DEVICES as
    # the probe resolves it): the operator believes a fault only about one of these.
    gpus: list[str] | None = None
    time: float = Field(default_factory=time.time)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.reason]

    def to_line(self) -> str:
        return self.model_dump_json(exclude_none=True)

    @classmethod
    def parse(cls, text: str) -> TerminationMessage | None:
        """The message in a container's ``terminated.message``; None when it is not one of ours."""
        text = text.strip()
        if not text:
            return None
        # The kubelet keeps the file's tail; our message is the last line.
        last = text.splitlines()[-1]
        try:
            return cls.model_validate_json(last)
        except ValueError:
            return None


def termination_log_path() -> Path | None:
    """Where the message goes: ``$TRTFORGE_TERMINATION_LOG``, else /dev/termination-log if present."""
    env = os.environ.get(TERMINATION_LOG_ENV)
    if env:
        return Path(env)
    return DEFAULT_TERMINATION_LOG if DEFAULT_TERMINATION_LOG.exists() else None


def write_termination_message(msg: TerminationMessage, *, echo: bool = True) -> None:
    """Write the message (replacing the file's content) and print it as a stdout line.

    Never raises: a process on its way out must still exit with its code.
    """
    line = msg.to_line()
    path = termination_log_path()
    if path is not None:
        try:
            with open(path, "w") as f:
                f.write(line + "\n")
                f.flush()
        except OSError as e:
            print(f"could not write termination message to {path}: {e}", file=sys.stderr)
    if echo:
        try:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
