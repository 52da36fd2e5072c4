"""The chart through a real Helm (trtforge.testbed.helm): render it, adapt it to the test bed, apply it.

The one test-bed adaptation: the emulated kubelet ignores images (there is no entrypoint), so the
operator container gets `command: [trtforge]` (the image's ENTRYPOINT), run from this project's venv.
Everything else is applied as Helm renders it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from trtforge.testbed.handle import TestBed
from trtforge.testbed.helm import helm_path

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "trtforge"
# Kinds whose CRDs the test bed lacks (the Prometheus Operator's), and kinds newer than its 1.20
# apiserver (policy/v1 PodDisruptionBudget is 1.21+): not applied there, and said so by the callers.
NEEDS_CRD = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}
NEWER_THAN_TESTBED = {("policy/v1", "PodDisruptionBudget")}


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([str(helm_path()), *args], capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({r.returncode}):\n{r.stderr}")
    return r


def render(
    release: str, namespace: str, values: dict[str, Any] | None = None, *files: Path, check: bool = True
) -> tuple[list[dict[str, Any]], subprocess.CompletedProcess[str]]:
    """`helm template` with values files and an inline values dict; the documents and the result."""
    args = ["template", release, str(CHART), "--namespace", namespace]
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


def for_testbed(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rendered documents with the operator container's `command` set (the image's entrypoint)."""
    out = []
    for d in docs:
        if d.get("kind") == "Deployment":
            for c in d["spec"]["template"]["spec"]["containers"]:
                c.setdefault("command", ["trtforge"])
        out.append(d)
    return out


def apply(tb: TestBed, docs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Server-side apply of every document the test bed can hold; returns the (apiVersion, kind) skipped."""
    skipped = [kind_of(d) for d in docs if kind_of(d) in NEEDS_CRD | NEWER_THAN_TESTBED]
    kept = [d for d in docs if kind_of(d) not in NEEDS_CRD | NEWER_THAN_TESTBED]
    text = yaml.safe_dump_all(kept)
    tb.kubectl("apply", "--server-side", "--field-manager=helm-test", "-f", "-", input=text, timeout=180)
    return skipped


def delete(tb: TestBed, docs: list[dict[str, Any]]) -> None:
    kept = [d for d in docs if kind_of(d) not in NEEDS_CRD | NEWER_THAN_TESTBED]
    tb.kubectl(
        "delete", "--ignore-not-found", "--wait=false", "-f", "-", input=yaml.safe_dump_all(kept), check=False
    )
