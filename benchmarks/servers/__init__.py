"""The servers of the serving benchmarks: trtforge serve and its peers, each launched the same way.

Every server is described by the same :class:`Setting` axes (execution instances, ONNX Runtime
threads per session, max batch, queue delay) and turned into a :class:`Launch` (a command, its
environment, its ports) by its own module: :mod:`.trtforge`, :mod:`.triton` (the ``tritonserver``
binary of the PyPI wheel ``nvidia-pytriton`` with a Python-backend model), :mod:`.mlserver` (MLServer
with a custom ONNX Runtime runtime) and :mod:`.kserve` (KServe's Python model server). The peers run
from their own virtual environments (:mod:`.venvs`); every session everywhere gets the settings of
trtforge's ONNX Runtime backend.

Each server runs in one setting (its module's ``setting``): the one that gave it the most inferences
per second at concurrency 8 and above on a 2-core host, out of the same sweep for every server with
a batcher (one session of every thread; one single-thread instance per core with max batch 32, 2 or
4, with and without a 2 ms queue delay).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Setting:
    """One configuration of a server.

    ``instances``: execution instances (trtforge instances, Triton model instances, MLServer parallel
    workers, KServe workers), each with its own session of ``threads`` intra-op threads;
    ``max_batch``: rows per batch its batcher may form (1: no batching); ``queue_delay_us``: how long a
    partly filled batch waits. ``variant`` names a server-specific knob where a server lacks an axis
    (KServe has no batcher).
    """

    instances: int
    threads: int
    max_batch: int = 32
    queue_delay_us: int = 0
    variant: str = ""

    @property
    def label(self) -> str:
        s = f"{self.instances} inst x {self.threads} thr, "
        s += (
            f"batch<={self.max_batch}, delay {self.queue_delay_us}us" if self.max_batch > 1 else "no batching"
        )
        return f"{s}, {self.variant}" if self.variant else s

    def as_dict(self) -> dict[str, object]:
        return {
            "instances": self.instances,
            "threads": self.threads,
            "max_batch": self.max_batch,
            "queue_delay_us": self.queue_delay_us,
            "variant": self.variant,
            "label": self.label,
        }


@dataclass
class Launch:
    """How to start one server and where it answers."""

    cmd: list[str]
    env: dict[str, str]
    http_port: int
    grpc_port: int | None
    protocols: tuple[str, ...]  # of benchmarks.serving.PROTOCOL_TITLES
    cleanup: list[Path] = field(default_factory=list)


@dataclass(frozen=True)
class Model:
    """What a server needs to know about the model it serves."""

    name: str
    file: Path
    input: str
    output: str
    input_shape: tuple[int, ...]  # without the batch dimension
    output_shape: tuple[int, ...]  # without the batch dimension


@dataclass(frozen=True)
class Kind:
    name: str
    title: str
    setting: Callable[[int], Setting]  # the server's setting for a host of this many cores
    launch: Callable[[Model, Setting, int, int, Path], Launch]  # model, setting, http, grpc port, work dir
    version: Callable[[], dict[str, str]]
