"""Fields Kubernetes 1.20 prunes without a word are named in a condition (issue 63), from what the
last `kubectl apply` sent, with the field the user most likely meant."""

from __future__ import annotations

import json
from typing import Any

from trtforge_operator.api import InferenceDeployment, TRTEngine, get_condition
from trtforge_operator.planning.pruned import (
    LAST_APPLIED,
    UNKNOWN_FIELDS,
    pruned_condition,
    pruned_fields,
    spec_schema,
)


def applied(doc: dict[str, Any]) -> dict[str, str]:
    return {LAST_APPLIED: json.dumps(doc)}


ENGINE = {
    "apiVersion": "trtforge.io/v1alpha1",
    "kind": "TRTEngine",
    "metadata": {"name": "r", "namespace": "a", "annotations": {"x": "y"}},
    "spec": {
        "model": {"uri": "pvc://m/r.onnx", "maxSizeBytes": 100},
        "targets": [{"gpu": "NVIDIA-H100-80GB-HBM3"}],
    },
}


def test_a_misplaced_field_is_named_with_the_one_meant() -> None:
    doc = json.loads(json.dumps(ENGINE))
    doc["spec"]["maxSizeBytes"] = 100
    doc["spec"]["targets"][0]["gpuu"] = "x"
    doc["spec"]["model"]["sha265"] = "y"
    doc["spec"]["colour"] = "blue"
    found = pruned_fields(applied(doc), spec_schema(TRTEngine))
    assert found == [
        ("spec.colour", None),
        ("spec.maxSizeBytes", "spec.model.maxSizeBytes"),
        ("spec.model.sha265", "spec.model.sha256"),
        ("spec.targets[0].gpuu", "spec.targets[].gpu"),
    ]
    conds = pruned_condition([], found, 3, None)
    c = get_condition(conds, UNKNOWN_FIELDS)
    assert c is not None and c.status == "True" and c.observed_generation == 3
    assert "spec.maxSizeBytes (did you mean spec.model.maxSizeBytes?)" in c.message


def test_known_fields_report_nothing_and_clear_an_earlier_report() -> None:
    assert pruned_fields(applied(ENGINE), spec_schema(TRTEngine)) == []
    assert pruned_fields({}, spec_schema(TRTEngine)) == []
    assert pruned_fields({LAST_APPLIED: "not json"}, spec_schema(TRTEngine)) == []
    assert pruned_condition([], [], 1, None) == []
    earlier = pruned_condition([], [("spec.x", None)], 1, None)
    c = get_condition(pruned_condition(earlier, [], 2, None), UNKNOWN_FIELDS)
    assert c is not None and c.status == "False"


def test_maps_and_free_form_fields_take_any_key() -> None:
    doc = {
        "spec": {
            "engineRef": {"name": "r"},
            "runtime": {
                "resources": {"limits": {"example.com/anything": "1"}},
                "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            },
            "replica": 2,
        },
        "status": {"anything": 1},
    }
    assert pruned_fields(applied(doc), spec_schema(InferenceDeployment)) == [
        ("spec.replica", "spec.replicas")
    ]


def test_likely_field_matches_the_name_in_any_case() -> None:
    doc = {"spec": {"model": {"uri": "x", "MAXSIZEBYTES": 1}}}
    assert pruned_fields(applied(doc), spec_schema(TRTEngine)) == [
        ("spec.model.MAXSIZEBYTES", "spec.model.maxSizeBytes")
    ]


def test_no_spec_keeps_unknown_fields() -> None:
    """Every spec field is typed, so the apiserver prunes (or a newer one refuses) what is not a field."""

    def walk(node: Any, path: str) -> list[str]:
        if not isinstance(node, dict):
            return []
        out = [path] if node.get("x-kubernetes-preserve-unknown-fields") else []
        for k, v in (node.get("properties") or {}).items():
            out += walk(v, f"{path}.{k}")
        for k in ("items", "additionalProperties"):
            out += walk(node.get(k), f"{path}[]")
        return out

    for model in (TRTEngine, InferenceDeployment):
        assert walk(spec_schema(model), "spec") == [], model.__name__
