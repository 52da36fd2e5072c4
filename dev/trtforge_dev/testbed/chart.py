"""The chart through a real Helm (trtforge_dev.testbed.helm): render it, adapt it to the test bed, apply it.

The one test-bed adaptation: the emulated kubelet ignores images (there is no entrypoint), so the
operator's and the broker's containers get `command: [trtforge]` (the image's ENTRYPOINT), run from
this project's venv. Everything else is applied as Helm renders it, for the test bed's Kubernetes
version (`kube_version`, as `helm install` would see it: PodDisruptionBudgets are policy/v1beta1 there).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from trtforge_dev.testbed.handle import TestBed
from trtforge_dev.testbed.helm import helm_path
from trtforge_dev.testbed.paths import project_root

CHART = project_root() / "charts" / "trtforge"
# Kinds that exist only with the Prometheus Operator's CRDs, and kinds newer than the test bed's
# 1.20 apiserver (policy/v1 PodDisruptionBudget is 1.21+; the chart renders policy/v1beta1 when told
# the cluster's version): applied only where the apiserver serves them; `apply` returns what it left
# out, and the callers say so.
OPTIONAL_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("policy/v1", "PodDisruptionBudget"),
}


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([str(helm_path()), *args], capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({r.returncode}):\n{r.stderr}")
    return r


def render(
    release: str,
    namespace: str,
    values: dict[str, Any] | None = None,
    *files: Path,
    check: bool = True,
    kube_version: str | None = None,
) -> tuple[list[dict[str, Any]], subprocess.CompletedProcess[str]]:
    """`helm template` with values files and an inline values dict (for `kube_version`, e.g. the test
    bed's "v1.20.2"; Helm's own default otherwise); the documents and the result."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    if kube_version:
        args += ["--kube-version", kube_version]
    for f in files:
        args += ["-f", str(f)]
    tmp = None
    if values:
        import tempfile

        tmp = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)  # noqa: SIM115
        yaml.safe_dump(values, tmp)
        tmp.close()
        args += ["-f", tmp.name]
    try:
        r = helm(*args, check=check)
    finally:
        if tmp is not None:
            Path(tmp.name).unlink()
    docs = [d for d in yaml.safe_load_all(r.stdout) if d] if r.returncode == 0 else []
    return docs, r


def kind_of(doc: dict[str, Any]) -> tuple[str, str]:
    return str(doc.get("apiVersion")), str(doc.get("kind"))


def kube_version(tb: TestBed) -> str:
    """The test bed apiserver's version ("v1.20.2"), what `helm install` would render for."""
    from kubernetes import client

    api = tb.api_client()
    try:
        return str(client.VersionApi(api).get_code().git_version).split("-")[0]
    finally:
        api.close()


def for_testbed(docs: list[dict[str, Any]], broker_url: str | None = None) -> list[dict[str, Any]]:
    """The rendered documents with every Deployment's container `command` set (the image's entrypoint:
    the operator and the broker), and, when given, the broker URL runtime pods get (the test bed has
    no Service DNS)."""
    out = []
    for d in docs:
        if d.get("kind") == "Deployment":
            for c in d["spec"]["template"]["spec"]["containers"]:
                c.setdefault("command", ["trtforge"])
        if d.get("kind") == "ConfigMap" and broker_url and "config.yaml" in d.get("data", {}):
            cfg = yaml.safe_load(d["data"]["config.yaml"])
            cfg["broker"]["url"] = broker_url
            d["data"]["config.yaml"] = yaml.safe_dump(cfg)
        out.append(d)
    return out


def served(tb: TestBed) -> set[tuple[str, str]]:
    """The optional (apiVersion, kind) pairs whose API version this apiserver serves."""
    versions = set(tb.kubectl("api-versions").stdout.split())
    return {(v, k) for v, k in OPTIONAL_KINDS if v in versions}


def _kept(tb: TestBed, docs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    ok = served(tb)
    missing = [kind_of(d) for d in docs if kind_of(d) in OPTIONAL_KINDS and kind_of(d) not in ok]
    return [d for d in docs if kind_of(d) not in missing], missing


def apply(tb: TestBed, docs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Server-side apply of the rendered documents; returns the optional kinds left out because this
    apiserver does not serve them (said by the caller)."""
    kept, skipped = _kept(tb, docs)
    text = yaml.safe_dump_all(kept)
    tb.kubectl("apply", "--server-side", "--field-manager=helm-test", "-f", "-", input=text, timeout=180)
    return skipped


def delete(tb: TestBed, docs: list[dict[str, Any]]) -> None:
    kept, _ = _kept(tb, docs)
    tb.kubectl(
        "delete", "--ignore-not-found", "--wait=false", "-f", "-", input=yaml.safe_dump_all(kept), check=False
    )
