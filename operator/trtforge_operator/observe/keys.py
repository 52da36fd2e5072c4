"""Request keys of TRTEngine targets (docs/design.md §"Engine keys"): the content addresses a pass
reads the build Jobs and the store's request index by. Derived from the spec, the Nodes and the
operator's configuration alone; a fact of what is asked for, decided nowhere here. Pure.

Per resolved target: its *request key* is the model (sha256 when pinned or proven), the build config,
the GPU binding the target and GFD labels state, the builder image and the recipe version. Never a
TensorRT, CUDA or backend version: the builder reports those.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trtforge.contract.engine_key import (
    Backend,
    RequestKeyRecord,
    request_key,
    target_binding,
)
from trtforge.contract.gpu import GPUTarget, MigStrategy
from trtforge.contract.possession import scoped_key
from trtforge_operator.api import TRTEngineSpec
from trtforge_operator.config import OperatorConfig
from trtforge_operator.observe.views import NodeView


@dataclass(frozen=True)
class KeyInputs:
    target: GPUTarget
    backend: Backend
    request_key: str
    node_selector: dict[str, str]
    hosting_nodes: tuple[str, ...]
    mig_strategy: MigStrategy = MigStrategy.MIXED  # how the hosting nodes offer a MIG target

    @property
    def request_digest(self) -> str:
        return self.request_key


def discovered_targets(spec: TRTEngineSpec, nodes: Sequence[NodeView]) -> list[GPUTarget]:
    """GPU targets found on Nodes that autoTargets selects (MIG only where the MIG config succeeded)."""
    auto = spec.auto_targets
    found: list[GPUTarget] = []
    for n in nodes:
        if auto is not None and not auto.selects(n.labels):
            continue
        found.extend(n.targets())
    return found


def resolve_targets(spec: TRTEngineSpec, nodes: Sequence[NodeView]) -> list[GPUTarget]:
    return spec.resolved_targets(discovered_targets(spec, nodes))


def key_inputs(
    spec: TRTEngineSpec,
    target: GPUTarget,
    nodes: Sequence[NodeView],
    cfg: OperatorConfig,
    *,
    model_sha256: str | None = None,
    cache_scope: str = "",
) -> KeyInputs:
    """Request key and node selector of one target (docs/design.md §"Engine keys").

    The GPU part comes from the target and, for hardware-compatible builds, the GFD labels of the
    first hosting node. Raises ValueError when a label such a build needs is missing. The model is
    its pin, or `model_sha256`, the digest the namespace proved it holds; the key is scoped to the
    namespace's cache scope (docs/security.md).
    """
    hosting = sorted((n for n in nodes if n.hosts(target)), key=lambda n: n.name)
    strategy = placement_strategy(target, hosting)
    if target.mig:  # pods land on nodes of one strategy: its labels and resource differ
        hosting = [
            n for n in hosting if (n.mig_strategy == MigStrategy.SINGLE) == (strategy == MigStrategy.SINGLE)
        ]
    first = hosting[0] if hosting else None
    build = spec.build_config()
    backend = cfg.backend_for(target.gpu)
    binding = target_binding(
        target.gpu,
        target.mig,
        build.hardware_compatibility,
        compute_capability=first.compute_capability if first else None,
        arch=first.arch if first else None,
    )
    digest = model_sha256 or spec.source.sha256
    rk = scoped_key(
        request_key(
            RequestKeyRecord(
                model_sha256=digest,
                model_uri=None if digest else spec.source.uri,
                build=build,
                gpu=binding,
                backend=backend,
                builder_image=cfg.builder_image,
            )
        ),
        cache_scope,
    )
    return KeyInputs(
        target=target,
        backend=backend,
        request_key=rk,
        node_selector=target.node_selector(first.arch if first and first.arch else None, strategy),
        hosting_nodes=tuple(n.name for n in hosting),
        mig_strategy=strategy,
    )


def placement_strategy(target: GPUTarget, hosting: Sequence[NodeView]) -> MigStrategy:
    """How a MIG target's pods ask for their slice: the strategy most of its hosting nodes use (mixed
    on a tie, and where none hosts it yet); whole GPUs and CPU are asked for alike under every one
    (docs/design.md §"GPU labels")."""
    if not target.mig:
        return MigStrategy.MIXED
    single = sum(1 for n in hosting if n.mig_strategy == MigStrategy.SINGLE)
    return MigStrategy.SINGLE if single * 2 > len(hosting) else MigStrategy.MIXED
