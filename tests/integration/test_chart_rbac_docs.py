"""The chart's RBAC as Helm renders it, in both modes, and docs/security.md's tables checked against it.

- With `operator.watchNamespaces` set, the operator's namespaced rights are bound by RoleBindings in
  each watched namespace and the build namespace, and nowhere else; without it, cluster-wide.
- Every permissions table of docs/security.md (each follows a `<!-- rbac: Kind/name -->` marker, the
  name without the release's prefix) lists exactly the rendered role's rules: API group, resources,
  verbs. The "why" column is prose. Run this module as a script to print the tables as the chart
  renders them.

Needs only Helm (`make helm`), not the test bed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from trtforge_dev.testbed.chart import render

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "security.md"
RELEASE, NAMESPACE = "trtforge", "trtforge-system"
ROLE_KINDS = ("ClusterRole", "Role")
BINDING_KINDS = ("ClusterRoleBinding", "RoleBinding")
MARKER = re.compile(r"^<!-- rbac: (ClusterRole|Role)/([a-z0-9-]+) -->$")

Grant = tuple[str, str, str]  # (apiGroup, resource, verb)


def rendered(values: dict[str, Any] | None = None, kinds: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    docs, _ = render(RELEASE, NAMESPACE, values)
    return [d for d in docs if d["kind"] in (*ROLE_KINDS, *BINDING_KINDS, *kinds)]


def short(name: str) -> str:
    """A role's name without the release's full name: `trtforge-operator` -> `operator`."""
    return name[len(RELEASE) + 1 :] if name.startswith(RELEASE + "-") else name


def grants(role: dict[str, Any]) -> set[Grant]:
    return {
        (g, r, v)
        for rule in role.get("rules") or []
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def roles(docs: list[dict[str, Any]]) -> dict[tuple[str, str], set[Grant]]:
    return {(d["kind"], short(d["metadata"]["name"])): grants(d) for d in docs if d["kind"] in ROLE_KINDS}


def doc_tables(text: str) -> dict[tuple[str, str], set[Grant]]:
    """Each marked table of the doc as grants: rows `| API group | resources | verbs | why |`, the core
    group written `core`, resources and verbs separated by commas, resources in backticks."""
    out: dict[tuple[str, str], set[Grant]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = MARKER.match(line.strip())
        if not m:
            continue
        key = (m.group(1), m.group(2))
        assert key not in out, f"docs/security.md: two tables for {key}"
        rows = []
        for row in lines[i + 1 :]:
            if not row.startswith("|"):
                break
            rows.append([c.strip() for c in row.strip().strip("|").split("|")])
        assert rows and [c.lower() for c in rows[0][:3]] == ["api group", "resources", "verbs"], (
            f"docs/security.md: the table after {line.strip()} must start `| API group | resources | verbs |`"
        )
        found: set[Grant] = set()
        for cells in rows[2:]:
            group = "" if cells[0] == "core" else cells[0].strip("`")
            resources = [r.strip().strip("`") for r in cells[1].split(",")]
            verbs = [v.strip() for v in cells[2].split(",")]
            found |= {(group, r, v) for r in resources for v in verbs}
        out[key] = found
    return out


def table(kind: str, name: str, granted: set[Grant]) -> str:
    """A role as the doc writes it: one row per (group, verbs), resources sharing verbs on one row."""
    by_resource: dict[tuple[str, str], set[str]] = {}
    for g, r, v in granted:
        by_resource.setdefault((g, r), set()).add(v)
    order = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]
    rows: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (g, r), verbs in sorted(by_resource.items()):
        rows.setdefault((g, tuple(v for v in order if v in verbs)), []).append(r)
    out = [
        f"<!-- rbac: {kind}/{name} -->",
        "| API group | resources | verbs | why |",
        "| --- | --- | --- | --- |",
    ]
    for (g, verbs), resources in rows.items():
        out.append(f"| {g or 'core'} | {', '.join(f'`{r}`' for r in resources)} | {', '.join(verbs)} | |")
    return "\n".join(out)


def test_every_role_the_chart_renders_has_its_table_in_the_docs_and_it_matches() -> None:
    docs = rendered()
    wanted = roles(docs)
    tables = doc_tables(DOC.read_text())
    missing = sorted(set(wanted) - set(tables))
    assert not missing, (
        "docs/security.md has no table for "
        + ", ".join(f"{k}/{n}" for k, n in missing)
        + ("; as rendered:\n\n" + "\n\n".join(table(k, n, wanted[k, n]) for k, n in missing))
    )
    stale = sorted(set(tables) - set(wanted))
    assert not stale, f"docs/security.md has tables for roles the chart does not render: {stale}"
    for key, granted in wanted.items():
        assert tables[key] == granted, (
            f"docs/security.md, {key[0]}/{key[1]}: the doc lists {sorted(tables[key] - granted)} that the "
            f"chart does not grant, and omits {sorted(granted - tables[key])}; as rendered:\n\n"
            + table(key[0], key[1], granted)
        )


def _bindings(docs: list[dict[str, Any]], role: str) -> list[tuple[str, str]]:
    """(kind, namespace) of every binding to the role `<release>-<role>`."""
    return sorted(
        (d["kind"], d["metadata"].get("namespace", ""))
        for d in docs
        if d["kind"] in BINDING_KINDS and d["roleRef"]["name"] == f"{RELEASE}-{role}"
    )


def test_all_namespaces_mode_binds_the_watched_role_cluster_wide() -> None:
    docs = rendered()
    assert _bindings(docs, "operator-watched") == [("ClusterRoleBinding", "")]
    assert _bindings(docs, "operator") == [("ClusterRoleBinding", "")]
    assert _bindings(docs, "build") == [("RoleBinding", NAMESPACE)]


@pytest.mark.parametrize("build_namespace", ["", "trtforge-builds", "team-a"])
def test_watch_namespaces_binds_the_watched_role_there_and_in_the_build_namespace_only(
    build_namespace: str,
) -> None:
    docs = rendered(
        {"operator": {"watchNamespaces": ["team-a", "team-b"]}, "build": {"namespace": build_namespace}},
        kinds=("ConfigMap",),
    )
    build = build_namespace or NAMESPACE
    assert _bindings(docs, "operator-watched") == sorted(
        ("RoleBinding", ns) for ns in {"team-a", "team-b", build}
    ), "once per watched namespace and the build namespace"
    # The operator watches (kopf's namespaces) exactly where it is bound: the config the chart writes.
    from trtforge_operator.config import OperatorConfig

    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    cfg = OperatorConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))
    assert cfg.watched_namespaces() == [ns for _, ns in _bindings(docs, "operator-watched")]
    # What stays cluster-wide is read-only and cluster-scoped: CRDs, namespaces, nodes.
    cluster_bound = {d["roleRef"]["name"] for d in docs if d["kind"] == "ClusterRoleBinding"}
    operator_roles = {f"{RELEASE}-operator", f"{RELEASE}-operator-watched", f"{RELEASE}-build"}
    by_name = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    for name in cluster_bound & operator_roles:
        for g, r, v in grants(by_name[name]):
            assert (g, r) in {
                ("apiextensions.k8s.io", "customresourcedefinitions"),
                ("", "namespaces"),
                ("", "nodes"),
            }
            assert v in ("get", "list", "watch"), (name, g, r, v)


@pytest.mark.parametrize("watch", [[], ["team-a", "team-b"]])
def test_pods_exec_only_with_rank_exec_and_then_bound_where_the_watched_role_is(watch: list[str]) -> None:
    """By default no role the chart renders grants pods/exec, roles or rolebindings; with
    rbac.rankExec the -operator-rank-exec role does, bound exactly where -operator-watched is, and the
    operator's config says it may (a trtllm-serve group is refused otherwise)."""
    from trtforge_operator.config import OperatorConfig

    def config(docs: list[dict[str, Any]]) -> OperatorConfig:
        (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == f"{RELEASE}-config"]
        return OperatorConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))

    base = {"operator": {"watchNamespaces": watch}}
    off = rendered(base, kinds=("ConfigMap",))
    exec_roles = {
        short(d["metadata"]["name"])
        for d in off
        if d["kind"] in ROLE_KINDS
        and any(r in ("pods/exec", "roles", "rolebindings") for _, r, _ in grants(d))
    }
    assert not exec_roles and not _bindings(off, "operator-rank-exec")
    assert config(off).groups.rank_exec is False
    on = rendered({**base, "rbac": {"rankExec": True}}, kinds=("ConfigMap",))
    (role,) = [
        d for d in on if d["kind"] == "ClusterRole" and short(d["metadata"]["name"]) == "operator-rank-exec"
    ]
    assert ("", "pods/exec", "create") in grants(role)
    assert _bindings(on, "operator-rank-exec") == _bindings(on, "operator-watched")
    assert config(on).groups.rank_exec is True


def test_model_secret_grants_are_refused_by_the_schema_naming_the_field() -> None:
    for values in (
        {"rbac": {"modelSecrets": {"namespaces": ["team-a"]}}},
        {"rbac": {"modelSecrets": {"allNamespaces": True}}},
    ):
        _, r = render(RELEASE, NAMESPACE, values, check=False)
        assert r.returncode != 0, values
        assert "modelSecrets" in r.stderr, r.stderr


if __name__ == "__main__":  # print the tables as the chart renders them (default values)
    for (kind, name), granted in roles(rendered()).items():
        print(table(kind, name, granted), end="\n\n", file=sys.stdout)
