"""The generated CRDs on the test bed's real kube-apiserver (1.20).

The CRDs install from the top-level `crds/` as docs/install.md says; every example applies and comes
back with the schema defaults filled in; invalid objects are refused by the apiserver with a message
naming the field; unknown fields are refused by `kubectl apply`'s validation and pruned by the
apiserver; `kubectl get` shows the printer columns.

CEL rules (`x-kubernetes-validations`) are not run by a 1.20 apiserver (tests/unit/test_api_cel.py
covers them offline). Before 1.23 the CRD schema type has no such field: kubectl's client-side
validation refuses it (so CRDs go in with `--validate=false`, and the apiserver drops the field), and
server-side apply refuses it too ("field not declared in schema"), so `kubectl apply --server-side -f
crds/` needs Kubernetes 1.23 or later. The tests show both on 1.20: the plain apply works, the
server-side one is refused for that field alone and works on the same files without it, and an
upgrade over CRDs Helm created takes `--force-conflicts`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "crds"  # the canonical copy users apply (tests/unit/test_api_crds.py: equal to the others)
CRDS = sorted(CRD_DIR.glob("*.yaml"))
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
GROUP, VERSION = "trtforge.io", "v1alpha1"


def _run(testbed: Any, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    result: subprocess.CompletedProcess[str] = testbed.kubectl(*args, check=False, input=input)
    return result


def _ok(testbed: Any, *args: str, input: str | None = None) -> str:
    r = _run(testbed, *args, input=input)
    assert r.returncode == 0, f"kubectl {' '.join(args)} failed: {r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def crds(testbed: Any) -> None:
    """`kubectl apply --validate=false -f crds/`, the command docs/install.md gives for 1.20-1.22."""
    _ok(testbed, "apply", "--validate=false", "-f", str(CRD_DIR))
    for path in CRDS:
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        _ok(testbed, "wait", "--for=condition=Established", "--timeout=60s", f"crd/{name}")


def _engine(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"uri": "pvc://models/m.onnx"},
        "targets": [{"gpu": "NVIDIA-H100-80GB-HBM3"}],
    }
    body.update(spec)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TRTEngine", "metadata": {"name": "e"}, "spec": body}


def _deployment(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"engineRef": {"name": "e"}}
    body.update(spec)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceDeployment",
        "metadata": {"name": "d"},
        "spec": body,
    }


def _get(testbed: Any, namespace: str, kind: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(_ok(testbed, "get", "-n", namespace, kind, name, "-o", "json"))
    return obj


def _server_minor(testbed: Any) -> int:
    version = json.loads(_ok(testbed, "version", "-o", "json"))["serverVersion"]
    return int(version["minor"].rstrip("+"))


def _without_cel(node: Any) -> Any:
    """A CRD document with every `x-kubernetes-validations` removed (what a 1.20 apiserver keeps)."""
    if isinstance(node, dict):
        return {k: _without_cel(v) for k, v in node.items() if k != "x-kubernetes-validations"}
    if isinstance(node, list):
        return [_without_cel(v) for v in node]
    return node


def _applied_by(testbed: Any, crd: str) -> set[tuple[str, str]]:
    obj = json.loads(_ok(testbed, "get", "crd", crd, "-o", "json"))
    return {(f["manager"], f["operation"]) for f in obj["metadata"].get("managedFields", [])}


def test_crds_dir_applies_with_kubectl(testbed: Any, crds: None) -> None:
    """The directory as users apply it: both CRDs, idempotent on a second apply."""
    out = _ok(testbed, "apply", "--validate=false", "-f", str(CRD_DIR))
    names = sorted(yaml.safe_load(p.read_text())["metadata"]["name"] for p in CRDS)
    assert names == ["inferencedeployments.trtforge.io", "trtengines.trtforge.io"]
    for name in names:
        assert f"customresourcedefinition.apiextensions.k8s.io/{name}" in out, out
    # without --validate=false a 1.20 kubectl refuses the CEL field client-side, naming it
    r = _run(testbed, "apply", "-f", str(CRD_DIR))
    if _server_minor(testbed) < 23:
        assert r.returncode != 0 and 'unknown field "x-kubernetes-validations"' in r.stderr, r.stderr
    else:
        assert r.returncode == 0, r.stderr


def test_server_side_apply_of_crds_dir(testbed: Any, crds: None) -> None:
    """`kubectl apply --server-side -f crds/`: on 1.23+ as it is; on 1.20 refused for the CEL field alone,
    and the same files without it apply server-side (kubectl becomes an Apply manager)."""
    r = _run(testbed, "apply", "--server-side", "--validate=false", "-f", str(CRD_DIR))
    if _server_minor(testbed) >= 23:
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode != 0
        errors = [ln.strip() for ln in r.stderr.splitlines() if "not declared in schema" in ln]
        assert errors, r.stderr
        assert all(
            e.rstrip().endswith("x-kubernetes-validations: field not declared in schema") for e in errors
        )
        docs = [_without_cel(yaml.safe_load(p.read_text())) for p in CRDS]
        stream = "\n---\n".join(yaml.safe_dump(d) for d in docs)
        out = _ok(testbed, "apply", "--server-side", "-f", "-", input=stream)
        assert out.count("serverside-applied") == len(CRDS), out
    for path in CRDS:
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        assert ("kubectl", "Apply") in _applied_by(testbed, name)


def test_server_side_upgrade_over_a_helm_install_takes_force_conflicts(testbed: Any) -> None:
    """Helm creates the chart's CRDs on the first install (field manager `helm`) and never upgrades them.
    Applying a newer CRD server-side over them conflicts on every changed field until
    `--force-conflicts` (operations.md, Upgrades). A CRD of a scratch group stands in for ours."""
    doc = _without_cel(yaml.safe_load(CRDS[0].read_text()))
    group = "upgrade.trtforge.test"
    doc["metadata"] = {"name": f"{doc['spec']['names']['plural']}.{group}"}
    doc["spec"]["group"] = group
    older = json.loads(json.dumps(doc))
    older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = "the previous release"
    name = doc["metadata"]["name"]
    _ok(testbed, "create", "--field-manager=helm", "-f", "-", input=json.dumps(older))
    try:
        r = _run(testbed, "apply", "--server-side", "-f", "-", input=json.dumps(doc))
        assert r.returncode != 0 and 'conflict with "helm"' in r.stderr, r.stderr
        _ok(testbed, "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(doc))
        crd = json.loads(_ok(testbed, "get", "crd", name, "-o", "json"))
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert schema["description"] == doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"]
        assert ("kubectl", "Apply") in _applied_by(testbed, name)
    finally:
        _run(testbed, "delete", "crd", name, "--wait=false")


def test_crds_install(testbed: Any, crds: None) -> None:
    for path in CRDS:
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        crd = json.loads(_ok(testbed, "get", "crd", name, "-o", "json"))
        conds = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conds.get("Established") == "True" and conds.get("NamesAccepted") == "True", conds
        assert conds.get("NonStructuralSchema") in (None, "False"), crd["status"]["conditions"]
    resources = _ok(testbed, "api-resources", f"--api-group={GROUP}", "-o", "wide")
    assert "trte" in resources and "infd" in resources


def test_every_example_applies_with_defaults(testbed: Any, crds: None, namespace: str) -> None:
    for path in EXAMPLES:
        _ok(testbed, "apply", "-n", namespace, "-f", str(path))
    engine = _get(testbed, namespace, "trte", "squeezenet")
    builder = engine["spec"]["builder"]
    assert builder["optimizationLevel"] == 3 and builder["workspace"] == "2Gi"
    assert builder["hardwareCompatibility"] == "none" and builder["versionCompatible"] is False
    auto = _get(testbed, namespace, "trte", "squeezenet-everywhere")["spec"]
    assert auto["builder"]["timingCache"] is True and auto["builder"]["timeoutSeconds"] == 3600
    assert auto["validation"]["samples"] == 8 and auto["autoTargets"]["includeMIG"] is True
    infd = _get(testbed, namespace, "infd", "squeezenet")["spec"]
    # instances and workers have no default: unset, the runtime sizes them from the pod's CPUs
    assert "instances" not in infd["runtime"] and "workers" not in infd["runtime"]
    assert infd["rollout"]["progressDeadlineSeconds"] == 600
    listed = _ok(testbed, "get", "trtforge", "-n", namespace, "-o", "name")  # the category
    assert (
        "trtengine.trtforge.io/squeezenet" in listed
        and "inferencedeployment.trtforge.io/squeezenet" in listed
    )


def test_minimal_objects_get_every_default(testbed: Any, crds: None, namespace: str) -> None:
    _ok(testbed, "apply", "-n", namespace, "-f", "-", input=json.dumps(_engine()))
    _ok(testbed, "apply", "-n", namespace, "-f", "-", input=json.dumps(_deployment()))
    spec = _get(testbed, namespace, "trte", "e")["spec"]
    assert spec["precision"] == "fp16" and spec["builder"]["optimizationLevel"] == 3
    assert spec["builder"]["timingCache"] is True
    d = _get(testbed, namespace, "infd", "d")["spec"]
    assert d["replicas"] == 1 and d["runtime"]["port"] == 8000
    assert d["faultPolicy"] == {"rebuildOnGPUFault": True, "maxRebuildsPerHour": 3}
    assert d["rollout"]["maxUnavailable"] == 0 and d["runtime"]["batching"]["maxBatchSize"] == 1


def _item(path: str, index: int, field: str) -> tuple[str, ...]:
    """A list item's field as apiservers name it: `a.b[0].c` (newer) or `a.b.c` (1.20 drops the index)."""
    return f"{path}[{index}].{field}", f"{path}.{field}"


INVALID = [
    ("unknown-precision", _engine(precision="fp4"), ["spec.precision", "Unsupported value"]),
    (
        "optimization-level-7",
        _engine(builder={"optimizationLevel": 7}),
        ["spec.builder.optimizationLevel", "less than or equal to 5"],
    ),
    (
        "target-without-gpu",
        _engine(targets=[{"mig": "1g.10gb"}]),
        [_item("spec.targets", 0, "gpu"), "Required value"],
    ),
    ("uri-other-scheme", _engine(model={"uri": "ftp://host/m.onnx"}), ["spec.model.uri", "should match"]),
    (
        "malformed-sha256",
        _engine(model={"uri": "pvc://models/m.onnx", "sha256": "ABC123"}),
        ["spec.model.sha256", "should match"],
    ),
    ("negative-replicas", _deployment(replicas=-1), ["spec.replicas", "greater than or equal to 0"]),
    (
        "negative-target-replicas",
        _deployment(targets=[{"gpu": "cpu", "replicas": -1}]),
        [_item("spec.targets", 0, "replicas"), "greater than or equal to 0"],
    ),
    ("missing-model", {**_engine(), "spec": {"targets": [{"gpu": "cpu"}]}}, ["spec.model", "Required value"]),
    (
        "bad-mig-profile",
        _engine(targets=[{"gpu": "NVIDIA-B200", "mig": "3g"}]),
        [_item("spec.targets", 0, "mig")],
    ),
    ("bad-workspace", _engine(builder={"workspace": "4GB"}), ["spec.builder.workspace"]),
    ("missing-engine-ref", _deployment(engineRef=None), ["spec.engineRef", "Required value"]),
]


@pytest.mark.parametrize(("case", "obj", "expect"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_objects_refused_naming_the_field(
    testbed: Any, crds: None, namespace: str, case: str, obj: dict[str, Any], expect: list[Any]
) -> None:
    obj = json.loads(json.dumps(obj))
    obj["spec"] = {k: v for k, v in obj["spec"].items() if v is not None}
    # --validate=false: the apiserver itself must refuse it, not kubectl.
    r = _run(testbed, "apply", "--validate=false", "-n", namespace, "-f", "-", input=json.dumps(obj))
    assert r.returncode != 0, f"{case} was accepted"
    for text in expect:
        alternatives = text if isinstance(text, tuple) else (text,)
        assert any(t in r.stderr for t in alternatives), f"{case}: {text!r} not in {r.stderr!r}"


def test_unknown_field_refused_by_kubectl_validation(testbed: Any, crds: None, namespace: str) -> None:
    obj = _engine(bogusField=1)
    r = _run(testbed, "apply", "-n", namespace, "-f", "-", input=json.dumps(obj))
    assert r.returncode != 0
    assert "bogusField" in r.stderr and "unknown field" in r.stderr, r.stderr


def test_unknown_field_pruned_by_the_apiserver(testbed: Any, crds: None, namespace: str) -> None:
    obj = _engine(bogusField=1, builder={"optimizationLevel": 2, "turbo": True})
    _ok(testbed, "apply", "--validate=false", "-n", namespace, "-f", "-", input=json.dumps(obj))
    spec = _get(testbed, namespace, "trte", "e")["spec"]
    assert "bogusField" not in spec and "turbo" not in spec["builder"]
    assert spec["builder"]["optimizationLevel"] == 2


def _patch_status(testbed: Any, namespace: str, plural: str, name: str, status: dict[str, Any]) -> None:
    from kubernetes import client

    api = client.CustomObjectsApi(testbed.api_client())
    api.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, plural, name, {"status": status})


def test_printer_columns(testbed: Any, crds: None, namespace: str) -> None:
    for name in ("trtengine-squeezenet.yaml", "inferencedeployment-squeezenet.yaml"):
        _ok(testbed, "apply", "-n", namespace, "-f", str(ROOT / "examples" / name))
    now = "2025-01-01T00:00:00Z"
    _patch_status(
        testbed,
        namespace,
        "trtengines",
        "squeezenet",
        {
            "observedGeneration": 1,
            "readyTargets": "1/2",
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "Building", "lastTransitionTime": now}
            ],
            "targets": [
                {"name": "h100-80gb-hbm3", "gpu": "NVIDIA-H100-80GB-HBM3", "phase": "Ready"},
                {"name": "b200-mig-3g.90gb", "gpu": "NVIDIA-B200", "mig": "3g.90gb", "phase": "Building"},
            ],
        },
    )
    _patch_status(
        testbed,
        namespace,
        "inferencedeployments",
        "squeezenet",
        {
            "observedGeneration": 1,
            "ready": "2/3",
            "replicas": 4,  # a rollout's surge: one pod more than wanted
            "desiredReplicas": 3,
            "readyReplicas": 2,
            "endpoint": f"http://squeezenet.{namespace}.svc:8000",
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "Progressing", "lastTransitionTime": now}
            ],
        },
    )
    rows = _table(_ok(testbed, "get", "trte", "-n", namespace))
    assert list(rows[0])[:5] == ["NAME", "READY", "PRECISION", "RECIPE", "STATUS"]
    assert list(rows[0])[-1] == "AGE"
    row = rows[1]["squeezenet"]
    assert row[:3] == ["1/2", "fp16", "Building"]
    wide = _table(_ok(testbed, "get", "trte", "-n", namespace, "-o", "wide"))
    assert "MODEL" in wide[0] and "pvc://models/squeezenet.onnx" in wide[1]["squeezenet"]
    rows = _table(_ok(testbed, "get", "infd", "-n", namespace))
    assert list(rows[0])[:6] == ["NAME", "ENGINE", "DESIRED", "CURRENT", "READY", "STATUS"]
    assert list(rows[0])[-1] == "AGE"
    assert rows[1]["squeezenet"][:5] == ["squeezenet", "3", "4", "2/3", "Progressing"]


def _table(text: str) -> tuple[dict[str, int], dict[str, list[str]]]:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header = {h: i for i, h in enumerate(lines[0].split())}
    rows = {ln.split()[0]: ln.split()[1:] for ln in lines[1:]}
    return header, rows


def test_status_is_a_subresource_and_validated(testbed: Any, crds: None, namespace: str) -> None:
    obj = _engine()
    obj["status"] = {"readyTargets": "9/9"}
    _ok(testbed, "apply", "-n", namespace, "-f", "-", input=json.dumps(obj))
    assert "readyTargets" not in _get(testbed, namespace, "trte", "e").get("status", {})
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as e:
        _patch_status(
            testbed, namespace, "trtengines", "e", {"targets": [{"name": "x", "gpu": "g", "phase": "Done"}]}
        )
    assert e.value.status == 422
    assert any(p in str(e.value.body) for p in _item("status.targets", 0, "phase")), e.value.body
