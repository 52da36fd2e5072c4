"""The servers of the serving benchmarks: trtforge serve and its peers, each launched the same way.

Every server is described by the same :class:`Setting` axes (execution instances, ONNX Runtime
threads per session, max batch, queue delay) and turned into a :class:`Launch` (a command, its
environment, its ports) by its own module: :mod:`.trtforge`, :mod:`.triton` (the ``tritonserver``
binary of the PyPI wheel ``nvidia-pytriton`` with a Python-backend model), :mod:`.mlserver` (MLServer
with a custom ONNX Runtime runtime) and :mod:`.kserve` (KServe's Python model server). The peers run
from their own virtual environments (:mod:`.venvs`); every session everywhere gets the settings of
trtforge's ONNX Runtime backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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


def default_sweep(cores: int, small_batch: int = 4) -> list[Setting]:
    """The settings every server with a batcher is tried in, for a server given `cores` cores.

    One session with every thread (best for a lone request), one single-thread instance per core with
    a large and a small max batch, and the small batch with a queue delay. `small_batch`: measured
    from the run's ceiling by ``sweep_small_batch``.
    """
    return [
        Setting(1, cores, 32, 0),
        Setting(cores, 1, 32, 0),
        Setting(cores, 1, small_batch, 0),
        Setting(cores, 1, small_batch, 2000),
    ]


SMALL_BATCH_TOLERANCE = 0.03  # the ceiling's own timings move this much from one to the next


def sweep_small_batch(ceiling: dict[str, Any]) -> int:
    """The small max batch of the sweep, from the run's in-process ceiling: the smallest batch size
    at which single-thread sessions side by side (the form of the sweep's one-instance-per-core
    settings) computed within 3% of their most images per second, and at least 2 (a setting with a
    batcher batches). Within 3% the timings' noise picks the best, so the smallest is taken: on
    ResNet-50 every batch size from 1 to 16 is within it. Ceilings without that form give 4."""
    side_by_side = ceiling.get("parallel_sessions") or []
    if not side_by_side:
        return 4
    top = max(float(r["images_per_s"]) for r in side_by_side)
    near = [
        int(r["batch"]) for r in side_by_side if float(r["images_per_s"]) >= (1 - SMALL_BATCH_TOLERANCE) * top
    ]
    return max(2, min(near))


@dataclass
class Launch:
    """How to start one server and where it answers."""

    cmd: list[str]
    env: dict[str, str]
    http_port: int
    grpc_port: int | None
    protocols: tuple[str, ...]  # of benchmarks.loadgen.PROTOCOLS, the first one primary
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
    sweep: Callable[[int, int], list[Setting]]  # (cores, the small max batch) -> the settings
    launch: Callable[[Model, Setting, int, int, Path], Launch]  # model, setting, http, grpc port, work dir
    version: Callable[[], dict[str, str]]


def kinds() -> dict[str, Kind]:
    from benchmarks.servers import kserve, mlserver, triton, trtforge

    return {k.name: k for k in (trtforge.KIND, triton.KIND, mlserver.KIND, kserve.KIND)}
