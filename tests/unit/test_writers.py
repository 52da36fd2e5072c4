"""One writer per child kind: the table in docs/design.md §"One writer per child" holds for the code.

Every call in the operator package that creates, patches, annotates or deletes an object is found in
the source (AST): through `Kube` (kube.py, the one API wrapper, whose own body is not counted) or a
Kubernetes client's `create_namespaced_*`, `patch_namespaced_*`, ... methods. Each call's kind must
have a row, and all of a kind's calls must be in the module that row names. The deployment-side
kinds' writer is whichever module applies the InferenceDeployment's plan: their calls may sit in the
row's module or in one of the modules that can hold that applier, but all in one.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "operator" / "trtforge_operator"
DESIGN = ROOT / "docs" / "design.md"
SECTION = "## One writer per child"
DEPLOYMENT_APPLIER = "the deployment applier"
# Where the InferenceDeployment's applier may live.
DEPLOYMENT_APPLIER_MODULES = frozenset({"apply/deployment.py"})
KUBE_READS = frozenset(
    {
        "read_pod",
        "read_claim",
        "claim_events",
        "read_job",
        "replica_set_owners",
        "job_annotations",
        "served_versions",
        "served_resources",
        "scaled_objects",
        "leader_worker_sets",
        "list_custom",
        "token_review",
        "_call",
        "_call_unparsed",
    }
)
CLIENT_WRITE = re.compile(r"^(create|patch|replace|delete)_(?:collection_)?namespaced_(\w+)$")
CLIENT_KINDS = {
    "job": "Job",
    "deployment": "Deployment",
    "service": "Service",
    "secret": "Secret",
    "config_map": "ConfigMap",
    "event": "Event",
    "lease": "Lease",
    "pod": "Pod",
    "horizontal_pod_autoscaler": "HorizontalPodAutoscaler",
    "custom_object_status": "status",
    "service_account": "ServiceAccount",
    "role": "Role",
    "role_binding": "RoleBinding",
}


def table() -> dict[str, tuple[str, str]]:
    """Kind -> (writer, module) from the record's table (a row may name several kinds, `A, B`)."""
    text = DESIGN.read_text()
    assert SECTION in text, f"docs/design.md has no section {SECTION!r}"
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, str]] = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("Child kind", "") or set(cells[0]) <= {"-"}:
            continue
        for kind in cells[0].split(","):
            rows[kind.strip()] = (cells[1], cells[2].strip("`"))
    return rows


def _kind_of_object(arg: ast.expr | None) -> set[str]:
    """The kind of `kube.create(x)` from what the argument is called."""
    name = ast.unparse(arg).lower() if arg is not None else ""
    if "job" in name:
        return {"Job"}
    if "deployment" in name or name.startswith("dep"):
        return {"Deployment"}
    if "service" in name or "svc" in name:
        return {"Service"}
    return {f"?create({name})"}


def kube_write_kinds(method: str, call: ast.Call) -> set[str]:
    """The kinds a `Kube` method call writes; empty for a read. Unknown writes get a `?` kind."""
    first = call.args[0] if call.args else None
    literal = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
    if method in KUBE_READS:
        return set()
    if "scaled" in method:
        return {"ScaledObject"}
    if "autoscaler" in method or "hpa" in method:
        return {"HorizontalPodAutoscaler"}
    if method in ("create", "create_job_uid"):
        return {"Job"} if method == "create_job_uid" else _kind_of_object(first)
    if "config_map" in method:
        return {"ConfigMap"}
    if method == "apply_owned":
        return {"Deployment", "Service"}
    if method in ("delete", "annotate"):
        return {literal or f"?{method}"}
    if method in ("create_pod", "label_pod"):
        return {"Pod"}
    if "network_policy" in method:
        return {"NetworkPolicy"}
    if "leader_worker_set" in method:
        return {"LeaderWorkerSet"}
    if "rank_exec_access" in method:
        return {"ServiceAccount", "Role", "RoleBinding"}
    if method == "patch_status":
        return {"status"}
    if method == "event":
        return {"Event"}
    return {f"?{method}"}


def writes(source: str, filename: str) -> list[tuple[str, int, str]]:
    """(kind, line, call) of every write in `source`."""
    out: list[tuple[str, int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        # A client method, called or handed to a thread (`to_thread(api.create_namespaced_lease, ...)`).
        if (
            isinstance(node, ast.Attribute)
            and (m := CLIENT_WRITE.match(node.attr))
            and "review" not in m.group(2)
        ):
            out.append((CLIENT_KINDS.get(m.group(2), f"?{m.group(2)}"), node.lineno, ast.unparse(node)))
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        method, receiver = node.func.attr, ast.unparse(node.func.value)
        if receiver == "kube" or receiver.endswith(".kube"):
            out.extend((k, node.lineno, ast.unparse(node.func)) for k in kube_write_kinds(method, node))
    return out


def operator_writes() -> dict[str, dict[str, list[str]]]:
    """Kind -> module (relative to the package) -> the calls there."""
    found: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel == "kube.py":
            continue
        for kind, line, call in writes(path.read_text(), str(path)):
            found[kind][rel].append(f"{rel}:{line} {call}")
    return found


def test_every_write_is_in_its_kinds_one_writer() -> None:
    rows, found = table(), operator_writes()
    problems: list[str] = []
    for kind, modules in sorted(found.items()):
        if kind not in rows:
            calls = [c for cs in modules.values() for c in cs]
            problems.append(f"{kind}: no row in docs/design.md {SECTION!r} for {calls}")
            continue
        writer, module = rows[kind]
        allowed = {module} if module else set()
        if writer == DEPLOYMENT_APPLIER:
            allowed |= DEPLOYMENT_APPLIER_MODULES
        stray = {m: cs for m, cs in modules.items() if m not in allowed}
        if stray or len(modules) > 1:
            problems.append(
                f"{kind}: written in {sorted(modules)}, its one writer is {module or 'none'}: {stray}"
            )
    appliers = {m for k, (w, _) in rows.items() if w == DEPLOYMENT_APPLIER for m in found.get(k, {})}
    if len(appliers) > 1:
        problems.append(f"the deployment-side kinds are written from several modules: {sorted(appliers)}")
    assert not problems, "\n".join(problems)


def test_the_table_names_every_child_kind_and_the_scan_finds_them() -> None:
    rows, found = table(), operator_writes()
    for kind in ("Job", "Deployment", "Service", "Secret", "Event", "status", "HorizontalPodAutoscaler"):
        assert kind in rows, f"docs/design.md {SECTION!r} has no row for {kind}"
    assert rows["ScaledObject"][0] == DEPLOYMENT_APPLIER
    for kind in ("Job", "Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler", "status", "Event"):
        assert found.get(kind), f"no write of {kind} found: the scan misses calls"
    assert found.get("Lease"), "no write of Lease found: the scan misses calls"
    assert rows["Job"][1] == "apply/engine.py"
    for kind, (_, module) in rows.items():
        assert not module or (PKG / module).is_file(), f"{kind}: {module} is not a module of the operator"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("await state.kube.delete('Job', ns, n)", {"Job"}),
        ("await kube.annotate('TRTEngine', ns, n, {})", {"TRTEngine"}),
        ("await state.kube.create(job)", {"Job"}),
        ("await state.kube.apply_owned(obj_)", {"Deployment", "Service"}),
        ("await state.kube.apply_scaled_object(so)", {"ScaledObject"}),
        ("await kube.apply_config_map(cm)", {"ConfigMap"}),
        ("await kube.apply_rank_exec_access(m)", {"ServiceAccount", "Role", "RoleBinding"}),
        ("await kube.delete('RoleBinding', ns, n)", {"RoleBinding"}),
        ("rbac.create_namespaced_role_binding(ns, body)", {"RoleBinding"}),
        ("self.api.replace_namespaced_lease(n, ns, body)", {"Lease"}),
        ("await asyncio.to_thread(self.api.create_namespaced_lease, ns, body)", {"Lease"}),
        ("core.create_namespaced_secret(ns, body)", {"Secret"}),
        ("auth.create_token_review(body)", set()),
        ("await state.kube.read_pod(ns, n)", set()),
        ("await state.kube.frobnicate(x)", {"?frobnicate"}),
    ],
)
def test_the_scan_classifies_writes(source: str, expected: set[str]) -> None:
    assert {k for k, _, _ in writes(f"async def f():\n    {source}\n", "x.py")} == expected
