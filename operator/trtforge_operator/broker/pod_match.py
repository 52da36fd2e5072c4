"""Is an uploading pod the verify pod the operator rendered, and is its Job still running? Pure.

The broker takes model bytes only from a pod that runs what the operator gave its verify Job
(docs/security.md): the one container's image, command, args, working directory, env, envFrom and
volumeMounts, and the pod's volumes, compared field by field with the operator's rendering that the
:class:`~trtforge.contract.possession.VerifyGrant` carries. The apiserver adds defaults to a pod
(``defaultMode: 420``, canonical quantities, empty fields), so both sides are normalized first; every
field the operator did not render must be absent or default. A pod of a Job that has finished, in any
way, uploads nothing: the grant ends with its Job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trtforge.contract.possession import VerifyGrant
from trtforge_operator.pod_spec import normalized as _norm


def _by_name(items: Sequence[Mapping[str, Any]] | None) -> list[Any]:
    return [_norm(i) for i in items or []]


def pod_spec_mismatch(grant: VerifyGrant, pod: Mapping[str, Any]) -> str | None:
    """What of `pod` (as the apiserver has it) differs from the verify pod the operator rendered for
    `grant`; None when nothing does."""
    spec = pod.get("spec") or {}
    if spec.get("initContainers") or spec.get("ephemeralContainers"):
        return "it has init or ephemeral containers"
    containers = spec.get("containers") or []
    if len(containers) != 1:
        return f"it has {len(containers)} containers, not the one the operator rendered"
    c = containers[0]
    rendered: dict[str, Any] = {
        "image": grant.image,
        "command": list(grant.command),
        "args": [],
        "workingDir": "",
        "env": grant.env,
        "envFrom": grant.env_from,
        "volumeMounts": grant.volume_mounts,
        "volumeDevices": [],
    }
    for name, want in rendered.items():
        if _norm({name: c.get(name)}) != _norm({name: want}):
            return f"its container's {name} is not what the operator rendered"
    if _by_name(spec.get("volumes")) != _by_name(grant.volumes):
        return "its volumes are not the ones the operator rendered"
    return None


def job_finished(job: Mapping[str, Any]) -> bool:
    """The Job has ended, succeeded or failed (a condition, or a pod that ended: verify Jobs never
    retry a pod, backoffLimit 0)."""
    st = job.get("status") or {}
    if st.get("succeeded") or st.get("failed"):
        return True
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in st.get("conditions") or []
    )


def job_denial(grant: VerifyGrant, job: Mapping[str, Any] | None) -> str | None:
    """Why the Job named in `grant` no longer lets its pod upload (None: it does)."""
    if job is None:
        return f"Job {grant.job} is gone"
    if ((job.get("metadata") or {}).get("uid") or "") != grant.job_uid:
        return f"Job {grant.job} is not the verify Job the operator created under that name"
    if job_finished(job):
        return f"Job {grant.job} has finished; its verification is over (the operator starts another)"
    return None
