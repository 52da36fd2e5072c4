"""Label, annotation and finalizer names the operator puts on what it owns (one place, so all agree)."""

from __future__ import annotations

import hashlib

GROUP = "trtforge.io"
VERSION = "v1alpha1"
TRTENGINES = "trtengines"
INFERENCEDEPLOYMENTS = "inferencedeployments"

FINALIZER = "trtforge.io/finalizer"

# Well-known labels on every child.
APP_NAME = "app.kubernetes.io/name"
APP_COMPONENT = "app.kubernetes.io/component"
APP_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "trtforge-operator"
COMPONENT_BUILDER = "builder"
COMPONENT_RUNTIME = "runtime"
COMPONENT_VERIFIER = "verifier"  # verify Jobs in tenant namespaces (proof of possession)

# Build Jobs (build namespace, shared by every requester: no ownerRefs across namespaces).
L_BUILD_ID = "trtforge.io/build-id"  # key[:20] (pinned model) or request digest[:20]
L_BUILD_KIND = "trtforge.io/build-kind"  # build | rebuild
L_TARGET = "trtforge.io/target"  # GPUTarget.name
L_REQ_NAMESPACE = "trtforge.io/requester-namespace"  # first requester, for per-namespace limits
A_ENGINE_KEY = "trtforge.io/engine-key"  # the engine a fault rebuild replaces ("" for first builds)
A_REQUEST_DIGEST = "trtforge.io/request-digest"  # the request key (docs/design.md, Engine keys)
# One annotation per requester ("namespace/name"), so requesters add and remove themselves with
# merge patches that never overwrite each other (a shared JSON list would be a read-modify-write race).
REQUESTER_PREFIX = "requester.trtforge.io/"
A_CREATED_FOR = "trtforge.io/created-for"  # the requester whose reconcile created the Job
A_TARGET = "trtforge.io/target"  # JSON {gpu, mig}
A_ATTEMPT = "trtforge.io/attempt"
A_RESULT = "trtforge.io/result"  # the builder's result JSON, copied from the pod when it ends
L_SOURCE = "trtforge.io/model-source"  # verify Jobs: source fingerprint[:20]
A_SOURCE_FINGERPRINT = "trtforge.io/model-source-fingerprint"  # verify Jobs: the full fingerprint
A_FAULT = "trtforge.io/fault"  # rebuild Jobs: the fault that asked for them

# Runtime Deployments, their pods and the Service (tenant namespace, owned by the InferenceDeployment).
L_INFD = "trtforge.io/inferencedeployment"
A_TEMPLATE_ENGINE_KEY = "trtforge.io/engine-key"
A_TEMPLATE_ENGINE_SHA = "trtforge.io/engine-sha256"
A_AVOID_NODES = "trtforge.io/avoid-nodes"

BASE_LABELS = {APP_NAME: "trtforge", APP_MANAGED_BY: MANAGED_BY}
A_SPEC_HASH = "trtforge.io/spec-hash"  # hash of the spec the operator last wrote (update only on change)


def requester_annotation(requester: str) -> str:
    """The annotation key under which a build Job records one requester (`namespace/name`)."""
    return REQUESTER_PREFIX + hashlib.sha256(requester.encode()).hexdigest()[:16]
