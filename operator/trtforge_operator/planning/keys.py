"""The build each TRTEngine target asks for, from its request key (observe/keys.py). Pure."""

from __future__ import annotations

from trtforge.contract.gpu import KNOWN_GPUS, GPUTarget
from trtforge_operator.api import TRTEngineSpec
from trtforge_operator.apply import children
from trtforge_operator.observe.keys import KeyInputs


def build_request(
    spec: TRTEngineSpec,
    ki: KeyInputs,
    requester: str,
    *,
    engine_key: str | None,
    attempt: int = 1,
    rebuild_of: str | None = None,
    rebuild_asked: bool = False,
    avoid_nodes: tuple[str, ...] = (),
    verified_sha256: str | None = None,
    cache_scope: str = "",
) -> children.BuildRequest:
    """The build of one target of `spec` (a first build, a retry, or a rebuild after a GPU fault).

    With `verified_sha256` (the namespace proved it holds the model) the build reads the broker's
    staged copy of the model, not the tenant's source."""
    val = spec.validation_settings()
    return children.BuildRequest(
        target=ki.target,
        model_uri=spec.source.uri,
        model_sha256=verified_sha256 or spec.source.sha256,
        staged_model=verified_sha256 is not None,
        cache_scope=cache_scope,
        build=spec.build_config(),
        engine_key=engine_key,
        request_digest=ki.request_key,
        node_selector=ki.node_selector,
        mig_strategy=ki.mig_strategy,
        requester=requester,
        timing_cache=spec.builder.timing_cache,
        timeout_seconds=spec.builder.timeout_seconds,
        samples=val.samples,
        rtol=val.rtol,
        atol=val.atol,
        backend=ki.backend,
        attempt=attempt,
        rebuild_of=rebuild_of,
        rebuild_asked=rebuild_asked,
        avoid_nodes=avoid_nodes,
    )


def no_node_message(target: GPUTarget) -> str:
    """Why a target has no node, with a hint from the known-GPU table (display only) when the MIG
    profile is not one it lists for the product."""
    msg = f"no schedulable node offers {target} ({target.resource_name() or 'cpu'})"
    known = KNOWN_GPUS.get(target.gpu)
    if target.mig and known is not None and target.mig not in known.mig:
        msg += f"; note: {target.gpu} is not known to have MIG profile {target.mig} ({', '.join(known.mig)})"
    return msg
