"""Generated CRDs: no drift, structural schemas, defaults that agree with the models, examples valid."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml
from trtforge_operator import crdgen
from trtforge_operator.api import InferenceDeployment, TRTEngine

ROOT = Path(__file__).resolve().parents[2]
RESOURCES = [TRTEngine, InferenceDeployment]
ALLOWED_KEYS = {
    "oneOf",  # only of `required` branches (exactly one of some fields), checked below
    "description",
    "type",
    "format",
    "enum",
    "default",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "anyOf",
    "x-kubernetes-int-or-string",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-preserve-unknown-fields",
}


def _root(resource: Any) -> dict[str, Any]:
    schema: dict[str, Any] = crdgen.crd_manifest(resource)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


def test_committed_files_match_the_models() -> None:
    stale = crdgen.stale_files(ROOT)
    assert stale == [], f"regenerate with `make crds` (trtforge crds): {stale}"


def test_top_level_crds_equal_the_chart_and_package_copies() -> None:
    """`crds/` is the canonical copy; the chart's `crds/` and the operator's package data equal it, file
    for file, and none of the three holds a file the others lack."""
    names = {f"{crdgen.crd_name(resource)}.yaml" for resource in RESOURCES}
    copies = {d: {p.name: p.read_bytes() for p in (ROOT / d).glob("*.yaml")} for d in crdgen.CRD_DIRS}
    assert crdgen.CRD_DIRS[0] == "crds" == crdgen.CANONICAL_CRD_DIR
    canonical = copies[crdgen.CANONICAL_CRD_DIR]
    assert set(canonical) == names, f"crds/ holds {sorted(canonical)}, expected {sorted(names)}"
    for d, files in copies.items():
        assert files == canonical, f"{d}/ differs from crds/ (run `make crds`)"


def test_packaged_crds_are_found_as_package_data() -> None:
    """What the test bed and demo install comes through importlib.resources, not a checkout path."""
    rendered = crdgen.rendered_files()
    packaged = crdgen.packaged_crds()
    assert sorted(packaged) == sorted(f"{crdgen.crd_name(r)}.yaml" for r in RESOURCES)
    for name, text in packaged.items():
        assert text == rendered[f"{crdgen.PACKAGE_CRD_DIR}/{name}"]


def test_check_mode_reports_drift(tmp_path: Path) -> None:
    assert crdgen.stale_files(tmp_path) == sorted(
        crdgen.rendered_files(), key=list(crdgen.rendered_files()).index
    )
    crdgen.write_files(tmp_path)
    assert crdgen.stale_files(tmp_path) == []
    (tmp_path / "docs/api.md").write_text("edited\n")
    assert crdgen.stale_files(tmp_path) == ["docs/api.md"]
    assert crdgen.write_files(tmp_path) == [tmp_path / "docs/api.md"]


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trtforge.cli import main

    assert main(["crds", "--root", str(tmp_path), "--check"]) == 1
    assert "out of date" in capsys.readouterr().out
    assert main(["crds", "--root", str(tmp_path)]) == 0
    assert (tmp_path / crdgen.PACKAGE_CRD_DIR / "trtengines.trtforge.io.yaml").exists()
    assert main(["crds", "--root", str(tmp_path), "--check"]) == 0


def cols_of(version: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}


@pytest.mark.parametrize("resource", RESOURCES)
def test_crd_shape(resource: Any) -> None:
    crd = crdgen.crd_manifest(resource)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    spec = crd["spec"]
    assert spec["group"] == "trtforge.io" and spec["scope"] == "Namespaced"
    assert spec["names"]["categories"] == ["trtforge"]
    assert (
        spec["names"]["shortNames"] == {"TRTEngine": ["trte"], "InferenceDeployment": ["infd"]}[resource.KIND]
    )
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    if resource is TRTEngine:
        assert version["subresources"] == {"status": {}}
    else:  # kubectl scale, an HPA or KEDA act on it
        assert version["subresources"] == {
            "status": {},
            "scale": {
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector",
            },
        }
        assert cols_of(version)["Desired"] == ".status.desiredReplicas"
        assert cols_of(version)["Current"] == ".status.replicas"
    cols = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert cols["Age"] == ".metadata.creationTimestamp"
    if resource is TRTEngine:
        assert cols["Ready"] == ".status.readyTargets" and cols["Precision"] == ".spec.precision"
    else:
        assert cols["Engine"] == ".spec.engineRef.name" and cols["Ready"] == ".status.ready"
    # printer columns point at fields the schema has
    root = _root(resource)
    for path in cols.values():
        parts = path.split("[")[0].strip(".").split(".")
        if parts[0] == "metadata":
            continue
        node = root
        for p in parts:
            node = node["properties"][p] if "properties" in node else node["items"]["properties"][p]


@pytest.mark.parametrize("resource", RESOURCES)
def test_schema_is_structural(resource: Any) -> None:
    root = _root(resource)
    for part in ("spec", "status"):
        assert "x-kubernetes-preserve-unknown-fields" not in root["properties"][part]
    assert root["required"] == ["spec"]
    for path, node in _nodes(root):
        assert set(node) <= ALLOWED_KEYS, f"{path}: {set(node) - ALLOWED_KEYS}"
        assert all(set(b) == {"required"} for b in node.get("oneOf", [])), path
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node
            assert node.get("anyOf", [{"type": "integer"}, {"type": "string"}]) == [
                {"type": "integer"},
                {"type": "string"},
            ]
            continue
        assert "anyOf" not in node, path
        assert "type" in node, f"{path} has no type"
        if "properties" in node:
            assert node["type"] == "object" and "additionalProperties" not in node, path
            assert set(node.get("required", [])) <= set(node["properties"]), path
        if node["type"] == "string":
            bounded = "maxLength" in node or "enum" in node or node.get("format") == "date-time"
            assert bounded or path in (".apiVersion", ".kind", ".spec.runtime.env[].value"), (
                f"{path}: unbounded"
            )
        if node["type"] == "array":
            assert "maxItems" in node, f"{path}: unbounded list"
        if node.get("x-kubernetes-list-type") == "map":
            item = node["items"]
            assert set(node["x-kubernetes-list-map-keys"]) <= set(item["required"]), path
        if node.get("x-kubernetes-preserve-unknown-fields"):
            assert path.endswith(".valueFrom"), (
                f"{path}: preserve-unknown-fields only where Kubernetes has it"
            )
        if "default" in node:
            jsonschema.validate(node["default"], _json_schema(node))


def _json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """The CRD schema as strict JSON Schema: unknown fields refused (the apiserver prunes them)."""
    node = copy.deepcopy(node)
    for _, sub in _nodes(node):
        if "properties" in sub and not sub.get("x-kubernetes-preserve-unknown-fields"):
            sub["additionalProperties"] = False
    return node


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_validate_against_the_crd(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        resource = {"TRTEngine": TRTEngine, "InferenceDeployment": InferenceDeployment}[doc["kind"]]
        jsonschema.validate(doc, _json_schema(_root(resource)))


@pytest.mark.parametrize(
    ("resource", "doc", "field"),
    [
        (TRTEngine, {"spec": {"model": {"uri": "pvc://m/x.onnx"}, "precision": "fp4"}}, "precision"),
        (
            TRTEngine,
            {"spec": {"model": {"uri": "pvc://m/x.onnx"}, "builder": {"optimizationLevel": 7}}},
            "optimizationLevel",
        ),
        (TRTEngine, {"spec": {"model": {"uri": "pvc://m/x.onnx"}, "targets": [{"mig": "1g.10gb"}]}}, "gpu"),
        (TRTEngine, {"spec": {"model": {"uri": "ftp://h/x.onnx"}}}, "uri"),
        (TRTEngine, {"spec": {"model": {"uri": "pvc://m/x.onnx", "sha256": "xyz"}}}, "sha256"),
        (TRTEngine, {"spec": {"precision": "fp16"}}, "spec"),  # neither model nor llm
        (
            TRTEngine,
            {
                "spec": {
                    "model": {"uri": "pvc://m/x.onnx"},
                    "llm": {"source": {"uri": "pvc://m/x.gguf"}, "recipe": "bf16"},
                }
            },
            "spec",
        ),
        (TRTEngine, {"spec": {"llm": {"source": {"uri": "pvc://m/x.gguf"}, "recipe": "fp4"}}}, "recipe"),
        (
            TRTEngine,
            {"spec": {"model": {"uri": "pvc://m/x.onnx"}, "builder": {"workspace": "4GB"}}},
            "workspace",
        ),
        (InferenceDeployment, {"spec": {"engineRef": {"name": "e"}, "replicas": -1}}, "replicas"),
    ],
)
def test_schema_refuses(resource: Any, doc: dict[str, Any], field: str) -> None:
    with pytest.raises(jsonschema.ValidationError) as e:
        jsonschema.validate(doc, _json_schema(_root(resource)))
    assert field in str(e.value.path) + e.value.message


def _apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    if isinstance(obj, dict):
        for name, sub in schema.get("properties", {}).items():
            if name not in obj and "default" in sub:
                obj[name] = copy.deepcopy(sub["default"])
            if name in obj:
                _apply_defaults(sub, obj[name])
    elif isinstance(obj, list) and "items" in schema:
        for item in obj:
            _apply_defaults(schema["items"], item)
    return obj


@pytest.mark.parametrize(
    ("resource", "spec"),
    [
        (TRTEngine, {"model": {"uri": "pvc://m/x.onnx"}, "targets": [{"gpu": "cpu"}]}),
        (
            TRTEngine,
            {
                "model": {"uri": "pvc://m/x.onnx"},
                "autoTargets": {"enabled": True},
                "builder": {"workspace": "1Gi"},
                "validation": {"rtol": 0.5},
            },
        ),
        (InferenceDeployment, {"engineRef": {"name": "e"}}),
        (
            InferenceDeployment,
            {
                "engineRef": {"name": "e"},
                "runtime": {"batching": {"maxBatchSize": 4}},
                "rollout": {"maxSurge": 2},
                "faultPolicy": {"maxRebuildsPerHour": 1},
            },
        ),
    ],
)
def test_schema_defaults_equal_model_defaults(resource: Any, spec: dict[str, Any]) -> None:
    """What the apiserver fills in is exactly what the models assume when a field is absent."""
    spec_model = resource.model_fields["spec"].annotation
    defaulted = _apply_defaults(_root(resource)["properties"]["spec"], copy.deepcopy(spec))
    assert defaulted != spec  # the schema does default something
    assert spec_model.model_validate(defaulted) == spec_model.model_validate(spec)


def test_issue_defaults_are_in_the_schema() -> None:
    eng = _root(TRTEngine)["properties"]["spec"]["properties"]
    assert eng["precision"]["default"] == "fp16"
    assert eng["builder"]["properties"]["optimizationLevel"]["default"] == 3
    assert eng["builder"]["properties"]["timingCache"]["default"] is True
    infd = _root(InferenceDeployment)["properties"]["spec"]["properties"]
    assert infd["replicas"]["default"] == 1
    assert infd["runtime"]["properties"]["port"]["default"] == 8000
    assert infd["faultPolicy"]["properties"]["rebuildOnGPUFault"]["default"] is True
    assert infd["faultPolicy"]["properties"]["maxRebuildsPerHour"]["default"] == 3


def test_api_doc_mentions_every_field() -> None:
    doc = crdgen.api_doc()
    for resource in RESOURCES:
        for path, _ in _nodes(_root(resource)):
            if path.startswith((".spec.", ".status.")) and "{}" not in path:
                assert f"`{path.rsplit('.', 1)[-1].removesuffix('[]')}`" in doc, path
    assert "min <= opt <= max" in doc
