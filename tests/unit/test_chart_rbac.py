"""Least privilege, read from the chart's RBAC templates as they are (they are static YAML)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from test_chart_helpers import (
    FULLNAME,
    PLACEHOLDER,
    RELEASE_NAMESPACE,
    REPO,
    TEMPLATES,
    skeleton,
    substitute_static,
)

STATIC_RBAC = [
    "rbac-operator.yaml",
    "rbac-build.yaml",
    "rbac-tenant.yaml",
    "rbac-leader-election.yaml",
    "rbac-broker.yaml",
    "rbac-front-proxy.yaml",
    "rbac-rank-exec.yaml",
]
KNOWN_VERBS = {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
DANGEROUS_VERBS = {"escalate", "bind", "impersonate", "approve", "sign", "*"}


def _docs(name: str) -> list[dict[str, Any]]:
    docs = list(yaml.safe_load_all(substitute_static((TEMPLATES / name).read_text())))
    return [d for d in docs if d]


def _roles() -> list[dict[str, Any]]:
    return [d for name in STATIC_RBAC for d in _docs(name) if d["kind"] in ("Role", "ClusterRole")]


def _role(name: str) -> dict[str, Any]:
    (role,) = [r for r in _roles() if r["metadata"]["name"] == name]
    return role


def _grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def test_every_rbac_template_is_covered() -> None:
    rbac = {p.name for p in TEMPLATES.glob("rbac-*.yaml")}
    assert rbac == {*STATIC_RBAC, "rbac-operator-bindings.yaml"}


@pytest.mark.parametrize("name", STATIC_RBAC)
def test_rbac_templates_are_static(name: str) -> None:
    """Only names are templated: substitute_static fails on anything else (values, conditions inside)."""
    assert _docs(name)


def test_rank_exec_role_is_opt_in_and_only_what_a_trtllm_leaders_access_needs() -> None:
    """A trtllm-serve leader's account, Role (pods/exec on its workers) and RoleBinding: written,
    never escalated, bound or listed; pods/exec only because that Role grants it (RBAC's escalation
    rule). Rendered only with rbac.rankExec (the template's wrapper)."""
    text = (TEMPLATES / "rbac-rank-exec.yaml").read_text()
    assert text.startswith("{{- if .Values.rbac.rankExec }}")
    role = _role(f"{FULLNAME}-operator-rank-exec")
    assert role["kind"] == "ClusterRole"
    assert _grants(role) == {
        *(
            (g, r, v)
            for g, r in [("", "serviceaccounts"), ("rbac.authorization.k8s.io", "roles"),
                         ("rbac.authorization.k8s.io", "rolebindings")]
            for v in ("get", "create", "update", "delete")
        ),
        ("", "pods/exec", "create"),
    }  # fmt: skip


def test_front_proxy_role_writes_configmaps_by_name_only() -> None:
    role = _role(f"{FULLNAME}-operator-front-proxy")
    assert _grants(role) == {("", "configmaps", v) for v in ("get", "create", "update", "delete")}


def test_no_wildcards_and_verbs_listed() -> None:
    roles = _roles()
    assert len(roles) >= 5
    for role in roles:
        for rule in role["rules"]:
            where = f"{role['metadata']['name']}: {rule}"
            for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                assert "*" not in rule.get(field, []), where
                assert not any("*" in str(x) for x in rule.get(field, [])), where
            assert rule["verbs"], where
            assert set(rule["verbs"]) <= KNOWN_VERBS, where
            assert not set(rule["verbs"]) & DANGEROUS_VERBS, where
            assert "nonResourceURLs" not in rule, where


def test_no_role_touches_secrets() -> None:
    """Nothing the chart's roles grant reads or writes a Secret: verify Jobs read a model's Secret in the
    TRTEngine's namespace with that namespace's rights, builds read the broker-verified copy, and the
    store's credentials reach pods as volumes the kubelet mounts."""
    for role in _roles():
        assert not {v for g, r, v in _grants(role) if g == "" and r == "secrets"}, role["metadata"]["name"]


def test_operator_cluster_role_is_only_what_is_cluster_scoped() -> None:
    """What must span namespaces whatever operator.watchNamespaces says: kopf's CRD discovery, the
    namespaces' cache-group labels (cache.sharing), GPU nodes. Read only."""
    role = _role(f"{FULLNAME}-operator")
    assert role["kind"] == "ClusterRole"
    assert _grants(role) == {
        (g, r, v)
        for g, r in [("apiextensions.k8s.io", "customresourcedefinitions"), ("", "namespaces"), ("", "nodes")]
        for v in ("get", "list", "watch")
    }


def test_operator_watched_role_is_what_it_does_in_a_namespace() -> None:
    role = _role(f"{FULLNAME}-operator-watched")
    assert role["kind"] == "ClusterRole"  # bound per namespace, or cluster-wide (rbac-operator-bindings.yaml)
    grants = _grants(role)
    resources = {(g, r) for g, r, _ in grants}
    for g, r in [("", "persistentvolumeclaims"), ("", "secrets"), ("", "configmaps"), ("", "nodes")]:
        assert (g, r) not in resources, f"{g}/{r} is not granted per watched namespace"
    # create/delete: verify Jobs run in the tenant's namespace (proof of possession); build Jobs are
    # annotated only in the build namespace.
    assert {v for g, r, v in grants if (g, r) == ("batch", "jobs")} == {
        "get",
        "list",
        "watch",
        "create",
        "delete",
    }
    assert ("authentication.k8s.io", "tokenreviews", "create") not in grants, "the broker checks tokens"
    assert ("", "events", "create") in grants
    # Runtime pods are moved by deleting them; rank pods of a group are the operator's own (made,
    # labelled whole, deleted whole). No pods/exec (rbac.rankExec's own role), pods/eviction,
    # pods/attach or the like, and no RBAC objects or accounts.
    assert {(r, v) for g, r, v in grants if g == "" and r.startswith("pods")} == {
        ("pods", v) for v in ("list", "watch", "create", "patch", "delete")
    }
    assert not {r for g, r, _ in grants if g == "rbac.authorization.k8s.io" or r == "serviceaccounts"}
    assert {v for g, r, v in grants if r in ("trtengines", "inferencedeployments")} == {
        "get",
        "list",
        "watch",
        "patch",
    }, "the operator never creates, replaces or deletes tenants' resources"


def test_crd_resources_in_rules_exist() -> None:
    plurals = set()
    for p in (REPO / "operator" / "trtforge_operator" / "crds").glob("*.yaml"):
        crd = yaml.safe_load(p.read_text())
        plurals.add(crd["spec"]["names"]["plural"])
    if not plurals:
        pytest.skip("no CRDs generated yet")
    for role in _roles():
        for g, r, _ in _grants(role):
            if g == "trtforge.io":
                assert r.split("/")[0] in plurals, r
                assert r.split("/")[1:] in ([], ["status"], ["finalizers"]), r


def test_build_role_is_namespaced_in_the_build_namespace() -> None:
    role = _role(f"{FULLNAME}-build")
    assert role["kind"] == "Role"
    grants = _grants(role)
    assert ("batch", "jobs", "create") in grants
    assert ("batch", "jobs", "delete") in grants
    assert ("batch", "jobs", "patch") in grants
    assert ("", "pods", "watch") in grants
    assert ("", "pods/log", "get") not in grants, "build results come in the termination message"
    assert not {r for _, r, _ in grants} & {"secrets"}, "a Job mounts them, not us"
    (claims,) = [r for r in role["rules"] if "persistentvolumeclaims" in r["resources"]]
    assert claims["verbs"] == ["get"] and claims["resourceNames"] == [f"{FULLNAME}-engines"], (
        "the store's claim only, read only (its StoreReady condition)"
    )
    (binding,) = [d for d in _docs("rbac-build.yaml") if d["kind"] == "RoleBinding"]
    assert binding["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": FULLNAME, "namespace": RELEASE_NAMESPACE}
    ]
    text = (TEMPLATES / "rbac-build.yaml").read_text()
    assert text.count('namespace: {{ include "trtforge.buildNamespace" . }}') == 2


def test_tenant_roles_aggregate_into_view_and_edit() -> None:
    view, edit = _role(f"{FULLNAME}-view"), _role(f"{FULLNAME}-edit")
    for role in (view, edit):
        assert role["kind"] == "ClusterRole"
        assert {g for g, _, _ in _grants(role)} == {"trtforge.io"}, "tenant roles grant only trtforge kinds"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-view" not in edit["metadata"]["labels"]
    assert {v for _, _, v in _grants(view)} == {"get", "list", "watch"}
    edit_resources = {r for _, r, _ in _grants(edit)}
    assert edit_resources == {"trtengines", "inferencedeployments"}, "tenants never write status"


def test_bindings_name_the_charts_service_account() -> None:
    for name in STATIC_RBAC:
        account = f"{FULLNAME}-broker" if name == "rbac-broker.yaml" else FULLNAME
        for d in _docs(name):
            if d["kind"] in ("RoleBinding", "ClusterRoleBinding"):
                assert d["subjects"] == [
                    {"kind": "ServiceAccount", "name": account, "namespace": RELEASE_NAMESPACE}
                ]
                assert d["roleRef"]["name"] == d["metadata"]["name"]


def test_broker_role_is_token_reviews_and_listing_references_only() -> None:
    """The broker's own ServiceAccount: exactly what trtforge_operator.broker.KubeAuthorizer calls."""
    role = _role(f"{FULLNAME}-broker")
    assert role["kind"] == "ClusterRole"
    assert _grants(role) == {
        ("authentication.k8s.io", "tokenreviews", "create"),
        ("trtforge.io", "trtengines", "list"),
        ("trtforge.io", "inferencedeployments", "list"),
        ("", "pods", "get"),
        ("batch", "jobs", "get"),
    }
    (sa,) = [d for d in _docs("rbac-broker.yaml") if d["kind"] == "ServiceAccount"]
    assert sa["metadata"] == {
        "name": f"{FULLNAME}-broker",
        "namespace": RELEASE_NAMESPACE,
        "labels": {"app.kubernetes.io/component": "broker"},
    }


def test_operator_watched_role_is_bound_per_namespace_when_namespaces_are_watched() -> None:
    """One binding of each -operator-<role> ClusterRole (watched, and with their options front-proxy
    and rank-exec) to the chart's ServiceAccount, in either branch; the rendered result in each mode
    is checked with Helm (tests/integration/test_chart_rbac_docs.py)."""
    path: Path = TEMPLATES / "rbac-operator-bindings.yaml"
    docs = skeleton(path.read_text())
    assert [d["kind"] for d in docs] == ["ClusterRoleBinding", "RoleBinding"]
    for d in docs:
        assert d["metadata"]["name"] == f"{PLACEHOLDER}-operator-{PLACEHOLDER}"
        assert d["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": f"{PLACEHOLDER}-operator-{PLACEHOLDER}",
        }
        (subject,) = d["subjects"]
        assert subject["kind"] == "ServiceAccount"
    text = path.read_text()
    assert '{{- $roles := list "watched" -}}' in text
    assert '{{- if .Values.runtime.frontProxy.enabled }}{{- $roles = append $roles "front-proxy" -}}' in text
    assert '{{- if .Values.rbac.rankExec }}{{- $roles = append $roles "rank-exec" -}}' in text
    assert "{{- if not $root.Values.operator.watchNamespaces }}" in text
    assert (
        '(append $root.Values.operator.watchNamespaces (include "trtforge.buildNamespace" $root)) | uniq'
        in text
    )


def test_leases_only_in_the_release_namespace_and_only_ours() -> None:
    """Leader election may touch Leases in the operator's namespace only; get/update only its own."""
    for role in _roles():
        grants = _grants(role)
        if any(g == "coordination.k8s.io" for g, _, _ in grants):
            assert role["kind"] == "Role", role["metadata"]["name"]
            assert role["metadata"]["namespace"] == RELEASE_NAMESPACE
            assert role["metadata"]["name"] == f"{FULLNAME}-leader-election"
    role = _role(f"{FULLNAME}-leader-election")
    by_verb = {v: rule for rule in role["rules"] for v in rule["verbs"]}
    assert set(by_verb) == {"create", "get", "update"}
    assert by_verb["get"]["resourceNames"] == ["trtforge-operator"]
    assert by_verb["update"]["resourceNames"] == ["trtforge-operator"]
