"""The Helm chart without Helm: values against the enforced schema, CRDs against crds/, templates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from test_chart_helpers import CHART, REPO, TEMPLATES, default_values, schema, skeleton, values_with


def _errors(values: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(schema())
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(values)]


def test_schema_is_valid_draft7() -> None:
    jsonschema.Draft7Validator.check_schema(schema())


def test_default_values_validate() -> None:
    assert _errors(default_values()) == []


@pytest.mark.parametrize("path", sorted((CHART / "ci").glob("*-values.yaml")), ids=lambda p: p.name)
def test_ci_values_validate(path: Path) -> None:
    """Each CI values file, coalesced over values.yaml as Helm does, passes the schema."""
    override = yaml.safe_load(path.read_text())
    assert _errors(values_with(override)) == []


def test_ci_values_files_exist() -> None:
    names = {p.name for p in (CHART / "ci").glob("*-values.yaml")}
    assert {"pvc-values.yaml", "s3-values.yaml", "namespaced-values.yaml"} <= names


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ({"operatr": {}}, "Additional properties"),  # a typo at the top
        ({"operator": {"replicaCount": 2}}, "Additional properties"),  # a typo below
        ({"images": {"operator": {"tag": "latest"}}}, "should not be valid"),
        ({"images": {"runtime": {"digest": "sha256:xyz"}}}, "does not match"),
        ({"operator": {"replicas": -1}}, "less than the minimum"),
        ({"operator": {"leaderElection": {"leaseDuration": 15}}}, "Additional properties"),
        ({"operator": {"leaderElection": {"leaseDurationSeconds": 1}}}, "less than the minimum"),
        ({"operator": {"leaderElection": {"retryPeriodSeconds": 0}}}, "less than or equal to the minimum"),
        ({"metrics": {"prometheusRule": {"for": {"stalled": "soon"}}}}, "does not match"),
        ({"operator": {"podSecurityContext": {"runAsUser": 0}}}, "less than the minimum"),
        ({"operator": {"podSecurityContext": {"privileged": True}}}, "Additional properties"),
        ({"store": {"type": "s3"}}, ""),  # no bucket, no credentials
        ({"store": {"type": "s3", "s3": {"bucket": "b-1", "existingSecret": ""}}}, ""),
        ({"store": {"type": "gcs"}}, "is not one of"),
        ({"store": {"pvc": {"create": False}}}, ""),  # an existing claim needs its name
        ({"store": {"pvc": {"path": "../etc"}}}, "should not be valid"),
        ({"build": {"namespace": "Not_A_Namespace"}}, "does not match"),
        ({"build": {"maxConcurrentPerNamespace": 0}}, "less than the minimum"),
        ({"build": {"memory": "lots"}}, "is not valid"),
        ({"service": {"type": "LoadBalancer"}}, "is not one of"),
        ({"service": {"brokerPort": 80}}, "less than the minimum"),  # non-root cannot bind < 1024
        ({"engineBackends": {"gpu": {"backend": "tensorrt", "version": "1"}}}, "is not of type"),
        ({"engineBackends": {"gpu": "tensorrt-10"}}, "is not one of"),
        ({"serviceAccount": {"create": False}}, "should be non-empty"),
        ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "does not match"),
        ({"broker": {"replicas": 1}}, "less than the minimum"),  # the data path of every runtime pod
        ({"broker": {"podDisruptionBudget": {"minAvailable": 0}}}, "less than the minimum"),
        ({"broker": {"podDisruptionBudget": {"maxUnavailable": 1}}}, "Additional properties"),
        ({"broker": {"maxBytesPerSecond": -1}}, "less than the minimum"),
        ({"broker": {"spoolSize": "big"}}, "is not valid"),
        ({"broker": {"replica": 3}}, "Additional properties"),
    ],
)
def test_schema_refuses(override: dict[str, Any], needle: str) -> None:
    errors = _errors(values_with(override))
    assert errors, f"{override} was accepted"
    assert any(needle in e for e in errors), errors


def test_schema_accepts_s3_with_existing_secret_or_inline_keys() -> None:
    base = {"store": {"type": "s3", "s3": {"bucket": "engines"}}}
    assert _errors(values_with(base, {"store": {"s3": {"existingSecret": "s3-creds"}}})) == []
    inline = {"store": {"s3": {"accessKeyId": "AKIA", "secretAccessKey": "secret"}}}
    assert _errors(values_with(base, inline)) == []


def test_every_value_key_is_in_the_schema() -> None:
    """values.yaml documents every key the schema allows at the first two levels, and no other."""
    values, props = default_values(), schema()["properties"]
    assert set(values) == set(props)
    for key, sub in props.items():
        if isinstance(values[key], dict) and "properties" in sub:
            assert set(values[key]) == set(sub["properties"]), key


# --- CRDs: generated from the API models into crds/ and the chart's crds/ (`make crds`)


def test_chart_crds_equal_crds_dir() -> None:
    top = {p.name: p.read_bytes() for p in sorted((REPO / "crds").glob("*.yaml"))}
    chart = {p.name: p.read_bytes() for p in sorted((CHART / "crds").glob("*.yaml"))}
    if not top and not chart:
        pytest.skip("no CRDs generated yet (`trtforge crds` writes both folders)")
    assert set(chart) == set(top), "charts/trtforge/crds/ and crds/ hold different files: run `make crds`"
    for name in top:
        assert chart[name] == top[name], f"{name} differs between crds/ and the chart: run `make crds`"
    kinds = {yaml.safe_load(b)["spec"]["names"]["kind"] for b in top.values()}
    assert {"TRTEngine", "InferenceDeployment"} <= kinds


# --- Templates: each parses; the wiring that matters is present


@pytest.mark.parametrize("path", sorted(TEMPLATES.glob("*.yaml")), ids=lambda p: p.name)
def test_template_skeleton_parses(path: Path) -> None:
    docs = skeleton(path.read_text())
    for d in docs:
        assert d.get("apiVersion") and d.get("kind"), f"{path.name}: a document without apiVersion/kind"
        assert "metadata" in d and "name" in d["metadata"], f"{path.name}: a document without a name"


def _operator_config_fields() -> dict[str, Any] | None:
    try:
        from trtforge_operator.config import OperatorConfig
    except ImportError:
        return None
    fields: dict[str, Any] = {}
    for name, f in OperatorConfig.model_fields.items():
        ann = f.annotation
        sub = getattr(ann, "model_fields", None)
        fields[name] = set(sub) if sub is not None else None
    return fields


def test_configmap_keys_are_operator_config_fields() -> None:
    """The chart's config file uses only fields the operator's config model knows (it forbids others)."""
    fields = _operator_config_fields()
    if fields is None:
        pytest.skip("trtforge_operator.config is not importable")
    (cm,) = skeleton((TEMPLATES / "configmap.yaml").read_text())
    config = yaml.safe_load(cm["data"]["config.yaml"])
    unknown = set(config) - set(fields)
    assert not unknown, f"config keys the operator does not know: {unknown}"
    for key, value in config.items():
        if isinstance(value, dict) and fields[key] is not None and key != "backends":
            assert set(value) <= fields[key], f"{key}: {set(value) - fields[key]}"
    for must in ("store_uri", "build_namespace", "operator_namespace", "builder_image", "runtime_image"):
        assert must in config


def test_deployment_runs_leader_elected_replicas_with_rolling_updates() -> None:
    """Two replicas by default, more allowed; a rolling update never drops below the replicas."""
    (dep,) = skeleton((TEMPLATES / "deployment.yaml").read_text())
    assert dep["spec"]["strategy"]["type"] == "RollingUpdate"
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert "--standalone" not in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert default_values()["operator"]["replicas"] == 2
    assert _errors(values_with({"operator": {"replicas": 5}})) == []
    le = default_values()["operator"]["leaderElection"]
    assert (le["leaseDurationSeconds"], le["renewDeadlineSeconds"], le["retryPeriodSeconds"]) == (15, 10, 2)


def test_configmap_passes_leader_election_timings() -> None:
    (cm,) = skeleton((TEMPLATES / "configmap.yaml").read_text())
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert set(config["leader_election"]) == {
        "enabled",
        "lease_name",
        "lease_duration_seconds",
        "renew_deadline_seconds",
        "retry_period_seconds",
    }


def test_pdb_only_with_more_than_one_replica() -> None:
    text = (TEMPLATES / "pdb-operator.yaml").read_text()
    assert text.startswith(
        "{{- if and .Values.operator.podDisruptionBudget.enabled (gt (int .Values.operator.replicas) 1) }}"
    )


def test_deployment_mounts_config_and_no_claim() -> None:
    """The operator mounts no claim (a claim that cannot bind must not hold it): on a pvc store it
    reaches the store through the broker with its bound token; on S3, with the credentials."""
    (dep,) = skeleton((TEMPLATES / "deployment.yaml").read_text())
    pod = dep["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert {"config", "tmp", "broker-token", "s3-credentials"} <= set(volumes)  # both store branches
    assert not [v for v in volumes.values() if "persistentVolumeClaim" in v]
    (token,) = volumes["broker-token"]["projected"]["sources"]
    assert token["serviceAccountToken"]["path"] == "token"
    (c,) = pod["containers"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["tmp"]["mountPath"] == "/tmp"  # the only writable path
    assert mounts["s3-credentials"]["readOnly"] is True and mounts["broker-token"]["readOnly"] is True
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["TRTFORGE_BROKER_TOKEN_FILE"] == mounts["broker-token"]["mountPath"] + "/token"
    assert {"TRTFORGE_OPERATOR_CONFIG", "TRTFORGE_S3_CREDENTIALS_DIR", "POD_NAMESPACE"} <= set(env)
    assert {p["name"] for p in c["ports"]} == {"metrics", "healthz"}  # the broker runs apart
    assert c["livenessProbe"]["httpGet"]["port"] == "healthz"


# --- The engine broker: its own Deployment, Service, PodDisruptionBudget and ServiceAccount


def _broker_pod() -> dict[str, Any]:
    (dep,) = skeleton((TEMPLATES / "broker-deployment.yaml").read_text())
    assert dep["kind"] == "Deployment"
    pod: dict[str, Any] = dep["spec"]["template"]["spec"]
    return pod


def test_broker_deployment_runs_trtforge_broker_with_its_own_service_account() -> None:
    (dep,) = skeleton((TEMPLATES / "broker-deployment.yaml").read_text())
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert default_values()["broker"]["replicas"] == 2
    assert _errors(values_with({"broker": {"replicas": 4}})) == []
    text = (TEMPLATES / "broker-deployment.yaml").read_text()
    assert "replicas: {{ .Values.broker.replicas }}" in text
    assert 'serviceAccountName: {{ include "trtforge.brokerName" . }}' in text
    pod = _broker_pod()
    (c,) = pod["containers"]
    assert c["args"][-2:] == ["broker", "--config=/etc/trtforge/config.yaml"]
    assert {p["name"] for p in c["ports"]} == {"broker"}
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "broker"}


def test_broker_mounts_the_store_and_config_and_spreads_over_nodes() -> None:
    pod = _broker_pod()
    assert {"config", "tmp", "store", "s3-credentials"} <= {v["name"] for v in pod["volumes"]}
    (c,) = pod["containers"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["config"]["mountPath"] == "/etc/trtforge"
    assert mounts["store"]["mountPath"].startswith("/mnt/trtforge/pvc/")
    assert mounts["s3-credentials"]["readOnly"] is True
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    text = (TEMPLATES / "broker-deployment.yaml").read_text()
    assert 'include "trtforge.brokerSelectorLabels" . | nindent 20' in text


def test_broker_service_and_pdb_select_the_broker_pods_only() -> None:
    for name in ("broker-service.yaml", "broker-pdb.yaml"):
        text = (TEMPLATES / name).read_text()
        assert 'include "trtforge.brokerSelectorLabels"' in text, name
        assert 'include "trtforge.selectorLabels"' not in text, name
    helpers = (TEMPLATES / "_helpers.tpl").read_text()
    assert "app.kubernetes.io/component: broker" in helpers
    pdb = (TEMPLATES / "broker-pdb.yaml").read_text()
    assert 'apiVersion: {{ include "trtforge.pdbAPIVersion" . }}' in pdb
    assert '.Capabilities.APIVersions.Has "policy/v1/PodDisruptionBudget"' in helpers


def test_operator_config_turns_the_in_process_broker_off_and_points_at_the_service() -> None:
    (cm,) = skeleton((TEMPLATES / "configmap.yaml").read_text())
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert config["broker"]["enabled"] is False
    helpers = (TEMPLATES / "_helpers.tpl").read_text()
    assert 'printf "http://%s.%s.svc:%d" (include "trtforge.brokerName" .) .Release.Namespace' in helpers, (
        "runtime pods reach the broker Service, not the operator's"
    )


def test_images_never_default_to_a_mutable_tag() -> None:
    images = default_values()["images"]
    for name, img in images.items():
        assert img["tag"] in ("",) or img["tag"] not in ("latest", "main", "master"), name
    helpers = (TEMPLATES / "_helpers.tpl").read_text()
    assert '$appTag := printf "%s%s" $root.Chart.AppVersion (default "" $img.tagSuffix)' in helpers
    assert "default $appTag $img.tag" in helpers


def test_servicemonitor_is_optional() -> None:
    text = (TEMPLATES / "servicemonitor.yaml").read_text()
    assert text.startswith("{{- if .Values.metrics.serviceMonitor.enabled }}")
    assert default_values()["metrics"]["serviceMonitor"]["enabled"] is False


def test_prometheusrule_is_optional() -> None:
    text = (TEMPLATES / "prometheusrule.yaml").read_text()
    assert text.startswith("{{- if .Values.metrics.prometheusRule.enabled }}")
    assert default_values()["metrics"]["prometheusRule"]["enabled"] is False


def test_store_claim_survives_uninstall() -> None:
    (pvc, _secret) = skeleton((TEMPLATES / "store.yaml").read_text())
    assert pvc["kind"] == "PersistentVolumeClaim"
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_notes_tell_the_crd_upgrade_path() -> None:
    notes = (TEMPLATES / "NOTES.txt").read_text()
    assert "kubectl apply --server-side --force-conflicts -f charts/trtforge/crds/" in notes
