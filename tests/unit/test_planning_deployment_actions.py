"""The InferenceDeployment's plan as typed actions: their order, no callables, the deletion's actions,
and one writer (apply/deployment.py) of the children they name."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from trtforge_operator.observe.views import AutoscalerView
from trtforge_operator.planning.autoscaling import HpaApi
from trtforge_operator.planning.deployment import plan_deployment
from trtforge_operator.planning.deployment_actions import (
    ApplyAutoscaler,
    ApplyDeployment,
    ApplyService,
    ChildKind,
    DeleteChild,
    Emit,
    PatchEngineAnnotations,
    WriteStatus,
    cleanup_actions,
)
from trtforge_operator.planning.rebuild import REBUILD_PREFIX

from tests.unit.test_planning_autoscaling import AUTO, KEDA, KEDA_CFG, _deps, _hpa_view, _scaled
from tests.unit.test_planning_deployment import CFG, H100, engine, infd, observed

OPERATOR = Path(__file__).resolve().parents[2] / "operator" / "trtforge_operator"
ACTION_TYPES = (
    WriteStatus,
    ApplyDeployment,
    ApplyService,
    ApplyAutoscaler,
    DeleteChild,
    PatchEngineAnnotations,
    Emit,
)


def _no_callables(value: Any, path: str = "plan") -> None:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _no_callables(getattr(value, f.name), f"{path}.{f.name}")
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _no_callables(v, f"{path}[{k!r}]")
    elif isinstance(value, list | tuple | set | frozenset):
        for i, v in enumerate(value):
            _no_callables(v, f"{path}[{i}]")
    elif hasattr(value, "model_dump"):  # a pydantic model (the status): data only
        _no_callables(value.model_dump(), path)
    else:
        assert not callable(value), f"{path} is a callable: {value!r}"


def test_a_switch_of_provider_is_ordered_status_first_old_autoscaler_before_new_events_last() -> None:
    one = [{"gpu": H100.gpu}]
    first = plan_deployment(
        observed(infd(autoscaling=AUTO, targets=one), engine(), hpa_api=HpaApi.V2), KEDA_CFG
    )
    (dep,) = _deps(first)
    (hpa,) = first.apply_autoscalers
    # a new engine too: the Deployment is replaced in the same pass
    plan = plan_deployment(
        observed(
            infd(autoscaling=KEDA, targets=one),
            engine(sha_h="c" * 64),
            deployments=[_scaled(dep, 2)],
            autoscalers=[_hpa_view(hpa)],
            hpa_api=HpaApi.V2,
            keda=True,
        ),
        KEDA_CFG,
    )
    kinds = [type(a) for a in plan.actions]
    assert all(isinstance(a, ACTION_TYPES) for a in plan.actions)
    assert kinds[0] is WriteStatus and plan.actions[0] == WriteStatus(plan.status.to_wire())
    delete_hpa = kinds.index(DeleteChild)
    assert plan.actions[delete_hpa] == DeleteChild(ChildKind.HPA, hpa["metadata"]["name"])
    assert (
        delete_hpa < kinds.index(ApplyDeployment) < kinds.index(ApplyService) < kinds.index(ApplyAutoscaler)
    )
    replace = plan.actions[kinds.index(ApplyDeployment)]
    assert isinstance(replace, ApplyDeployment) and replace.keep_replicas  # the count the HPA set stays
    new = plan.actions[kinds.index(ApplyAutoscaler)]
    assert isinstance(new, ApplyAutoscaler) and new.manifest["kind"] == "ScaledObject"
    emits = [i for i, k in enumerate(kinds) if k is Emit]
    assert all(i > max(j for j, k in enumerate(kinds) if k is not Emit) for i in emits)
    _no_callables(plan)


def test_an_engine_with_old_rebuild_annotations_gets_them_removed_after_the_writes() -> None:
    e = engine()
    mine, other = f"{REBUILD_PREFIX}a1", f"{REBUILD_PREFIX}b2"
    e.metadata.annotations[mine] = '{"requester": "team-a/resnet", "target": "x"}'
    e.metadata.annotations[other] = '{"requester": "team-a/other", "target": "x"}'
    plan = plan_deployment(observed(infd(), e), CFG)
    kinds = [type(a) for a in plan.actions]
    (patch,) = [a for a in plan.actions if isinstance(a, PatchEngineAnnotations)]
    assert patch == PatchEngineAnnotations("resnet", {mine: None})  # its own record only
    assert kinds.index(PatchEngineAnnotations) > max(
        i for i, k in enumerate(kinds) if k in (ApplyDeployment, ApplyService, DeleteChild)
    )
    assert not any(
        isinstance(a, PatchEngineAnnotations)
        for a in plan_deployment(observed(infd(), engine()), CFG).actions
    )


def _view(kind: str, name: str, owner: str) -> AutoscalerView:
    return AutoscalerView(name=name, namespace="ns", labels={}, annotations={}, kind=kind, owner_kind=owner)


@pytest.mark.parametrize(
    ("autoscalers", "deleted"),
    [
        ([], []),
        ([_view("HorizontalPodAutoscaler", "x-h100", "InferenceDeployment")], [(ChildKind.HPA, "x-h100")]),
        ([_view("ScaledObject", "x-h100", "InferenceDeployment")], [(ChildKind.SCALED_OBJECT, "x-h100")]),
        # KEDA's own HPA for a ScaledObject wears our labels but is KEDA's: left to KEDA
        (
            [
                _view("ScaledObject", "x-h100", "InferenceDeployment"),
                _view("HorizontalPodAutoscaler", "keda-hpa-x-h100", "ScaledObject"),
            ],
            [(ChildKind.SCALED_OBJECT, "x-h100")],
        ),
    ],
)
def test_cleanup_actions(autoscalers: list[AutoscalerView], deleted: list[tuple[ChildKind, str]]) -> None:
    actions = cleanup_actions(["x-h100", "x-mig"], autoscalers, "x")
    assert actions == [
        *(DeleteChild(k, n) for k, n in deleted),
        DeleteChild(ChildKind.DEPLOYMENT, "x-h100"),
        DeleteChild(ChildKind.DEPLOYMENT, "x-mig"),
        DeleteChild(ChildKind.SERVICE, "x"),
    ]


# The Kube calls that write an InferenceDeployment's children, and the kinds `Kube.delete` takes that
# are its children (Jobs are the engine's).
WRITES = {"apply_owned", "apply_autoscaler", "delete_autoscaler"}
CHILD_KINDS = {"Deployment", "Service", "Pod", "HorizontalPodAutoscaler", "ScaledObject"}


def test_the_deployment_applier_is_the_one_writer_of_deployments_services_and_autoscalers() -> None:
    writers: dict[str, set[str]] = {}
    for path in sorted(OPERATOR.rglob("*.py")):
        if path.name == "kube.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            attr = node.func.attr
            if not ast.unparse(node.func.value).endswith("kube"):
                continue  # not a Kubernetes call (a store's delete, ...)
            literal = (
                node.args[0].value
                if node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                else None
            )
            if attr in WRITES or (attr == "delete" and (literal in CHILD_KINDS or literal is None)):
                writers.setdefault(path.relative_to(OPERATOR).as_posix(), set()).add(attr)
    others = {p: w for p, w in writers.items() if p != "apply/deployment.py"}
    # Kube.delete with a literal Job elsewhere is the engine's; a non-literal kind only in the applier
    assert others == {}, f"children of an InferenceDeployment written outside apply/deployment.py: {others}"
    assert writers["apply/deployment.py"] == {
        "apply_owned",
        "apply_autoscaler",
        "delete_autoscaler",
        "delete",
    }
