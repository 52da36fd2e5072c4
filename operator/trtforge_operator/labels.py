"""Label, annotation and finalizer names the operator puts on what it owns (one place, so all agree)."""

from __future__ import annotations

import hashlib

from trtforge_operator.api.common import GROUP, VERSION

__all__ = ["GROUP", "VERSION"]  # re-exported: the API group is defined once, in api.common

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
LABEL_BUILD_ID = "trtforge.io/build-id"  # key[:20] (pinned model) or request digest[:20]
LABEL_BUILD_KIND = "trtforge.io/build-kind"  # build | rebuild
LABEL_TARGET = "trtforge.io/target"  # GPUTarget.name
LABEL_REQUESTER_NAMESPACE = "trtforge.io/requester-namespace"  # first requester (selection only)
# The engine key: on a fault rebuild Job, the engine it replaces ("" for first builds); on a runtime
# pod template, the engine the pods serve.
ANNOTATION_ENGINE_KEY = "trtforge.io/engine-key"
ANNOTATION_REQUEST_DIGEST = "trtforge.io/request-digest"  # the request key (docs/design.md, Engine keys)
# One annotation per requester ("namespace/name"), so requesters add and remove themselves with
# merge patches that never overwrite each other (a shared JSON list would be a read-modify-write race).
REQUESTER_PREFIX = "requester.trtforge.io/"
ANNOTATION_CREATED_FOR = "trtforge.io/created-for"  # the requester whose reconcile created the Job
ANNOTATION_TARGET = "trtforge.io/target"  # JSON {gpu, mig}
ANNOTATION_ATTEMPT = "trtforge.io/attempt"
ANNOTATION_RESULT = "trtforge.io/result"  # the builder's result JSON, copied from the pod when it ends
LABEL_MODEL_SOURCE = "trtforge.io/model-source"  # verify Jobs: source fingerprint[:20]
ANNOTATION_RECHECK_ROUND = "trtforge.io/recheck-round"  # verify Jobs re-reading a model: which round
ANNOTATION_SOURCE_FINGERPRINT = "trtforge.io/model-source-fingerprint"  # verify Jobs: the full fingerprint
ANNOTATION_FAULT = "trtforge.io/fault"  # rebuild Jobs: the fault that asked for them
# rebuild Jobs: "fault" (the operator saw a GPU fault) or "asked" (the TRTEngine's annotation asked)
ANNOTATION_REBUILD_CAUSE = "trtforge.io/rebuild-cause"

# Runtime Deployments, their pods and the Service (tenant namespace, owned by the InferenceDeployment).
LABEL_INFERENCEDEPLOYMENT = "trtforge.io/inferencedeployment"
ANNOTATION_ENGINE_SHA256 = "trtforge.io/engine-sha256"
ANNOTATION_AVOID_NODES = "trtforge.io/avoid-nodes"

BASE_LABELS = {APP_NAME: "trtforge", APP_MANAGED_BY: MANAGED_BY}
# Hash of the spec the operator last wrote on a child (it updates the child only when this changes).
ANNOTATION_SPEC_HASH = "trtforge.io/spec-hash"


def requester_annotation(requester: str) -> str:
    """The annotation key under which a build Job records one requester (`namespace/name`)."""
    return REQUESTER_PREFIX + hashlib.sha256(requester.encode()).hexdigest()[:16]
