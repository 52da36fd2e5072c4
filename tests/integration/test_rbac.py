"""The chart's RBAC on a real API server (the test bed), checked with real authorization requests.

The chart's ServiceAccounts and RBAC objects are applied as `helm template` renders them
(tests/integration/chart_release.chart_rbac): what is tested is exactly what the chart ships, in the
default all-namespaces mode and with `operator.watchNamespaces` set. Every check goes through the
API server's RBAC authorizer: `kubectl auth can-i` with impersonation (a SelfSubjectAccessReview as
that user), a SubjectAccessReview, or a real create or get as that user, which must be refused with 403.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from trtforge_dev.testbed.handle import TestBed
from trtforge_dev.testbed.wait import wait_for

from tests.integration.chart_release import apply_chart_rbac, delete_chart_cluster_rbac

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Release:
    """The chart's RBAC as installed for one release: its names and namespaces."""

    fullname: str
    namespace: str  # release namespace = build namespace (the default)
    tenant: str
    other: str

    @property
    def operator(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.fullname}"

    @property
    def broker(self) -> str:
        """The engine broker's own ServiceAccount (rbac-broker.yaml)."""
        return f"system:serviceaccount:{self.namespace}:{self.fullname}-broker"


def _apply(tb: TestBed, obj: dict[str, Any] | str, *args: str) -> None:
    text = obj if isinstance(obj, str) else yaml.safe_dump(obj)
    tb.kubectl("apply", "--validate=false", *args, "-f", "-", input=text)


def _create_namespace(tb: TestBed, name: str) -> None:
    _apply(tb, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


@pytest.fixture(scope="module")
def release(testbed: TestBed) -> Iterator[Release]:
    tag = secrets.token_hex(3)
    rel = Release(
        fullname=f"trtforge-{tag}",
        namespace=f"trtforge-sys-{tag}",
        tenant=f"team-a-{tag}",
        other=f"team-b-{tag}",
    )
    for ns in (rel.namespace, rel.tenant, rel.other):
        _create_namespace(testbed, ns)
    for path in sorted(
        (REPO / "charts" / "trtforge" / "crds").glob("*.yaml")
    ):  # the CEL rules need --validate=false on 1.20
        testbed.kubectl("apply", "--validate=false", "-f", str(path))
    apply_chart_rbac(testbed, rel.fullname, rel.namespace)  # the default: every namespace
    # The store credentials (store.yaml with store.type=s3), in the release/build namespace.
    _apply(
        testbed,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": f"{rel.fullname}-store-s3", "namespace": rel.namespace},
            "stringData": {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret"},
        },
    )
    # A tenant's deployer with `edit` in its namespace only; a reader with `view`. Where the test bed runs
    # no clusterrole-aggregation controller the built-in roles stay empty, so they are bound to what
    # aggregation would fold into them: the chart's -edit and -view roles (edit includes view).
    aggregated = aggregation_running(testbed)
    bindings = {
        "deployer": ["edit"] if aggregated else [f"{rel.fullname}-edit", f"{rel.fullname}-view"],
        "reader": ["view"] if aggregated else [f"{rel.fullname}-view"],
    }
    for sa, roles in bindings.items():
        _apply(
            testbed,
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": rel.tenant}},
        )
        for role in roles:
            testbed.kubectl(
                "-n",
                rel.tenant,
                "create",
                "rolebinding",
                f"{sa}-{role}",
                f"--clusterrole={role}",
                f"--serviceaccount={rel.tenant}:{sa}",
            )
    try:
        yield rel
    finally:
        delete_chart_cluster_rbac(testbed, rel.fullname)
        for ns in (rel.namespace, rel.tenant, rel.other):
            testbed.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _clusterrole(tb: TestBed, name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(tb.kubectl("get", "clusterrole", name, "-o", "json").stdout)
    return out


def aggregation_running(tb: TestBed) -> bool:
    """Whether the clusterrole-aggregation controller filled the built-in `edit` role."""
    return bool(_clusterrole(tb, "edit").get("rules"))


def can_i(
    tb: TestBed,
    user: str,
    verb: str,
    resource: str,
    namespace: str | None = None,
    subresource: str | None = None,
) -> bool:
    args = ["auth", "can-i", verb, resource, f"--as={user}"]
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    if subresource:
        args.append(f"--subresource={subresource}")
    r = tb.kubectl(*args, check=False)
    answer = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    assert answer in ("yes", "no"), f"kubectl {' '.join(args)}: {r.stdout} {r.stderr}"
    return answer == "yes"


def sar(
    tb: TestBed, user: str, verb: str, group: str, resource: str, namespace: str = "", name: str = ""
) -> bool:
    """A SubjectAccessReview for a ServiceAccount user (its groups included, as the authenticator would)."""
    ns = user.split(":")[2]
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"]
    with tb.api_client() as api:
        authz: Any = client.AuthorizationV1Api(api)
        review = authz.create_subject_access_review(
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": user,
                    "groups": groups,
                    "resourceAttributes": {
                        "verb": verb,
                        "group": group,
                        "resource": resource,
                        "namespace": namespace,
                        "name": name,
                    },
                },
            }
        )
    return bool(review.status.allowed)


def as_user(tb: TestBed, user: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return tb.kubectl(f"--as={user}", *args, check=False, input=input)


def _engine(name: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "trtforge.io/v1alpha1",
            "kind": "TRTEngine",
            "metadata": {"name": name},
            "spec": {
                "model": {"uri": "pvc://models/squeezenet.onnx"},
                "targets": [{"gpu": "NVIDIA-H100-80GB-HBM3"}],
            },
        }
    )


def _forbidden(r: subprocess.CompletedProcess[str]) -> bool:
    return r.returncode != 0 and "forbidden" in (r.stderr + r.stdout).lower()


# --- tenants ------------------------------------------------------------------------------------------


def test_tenant_roles_match_the_builtin_aggregation_selectors(testbed: TestBed, release: Release) -> None:
    """The chart's roles carry labels that the API server's own view/edit/admin roles select."""
    chart_labels = {
        r: _clusterrole(testbed, f"{release.fullname}-{r}")["metadata"]["labels"] for r in ("view", "edit")
    }

    def selected(builtin: str, labels: dict[str, str]) -> bool:
        selectors = _clusterrole(testbed, builtin)["aggregationRule"]["clusterRoleSelectors"]
        return any(
            all(labels.get(k) == v for k, v in sel.get("matchLabels", {}).items()) for sel in selectors
        )

    assert selected("view", chart_labels["view"]) and selected("edit", chart_labels["view"])
    assert selected("edit", chart_labels["edit"]) and selected("admin", chart_labels["edit"])
    assert not selected("view", chart_labels["edit"]), "view must not get write rules"


def test_edit_role_aggregates_trtforge(testbed: TestBed, release: Release) -> None:
    if not aggregation_running(testbed):
        pytest.skip(
            "the test bed runs no clusterrole-aggregation controller (kube-controller-manager --controllers)"
        )
    deployer = f"system:serviceaccount:{release.tenant}:deployer"
    wait_for(
        lambda: can_i(testbed, deployer, "create", "trtengines.trtforge.io", release.tenant),
        timeout=60,
        desc="the clusterrole-aggregation controller to fold trtforge-edit into edit",
    )
    for verb in ("get", "list", "watch", "create", "update", "patch", "delete"):
        for kind in ("trtengines.trtforge.io", "inferencedeployments.trtforge.io"):
            assert can_i(testbed, deployer, verb, kind, release.tenant), f"{verb} {kind}"


def test_tenant_creates_engines_in_its_namespace_only(testbed: TestBed, release: Release) -> None:
    deployer = f"system:serviceaccount:{release.tenant}:deployer"
    wait_for(
        lambda: can_i(testbed, deployer, "create", "trtengines.trtforge.io", release.tenant),
        timeout=60,
        desc="aggregated edit role",
    )
    ok = as_user(testbed, deployer, "-n", release.tenant, "create", "-f", "-", input=_engine("mine"))
    assert ok.returncode == 0, ok.stderr
    denied = as_user(testbed, deployer, "-n", release.other, "create", "-f", "-", input=_engine("theirs"))
    assert _forbidden(denied), denied.stderr
    assert not can_i(testbed, deployer, "get", "trtengines.trtforge.io", release.other)
    assert not can_i(testbed, deployer, "list", "inferencedeployments.trtforge.io", release.other)
    assert not can_i(testbed, deployer, "list", "trtengines.trtforge.io")  # not cluster-wide
    assert not sar(testbed, deployer, "create", "trtforge.io", "inferencedeployments", release.other)


def test_tenant_never_writes_status(testbed: TestBed, release: Release) -> None:
    deployer = f"system:serviceaccount:{release.tenant}:deployer"
    wait_for(
        lambda: can_i(testbed, deployer, "create", "trtengines.trtforge.io", release.tenant),
        timeout=60,
        desc="aggregated edit role",
    )
    assert not can_i(
        testbed, deployer, "patch", "trtengines.trtforge.io", release.tenant, subresource="status"
    )
    assert not can_i(
        testbed, deployer, "update", "inferencedeployments.trtforge.io", release.tenant, subresource="status"
    )


def test_tenant_is_denied_the_store_and_the_build_namespace(testbed: TestBed, release: Release) -> None:
    deployer = f"system:serviceaccount:{release.tenant}:deployer"
    secret = f"{release.fullname}-store-s3"
    r = as_user(testbed, deployer, "-n", release.namespace, "get", "secret", secret)
    assert _forbidden(r), r.stderr
    assert not can_i(testbed, deployer, "get", "secrets", release.namespace)
    assert not sar(testbed, deployer, "get", "", "secrets", release.namespace, secret)
    for verb, res in (
        ("create", "jobs.batch"),
        ("create", "pods"),
        ("get", "persistentvolumeclaims"),
        ("list", "pods"),
    ):
        assert not can_i(testbed, deployer, verb, res, release.namespace), (
            f"{verb} {res} in the build namespace"
        )


def test_view_role_reads_but_does_not_write(testbed: TestBed, release: Release) -> None:
    reader = f"system:serviceaccount:{release.tenant}:reader"
    wait_for(
        lambda: can_i(testbed, reader, "list", "trtengines.trtforge.io", release.tenant),
        timeout=60,
        desc="the aggregated view role",
    )
    assert can_i(testbed, reader, "get", "inferencedeployments.trtforge.io", release.tenant)
    assert not can_i(testbed, reader, "create", "trtengines.trtforge.io", release.tenant)
    r = as_user(testbed, reader, "-n", release.tenant, "create", "-f", "-", input=_engine("nope"))
    assert _forbidden(r), r.stderr


# --- the operator ---------------------------------------------------------------------------------------


def test_operator_has_what_the_lifecycle_needs(testbed: TestBed, release: Release) -> None:
    op, tenant, sysns = release.operator, release.tenant, release.namespace
    allowed = [
        ("list", "trtengines.trtforge.io", None, None),
        ("watch", "inferencedeployments.trtforge.io", None, None),
        ("patch", "trtengines.trtforge.io", tenant, None),
        ("patch", "trtengines.trtforge.io", tenant, "status"),
        ("patch", "inferencedeployments.trtforge.io", tenant, "status"),
        ("update", "trtengines.trtforge.io", tenant, "finalizers"),
        ("create", "deployments.apps", tenant, None),
        ("delete", "deployments.apps", tenant, None),
        ("create", "services", tenant, None),
        ("delete", "pods", tenant, None),
        ("watch", "pods", None, None),
        ("list", "nodes", None, None),
        ("create", "events", tenant, None),
        ("list", "customresourcedefinitions.apiextensions.k8s.io", None, None),
        ("create", "jobs.batch", sysns, None),
        ("delete", "jobs.batch", sysns, None),
        # a fault is believed only from a pod of a ReplicaSet its Deployment made (docs/security.md)
        ("list", "replicasets.apps", tenant, None),
        # rank groups (docs/llm.md "Groups"): rank pods
        ("create", "pods", tenant, None),
    ]
    for verb, res, ns, sub in allowed:
        assert can_i(testbed, op, verb, res, ns, sub), (
            f"operator cannot {verb} {res} {sub or ''} in {ns or 'all'}"
        )


def test_operator_is_denied_what_it_does_not_need(testbed: TestBed, release: Release) -> None:
    op, tenant = release.operator, release.tenant
    denied = [
        ("get", "secrets", tenant),
        ("list", "secrets", None),
        ("patch", "jobs.batch", tenant),  # it creates verify Jobs there, and never changes one
        ("update", "nodes", None),
        ("delete", "trtengines.trtforge.io", tenant),
        ("create", "trtengines.trtforge.io", tenant),
        ("create", "clusterroles.rbac.authorization.k8s.io", None),
        ("impersonate", "serviceaccounts", tenant),
        ("create", "persistentvolumeclaims", tenant),
        ("create", "tokenreviews.authentication.k8s.io", None),  # the broker checks tokens, apart
        ("get", "pods/log", release.namespace),  # build results come in the termination message
        ("get", "persistentvolumeclaims", release.namespace),  # any claim: only the store's, by name (below)
        ("watch", "replicasets.apps", tenant),  # listed only when a pod reports a fault
        ("patch", "replicasets.apps", tenant),
        ("patch", "deployments.apps", tenant),  # replaced whole when their spec hash changes
        # a trtllm-serve leader's access only with rbac.rankExec (test_chart_rbac_docs.py)
        ("create", "rolebindings.rbac.authorization.k8s.io", tenant),
        ("create", "serviceaccounts", tenant),
    ]
    for verb, res, ns in denied:
        assert not can_i(testbed, op, verb, res, ns), f"operator may {verb} {res} in {ns or 'all namespaces'}"
    # (`pods/exec` alone would ask about a pod named "exec": the subresource is passed as such)
    assert can_i(testbed, op, "create", "pods", tenant) and not can_i(
        testbed, op, "create", "pods", tenant, "exec"
    )


def test_operator_reads_only_the_stores_claim(testbed: TestBed, release: Release) -> None:
    """It reads the store's claim by name (its StoreReady condition), no other claim, anywhere."""
    op, claim = release.operator, f"{release.fullname}-engines"
    assert sar(testbed, op, "get", "", "persistentvolumeclaims", release.namespace, claim)
    assert not sar(testbed, op, "get", "", "persistentvolumeclaims", release.namespace, "models")
    assert not sar(testbed, op, "get", "", "persistentvolumeclaims", release.tenant, claim)
    for verb in ("list", "watch", "update", "delete"):
        assert not sar(testbed, op, verb, "", "persistentvolumeclaims", release.namespace, claim), verb


SECRET_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")


def assert_no_secrets(tb: TestBed, user: str, namespaces: list[str]) -> None:
    """`user` can do nothing with Secrets in `namespaces`, nor cluster-wide, by name or not."""
    for ns in namespaces:
        for verb in SECRET_VERBS:
            assert not can_i(tb, user, verb, "secrets", ns), f"{user} may {verb} secrets in {ns}"
        assert not sar(tb, user, "get", "", "secrets", ns, "model-credentials")
    for verb in ("get", "list", "watch"):
        assert not can_i(tb, user, verb, "secrets"), f"{user} may {verb} secrets in all namespaces"


def test_operator_touches_no_secret_anywhere(testbed: TestBed, release: Release) -> None:
    """Verify Jobs read a model's Secret in the TRTEngine's namespace, builds read the broker-verified
    copy, and the store's credentials reach pods as volumes: the operator needs no Secret, in the build
    namespace (where the store credentials live) or any other."""
    assert_no_secrets(testbed, release.operator, [release.namespace, release.tenant, release.other])
    r = as_user(
        testbed, release.operator, "-n", release.namespace, "get", "secret", f"{release.fullname}-store-s3"
    )
    assert _forbidden(r), r.stdout + r.stderr


def test_operator_really_creates_a_build_job_and_no_tokenreview(testbed: TestBed, release: Release) -> None:
    """Real requests as the operator: a PSS-restricted Job in the build namespace; a TokenReview is
    refused (the broker, apart, checks tokens)."""
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "rbac-probe", "namespace": release.namespace},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "nodeSelector": {
                        "trtforge.io/no-such-node": "true"
                    },  # never scheduled: authorization only
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "c",
                            "image": "ignored",
                            "command": ["true"],
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }
                    ],
                }
            },
        },
    }
    r = as_user(testbed, release.operator, "create", "-f", "-", input=json.dumps(job))
    assert r.returncode == 0, r.stderr
    tr = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "not-a-token"}}
    r = as_user(testbed, release.operator, "create", "-f", "-", "-o", "json", input=json.dumps(tr))
    assert _forbidden(r), r.stdout + r.stderr
    # Verify Jobs (proof of possession) run in the tenant's namespace; annotating is build-namespace only.
    job["metadata"]["namespace"] = release.tenant
    r = as_user(testbed, release.operator, "create", "-f", "-", input=json.dumps(job))
    assert r.returncode == 0, r.stderr
    r = as_user(
        testbed,
        release.operator,
        "annotate",
        "job",
        "-n",
        release.tenant,
        job["metadata"]["name"],
        "x=y",
    )
    assert _forbidden(r), "the operator may not change Jobs outside the build namespace"


# --- the operator watching some namespaces only (operator.watchNamespaces) -------------------------------


@pytest.fixture(scope="module")
def watched(testbed: TestBed) -> Iterator[Release]:
    """The chart with `operator.watchNamespaces: [tenant]`: `other` is a namespace it does not watch."""
    tag = secrets.token_hex(3)
    rel = Release(
        fullname=f"trtforge-{tag}",
        namespace=f"trtforge-sys-{tag}",
        tenant=f"team-a-{tag}",
        other=f"team-b-{tag}",
    )
    for ns in (rel.namespace, rel.tenant, rel.other):
        _create_namespace(testbed, ns)
    apply_chart_rbac(testbed, rel.fullname, rel.namespace, {"operator": {"watchNamespaces": [rel.tenant]}})
    try:
        yield rel
    finally:
        delete_chart_cluster_rbac(testbed, rel.fullname)
        for ns in (rel.namespace, rel.tenant, rel.other):
            testbed.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# What the operator must never do outside the namespaces it watches and the build namespace.
OUTSIDE_DENIED = [
    ("create", "jobs.batch"),
    ("delete", "jobs.batch"),
    ("list", "jobs.batch"),
    ("watch", "jobs.batch"),
    ("delete", "pods"),
    ("list", "pods"),
    ("create", "deployments.apps"),
    ("patch", "deployments.apps"),
    ("update", "deployments.apps"),
    ("delete", "deployments.apps"),
    ("list", "deployments.apps"),
    ("create", "services"),
    ("delete", "services"),
    ("patch", "trtengines.trtforge.io"),
    ("list", "inferencedeployments.trtforge.io"),
    ("create", "events"),
]


def test_watching_namespaces_the_operator_acts_there_and_in_the_build_namespace(
    testbed: TestBed, watched: Release
) -> None:
    op, tenant, sysns = watched.operator, watched.tenant, watched.namespace
    allowed = [
        ("list", "trtengines.trtforge.io", tenant, None),
        ("watch", "inferencedeployments.trtforge.io", tenant, None),
        ("patch", "trtengines.trtforge.io", tenant, "status"),
        ("update", "inferencedeployments.trtforge.io", tenant, "finalizers"),
        ("create", "deployments.apps", tenant, None),
        ("delete", "deployments.apps", tenant, None),
        ("create", "services", tenant, None),
        ("create", "jobs.batch", tenant, None),  # verify Jobs
        ("delete", "pods", tenant, None),  # the fault loop
        ("create", "events", tenant, None),
        ("create", "jobs.batch", sysns, None),  # build Jobs
        ("patch", "jobs.batch", sysns, None),
        ("watch", "trtengines.trtforge.io", sysns, None),  # kopf watches the build namespace too
        ("watch", "deployments.apps", sysns, None),
        # cluster-scoped by nature
        ("list", "nodes", None, None),
        ("watch", "namespaces", None, None),
        ("list", "customresourcedefinitions.apiextensions.k8s.io", None, None),
    ]
    for verb, res, ns, sub in allowed:
        assert can_i(testbed, op, verb, res, ns, sub), (
            f"operator cannot {verb} {res} {sub or ''} in {ns or 'all'}"
        )


def test_watching_namespaces_no_jobs_pod_deletion_or_deployments_elsewhere(
    testbed: TestBed, watched: Release
) -> None:
    """Not in kube-system, not in a namespace it does not watch, not cluster-wide."""
    op = watched.operator
    for ns in ("kube-system", watched.other, None):
        for verb, res in OUTSIDE_DENIED:
            assert not can_i(testbed, op, verb, res, ns), (
                f"operator may {verb} {res} in {ns or 'all namespaces'}"
            )
    # Real requests, refused by the authorizer.
    for ns in ("kube-system", watched.other):
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "rbac-probe", "namespace": ns},
            "spec": {
                "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}
            },
        }
        r = as_user(testbed, op, "create", "-f", "-", input=json.dumps(job))
        assert _forbidden(r), r.stdout + r.stderr
        r = as_user(testbed, op, "-n", ns, "get", "deployments")
        assert _forbidden(r), r.stdout + r.stderr
        r = as_user(testbed, op, "-n", ns, "delete", "pod", "anything")
        assert _forbidden(r), r.stdout + r.stderr


def test_watching_namespaces_no_secrets(testbed: TestBed, watched: Release) -> None:
    assert_no_secrets(
        testbed, watched.operator, [watched.namespace, watched.tenant, watched.other, "kube-system"]
    )


# --- the engine broker (its own ServiceAccount) -------------------------------------------------------


def test_broker_has_what_serving_needs(testbed: TestBed, release: Release) -> None:
    """What trtforge_operator.broker.KubeAuthorizer calls: TokenReview, and listing a namespace's
    InferenceDeployments and TRTEngines."""
    broker, tenant = release.broker, release.tenant
    for verb, res, ns in [
        ("create", "tokenreviews.authentication.k8s.io", None),
        ("list", "inferencedeployments.trtforge.io", tenant),
        ("list", "trtengines.trtforge.io", release.other),
    ]:
        assert can_i(testbed, broker, verb, res, ns), f"the broker cannot {verb} {res} in {ns or 'all'}"


def test_broker_is_denied_everything_else(testbed: TestBed, release: Release) -> None:
    """Least privilege: no Jobs, no Secrets (the store's credentials reach it as a mounted volume, which
    the kubelet reads, never through its token), no writes to tenants' objects, no tokens minted, no
    Leases, no pods."""
    broker, tenant, sysns = release.broker, release.tenant, release.namespace
    denied = [
        ("create", "jobs.batch", tenant),
        ("create", "jobs.batch", sysns),
        ("get", "secrets", sysns),  # the S3 credentials Secret lives here
        ("list", "secrets", None),
        ("get", "secrets", tenant),
        ("watch", "trtengines.trtforge.io", tenant),
        ("get", "trtengines.trtforge.io", tenant),
        ("patch", "inferencedeployments.trtforge.io", tenant),
        ("create", "trtengines.trtforge.io", tenant),
        ("list", "pods", tenant),
        ("create", "pods", sysns),
        ("create", "deployments.apps", tenant),
        ("impersonate", "serviceaccounts", tenant),
        ("get", "leases.coordination.k8s.io", sysns),
        ("list", "namespaces", None),
        ("create", "subjectaccessreviews.authorization.k8s.io", None),
    ]
    for verb, res, ns in denied:
        assert not can_i(testbed, broker, verb, res, ns), f"the broker may {verb} {res} in {ns or 'all'}"
    assert not sar(testbed, broker, "get", "", "secrets", sysns, f"{release.fullname}-store-s3")
    assert not sar(testbed, broker, "update", "trtforge.io", "trtengines", tenant, "x")


def test_broker_really_reviews_a_token_and_is_refused_a_secret_and_a_job(
    testbed: TestBed, release: Release
) -> None:
    """Real requests as the broker's ServiceAccount."""
    tr = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "not-a-token"}}
    r = as_user(testbed, release.broker, "create", "-f", "-", "-o", "json", input=json.dumps(tr))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["status"].get("authenticated") in (None, False)
    r = as_user(testbed, release.broker, "-n", release.tenant, "get", "inferencedeployments,trtengines")
    assert r.returncode == 0, r.stderr
    r = as_user(
        testbed, release.broker, "-n", release.namespace, "get", "secret", f"{release.fullname}-store-s3"
    )
    assert _forbidden(r), r.stdout + r.stderr
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "broker-probe", "namespace": release.tenant},
        "spec": {
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}
        },
    }
    r = as_user(testbed, release.broker, "create", "-f", "-", input=json.dumps(job))
    assert _forbidden(r), r.stdout + r.stderr
