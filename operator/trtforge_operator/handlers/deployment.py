"""The InferenceDeployment's handlers: a pass is observe (observe/deployment.py) -> plan
(planning/deployment.py) -> apply (apply/deployment.py), and nothing else (docs/design.md
§"Observe, plan, apply")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trtforge_operator.apply.deployment import apply_deployment, apply_deployment_actions
from trtforge_operator.kinds import Kind
from trtforge_operator.observe.deployment import observe_deployment, observe_deployment_children
from trtforge_operator.planning.deployment import plan_deployment_pass, plan_deployment_release
from trtforge_operator.state import State, forget


async def reconcile_deployment(
    state: State, body: Mapping[str, Any], indices: Mapping[str, Any]
) -> float | None:
    """One level-based pass over an InferenceDeployment: observe, plan, apply. Returns the seconds
    until the next pass is due, where the plan says (else the resync)."""
    obs = await observe_deployment(state, body, indices)
    plan = plan_deployment_pass(obs, state.cfg)
    return await apply_deployment(state, body, obs, plan)


async def cleanup_deployment(state: State, body: Mapping[str, Any], indices: Mapping[str, Any]) -> None:
    """On deletion: delete the autoscalers, the runtime Deployments and the Service (ownerRefs would
    too, eventually)."""
    found = await observe_deployment_children(state, body, indices)
    await apply_deployment_actions(state, body, plan_deployment_release(found))
    meta = body["metadata"]
    forget(state, Kind.INFERENCEDEPLOYMENT, meta["namespace"], meta["name"])
