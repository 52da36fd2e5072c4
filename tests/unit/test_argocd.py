"""The Argo CD health check, one script for both kinds (Argo CD's wildcard `trtforge.io/*`), run by a
real Lua interpreter (lupa, Lua 5.1 like Argo CD's gopher-lua)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

lupa = pytest.importorskip("lupa")

REPO = Path(__file__).resolve().parents[2]
ARGOCD = REPO / "deploy" / "argocd"
CHECK = ARGOCD / "resource_customizations" / "trtforge.io" / "_"  # `_`: Argo CD's wildcard kind
SCRIPT = CHECK / "health.lua"
KINDS = ["TRTEngine", "InferenceDeployment"]
CRD_FILES = {
    "TRTEngine": "trtengines.trtforge.io.yaml",
    "InferenceDeployment": "inferencedeployments.trtforge.io.yaml",
}


def _lua_runtime() -> Any:
    try:
        from lupa import lua51

        return lua51.LuaRuntime(unpack_returned_tuples=True)
    except ImportError:  # an older lupa: its default Lua
        return lupa.LuaRuntime(unpack_returned_tuples=True)


def run_health(script: str, obj: dict[str, Any]) -> dict[str, str]:
    """Evaluate an Argo CD health script the way Argo CD does: `obj` global, the script returns hs."""
    lua = _lua_runtime()
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(script)
    assert result is not None, "the script returned nothing"
    return {k: result[k] for k in ("status", "message") if result[k] is not None}


def _kind_of(input_path: str) -> str:
    """`testdata/<kind in lower case>-<case>.yaml` -> the kind."""
    prefix = input_path.removeprefix("testdata/").split("-", 1)[0]
    (kind,) = [k for k in KINDS if k.lower() == prefix]
    return kind


def _cases() -> list[tuple[str, dict[str, Any]]]:
    tests = yaml.safe_load((CHECK / "health_test.yaml").read_text())["tests"]
    return [(_kind_of(case["inputPath"]), case) for case in tests]


def _fixture(kind: str, name: str) -> Any:
    return yaml.safe_load((CHECK / "testdata" / f"{kind.lower()}-{name}.yaml").read_text())


@pytest.mark.parametrize(
    ("kind", "case"), _cases(), ids=lambda x: x if isinstance(x, str) else x["inputPath"]
)
def test_health_fixture(kind: str, case: dict[str, Any]) -> None:
    obj = yaml.safe_load((CHECK / case["inputPath"]).read_text())
    assert obj["kind"] == kind
    assert run_health(SCRIPT.read_text(), obj) == case["healthStatus"]


@pytest.mark.parametrize("kind", KINDS)
def test_fixtures_cover_each_outcome(kind: str) -> None:
    statuses = {c["healthStatus"]["status"] for k, c in _cases() if k == kind}
    assert statuses == {"Healthy", "Progressing", "Degraded"}
    names = {c["inputPath"] for k, c in _cases() if k == kind}
    low = kind.lower()
    assert f"testdata/{low}-stale-generation.yaml" in names and f"testdata/{low}-no-status.yaml" in names


def test_every_testdata_file_is_a_case() -> None:
    files = {f"testdata/{p.name}" for p in (CHECK / "testdata").glob("*.yaml")}
    assert files == {c["inputPath"] for _, c in _cases()}


@pytest.mark.parametrize("kind", KINDS)
def test_ready_with_a_stale_generation_is_never_healthy(kind: str) -> None:
    """Whatever the conditions say, status from an older generation is Progressing (no flapping)."""
    script = SCRIPT.read_text()
    obj = _fixture(kind, "ready")
    assert run_health(script, obj)["status"] == "Healthy"
    obj["metadata"]["generation"] += 1
    assert run_health(script, obj)["status"] == "Progressing"
    del obj["status"]["observedGeneration"]
    assert run_health(script, obj)["status"] == "Progressing"


@pytest.mark.parametrize("kind", KINDS)
def test_stalled_or_degraded_wins_over_ready(kind: str) -> None:
    script = SCRIPT.read_text()
    obj = _fixture(kind, "ready")
    gen = obj["metadata"]["generation"]
    for bad in ("Stalled", "Degraded"):
        conds = [c for c in obj["status"]["conditions"] if c["type"] != bad]
        conds.append(
            {
                "type": bad,
                "status": "True",
                "reason": "Broken",
                "message": "it broke",
                "observedGeneration": gen,
            }
        )
        o = {**obj, "status": {**obj["status"], "conditions": conds}}
        got = run_health(script, o)
        assert got["status"] == "Degraded" and got["message"].startswith("Broken: it broke")


def test_argocd_cm_embeds_the_same_script_for_every_kind_of_the_group() -> None:
    cm = yaml.safe_load((ARGOCD / "argocd-cm.yaml").read_text())
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["name"] == "argocd-cm"
    assert list(cm["data"]) == ["resource.customizations"]
    customizations = yaml.safe_load(cm["data"]["resource.customizations"])
    assert customizations == {"trtforge.io/*": {"health.lua": SCRIPT.read_text()}}


def _crd_schema(kind: str) -> dict[str, Any] | None:
    path = REPO / "charts" / "trtforge" / "crds" / CRD_FILES[kind]
    if not path.exists():
        return None
    crd = yaml.safe_load(path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize(
    ("kind", "case"), _cases(), ids=lambda x: x if isinstance(x, str) else x["inputPath"]
)
def test_fixture_matches_the_crd_schema(kind: str, case: dict[str, Any]) -> None:
    """The fixtures are resources the API server would hold: spec and status fit the generated CRD."""
    schema = _crd_schema(kind)
    if schema is None:
        pytest.skip("CRDs not generated yet")
    obj = yaml.safe_load((CHECK / case["inputPath"]).read_text())
    body = {k: v for k, v in obj.items() if k in ("spec", "status")}
    sub = {"type": "object", "properties": {k: schema["properties"][k] for k in body}}
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft4Validator(sub).iter_errors(body)
    ]
    assert errors == []
    assert _pruned(body, sub) == [], "fields the API server would prune (not in the CRD schema)"


def _pruned(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Paths of fields the API server would drop from `value` (unknown to a structural schema)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for k, v in value.items():
            if props is not None and k in props:
                out += _pruned(v, props[k], f"{path}.{k}")
            elif isinstance(extra, dict):
                out += _pruned(v, extra, f"{path}.{k}")
            else:
                out.append(f"{path}.{k}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            out += _pruned(v, schema["items"], f"{path}[{i}]")
    return out


def test_applications_parse() -> None:
    docs = [d for d in yaml.safe_load_all((ARGOCD / "application.yaml").read_text()) if d]
    assert [d["kind"] for d in docs] == ["Application", "Application"]
    operator = docs[0]
    assert operator["spec"]["source"]["path"] == "charts/trtforge"
    assert "ServerSideApply=true" in operator["spec"]["syncPolicy"]["syncOptions"]
    for d in docs:
        opts = d["spec"]["syncPolicy"].get("syncOptions", [])
        assert not any(o.startswith(("Replace=", "Force=")) for o in opts), (
            "would wipe the operator's annotations"
        )


def test_inferencedeployment_health_shows_current_and_desired_replicas() -> None:
    """Whatever the health, the message ends with the pods ready, current and desired (an
    autoscaler's count included); a status without the counts (an older operator) adds nothing."""
    script = SCRIPT.read_text()
    obj = _fixture("InferenceDeployment", "ready")
    obj["status"].update(replicas=5, desiredReplicas=4, readyReplicas=3)
    assert run_health(script, obj)["message"].endswith("(replicas: 3 ready, 5 current, 4 desired)")
    obj["metadata"]["generation"] += 1  # Progressing, waiting for the operator: no counts
    assert "replicas:" not in run_health(script, obj)["message"]
    obj["metadata"]["generation"] -= 1
    for key in ("replicas", "desiredReplicas", "readyReplicas"):
        del obj["status"][key]
    assert run_health(script, obj)["message"] == "AllReplicasReady: 4/4 replicas ready on 2 targets"
