"""Helpers for the chart tests: values and schema, the static parts of templates, a PSS checker.

No Helm binary exists here, and a home-made Go-template renderer would prove nothing about Helm. So
the chart is tested in the ways that need no rendering:

- values files are validated against values.schema.json (what Helm enforces);
- the RBAC templates are static YAML apart from a fixed set of name expressions
  (:data:`RBAC_NAMES`), which are replaced textually; anything else templated in them fails;
- other templates are read as a *skeleton*: lines that are only template directives are dropped and
  inline expressions become a placeholder. Both branches of an if/else stay in, which is what a
  check of "no branch may do X" wants; the security-relevant fields are literal in the templates.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "trtforge"
TEMPLATES = CHART / "templates"

# What the name helpers give for `helm install trtforge charts/trtforge -n trtforge-system` with the
# default values (fullname = release name, build namespace = release namespace).
RELEASE_NAMESPACE = "trtforge-system"
FULLNAME = "trtforge"
RBAC_NAMES: dict[str, str] = {
    '{{ include "trtforge.fullname" . }}': FULLNAME,
    '{{ include "trtforge.serviceAccountName" . }}': FULLNAME,
    '{{ include "trtforge.buildNamespace" . }}': RELEASE_NAMESPACE,
    '{{ include "trtforge.pvcClaimName" . }}': f"{FULLNAME}-engines",
    "{{ .Release.Namespace }}": RELEASE_NAMESPACE,
    "{{ .Values.operator.leaderElection.leaseName | quote }}": '"trtforge-operator"',
    '{{- include "trtforge.labels" . | nindent 4 }}': "app.kubernetes.io/part-of: trtforge",
    '{{ include "trtforge.brokerName" . }}': f"{FULLNAME}-broker",
    '{{- include "trtforge.brokerLabels" . | nindent 4 }}': "app.kubernetes.io/component: broker",
}
# Whole-file wrappers a static template may have: `{{- if .Values.x }}` first, `{{- end }}` last.
_WRAPPER_IF = re.compile(r"^\{\{-? if \.Values\.[A-Za-z0-9_.]+ -?\}\}$")
_DIRECTIVE_LINE = re.compile(r"^\s*\{\{-?.*-?\}\}\s*$")
_INLINE = re.compile(r"\{\{-?.*?-?\}\}")
PLACEHOLDER = "TEMPLATED"


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of a values file over the chart's values.yaml (maps merge, the rest replaces)."""
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def default_values() -> dict[str, Any]:
    data = yaml.safe_load((CHART / "values.yaml").read_text())
    assert isinstance(data, dict)
    return data


def values_with(*overrides: dict[str, Any]) -> dict[str, Any]:
    values = default_values()
    for o in overrides:
        values = deep_merge(values, o)
    return values


def schema() -> dict[str, Any]:
    data = json.loads((CHART / "values.schema.json").read_text())
    assert isinstance(data, dict)
    return data


def substitute_static(text: str, names: dict[str, str] | None = None) -> str:
    """A static template with its name expressions replaced; fails on any other template syntax."""
    names = RBAC_NAMES if names is None else names
    lines = text.splitlines()
    body = [ln for ln in lines if ln.strip()]
    if body and _WRAPPER_IF.match(body[0].strip()):
        assert body[-1].strip() in ("{{- end }}", "{{ end }}"), "a wrapped template must end with {{- end }}"
        lines = [ln for ln in lines if ln not in (body[0], body[-1])]
    out = "\n".join(lines)
    for expr, value in names.items():
        out = out.replace(expr, value)
    leftover = re.findall(r"\{\{.*?\}\}", out)
    assert not leftover, f"template syntax left in a template that should be static: {leftover}"
    return out


def skeleton(text: str) -> list[dict[str, Any]]:
    """The static parts of a template as YAML documents (see the module docstring)."""
    kept = []
    for ln in text.splitlines():
        if _DIRECTIVE_LINE.match(ln):
            continue
        if ln.lstrip().startswith("#"):
            continue
        kept.append(_INLINE.sub(PLACEHOLDER, ln))
    docs = [d for d in yaml.safe_load_all("\n".join(kept)) if d is not None]
    assert all(isinstance(d, dict) for d in docs)
    return docs


# --- Pod Security Standards, "restricted" profile (https://kubernetes.io/docs/concepts/security/pod-security-standards)

RESTRICTED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
ALLOWED_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def pss_restricted_violations(
    pod_spec: dict[str, Any], annotations: dict[str, str] | None = None, *, where: str = "pod"
) -> list[str]:
    """Every way `pod_spec` breaks the PSS restricted profile (baseline included); empty when it passes."""
    v: list[str] = []
    psc = pod_spec.get("securityContext") or {}
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(host):
            v.append(f"{where}: {host} is true")
    for vol in pod_spec.get("volumes") or []:
        types = set(vol) - {"name"}
        if not types <= RESTRICTED_VOLUME_TYPES:
            bad = sorted(types - RESTRICTED_VOLUME_TYPES)
            v.append(f"{where}: volume {vol.get('name')!r} has type {bad}")
    for s in psc.get("sysctls") or []:
        if s.get("name") not in SAFE_SYSCTLS:
            v.append(f"{where}: unsafe sysctl {s.get('name')!r}")
    for k, val in (annotations or {}).items():
        if k.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
            val == "runtime/default" or val.startswith("localhost/")
        ):
            v.append(f"{where}: AppArmor annotation {k}={val}")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    pod_nonroot = psc.get("runAsNonRoot")
    if psc.get("runAsUser") == 0:
        v.append(f"{where}: securityContext.runAsUser is 0")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        v.append(f"{where}: seccompProfile {pod_seccomp}")
    v += _selinux_apparmor(psc, where)
    containers = [
        (kind, c)
        for kind in ("initContainers", "containers", "ephemeralContainers")
        for c in pod_spec.get(kind) or []
    ]
    if not pod_spec.get("containers"):
        v.append(f"{where}: no containers")
    for kind, c in containers:
        cw = f"{where}: {kind}[{c.get('name')}]"
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            v.append(f"{cw}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            v.append(f"{cw}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            v.append(f"{cw}: capabilities.drop does not contain ALL")
        extra = set(caps.get("add") or []) - {"NET_BIND_SERVICE"}
        if extra:
            v.append(f"{cw}: capabilities.add {sorted(extra)}")
        nonroot = sc.get("runAsNonRoot", pod_nonroot)
        if nonroot is not True:
            v.append(f"{cw}: runAsNonRoot is not true (pod or container)")
        if sc.get("runAsUser") == 0:
            v.append(f"{cw}: runAsUser is 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            v.append(f"{cw}: seccompProfile is {seccomp!r}, not RuntimeDefault or Localhost")
        if sc.get("procMount") not in (None, "Default"):
            v.append(f"{cw}: procMount {sc.get('procMount')}")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            v.append(f"{cw}: windowsOptions.hostProcess")
        v += _selinux_apparmor(sc, cw)
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                v.append(f"{cw}: hostPort {p['hostPort']}")
    return v


def _selinux_apparmor(sc: dict[str, Any], where: str) -> list[str]:
    v = []
    se = sc.get("seLinuxOptions") or {}
    if se.get("type", "") not in ALLOWED_SELINUX_TYPES or se.get("user") or se.get("role"):
        v.append(f"{where}: seLinuxOptions {se}")
    aa = (sc.get("appArmorProfile") or {}).get("type")
    if aa not in (None, "RuntimeDefault", "Localhost"):
        v.append(f"{where}: appArmorProfile {aa}")
    return v
