"""The operator's own Kubernetes calls: create-if-absent, replace-on-hash, status patches, deletes, Events.

A thin async layer over the official client (run in threads). Every write is idempotent: creating what
exists (409) is success, deleting what is gone (404) is success, so a handler interrupted at any point
can simply run again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import json
import logging
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from trtforge.logs import fields
from trtforge_operator import pod_spec
from trtforge_operator.labels import ANNOTATION_SPEC_HASH, GROUP, TRTENGINES, VERSION

log = logging.getLogger(__name__)
LWS_GROUP, LWS_VERSION, LWS_PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
AUTOSCALER_PLURALS = {"HorizontalPodAutoscaler": "horizontalpodautoscalers", "ScaledObject": "scaledobjects"}


def load_kube_config() -> None:
    """In-cluster config when running in a pod, else $KUBECONFIG / ~/.kube/config."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


# Kubernetes calls in flight at once. The official client blocks, so each call holds a thread: on
# asyncio's default executor (cpu + 4 threads, shared with the planners) a few slow answers queued
# every reconcile behind them (docs/design.md §"Scale"). Our own pool, with as many connections.
API_THREADS = 16


class Kube:
    """Async wrappers around the generated API classes, each call on the client's own thread pool."""

    def __init__(self, api: client.ApiClient | None = None, threads: int = API_THREADS) -> None:
        if api is None:
            conf = client.Configuration.get_default_copy()
            conf.connection_pool_maxsize = max(conf.connection_pool_maxsize or 0, threads)
            api = client.ApiClient(conf)
        self.api = api
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="kube-api")
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.auth = client.AuthenticationV1Api(self.api)

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, functools.partial(fn, *args, **kwargs)
        )

    async def _call_unparsed(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        """`fn` without parsing its answer into the client's models. The body is still read (and
        dropped): an unread answer keeps its connection out of the pool, so every such call opened
        a new TLS connection to the apiserver (docs/design.md §"Scale")."""

        def call() -> None:
            fn(*args, _preload_content=False, **kwargs).data  # noqa: B018 (read to free the connection)

        await asyncio.get_running_loop().run_in_executor(self._pool, call)

    async def create(self, obj: Mapping[str, Any]) -> bool:
        """Create `obj` (Job, Deployment, Service); False when it already exists (409).

        The answer's body is not parsed: no caller reads it, and turning a Job back into the client's
        models and then into a dict cost more operator CPU than the POST itself (docs/design.md
        §"Scale")."""
        kind, ns = obj["kind"], obj["metadata"]["namespace"]
        fn = {
            "Job": self.batch.create_namespaced_job,
            "Deployment": self.apps.create_namespaced_deployment,
            "Service": self.core.create_namespaced_service,
        }[kind]
        try:
            await self._call_unparsed(fn, ns, dict(obj))
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        log.info(
            "created %s %s/%s",
            kind,
            ns,
            obj["metadata"]["name"],
            extra=fields(kind=kind, namespace=ns, name=obj["metadata"]["name"]),
        )
        return True

    async def create_job_uid(self, obj: Mapping[str, Any]) -> str | None:
        """Create the Job `obj`; the uid the apiserver gave it, None when it already exists (409).
        Only the answer's metadata is read (see `create`)."""
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]

        def call() -> str:
            create: Any = self.batch.create_namespaced_job  # typed for models; this answer is raw
            raw = create(ns, dict(obj), _preload_content=False).data
            return str((json.loads(raw).get("metadata") or {}).get("uid") or "")

        try:
            uid = await asyncio.get_running_loop().run_in_executor(self._pool, call)
        except ApiException as e:
            if e.status == 409:
                return None
            raise
        log.info("created Job %s/%s", ns, name, extra=fields(kind="Job", namespace=ns, name=name, uid=uid))
        return uid

    async def _read_raw(self, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """A read call's answer as plain JSON, unparsed by the client's models; None on 404."""

        def call() -> dict[str, Any]:
            out: dict[str, Any] = json.loads(fn(*args, _preload_content=False, **kwargs).data)
            return out

        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, call)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    async def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A PersistentVolumeClaim as plain JSON; None when there is none (404)."""
        return await self._read_raw(self.core.read_namespaced_persistent_volume_claim, name, namespace)

    async def claim_events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The Events about PersistentVolumeClaim `namespace/name` (the provisioner's, the binder's)."""
        selector = f"involvedObject.kind=PersistentVolumeClaim,involvedObject.name={name}"
        listed = await self._read_raw(self.core.list_namespaced_event, namespace, field_selector=selector)
        return list((listed or {}).get("items") or [])

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A pod as plain JSON; None when it is gone (404)."""
        return await self._read_raw(self.core.read_namespaced_pod, name, namespace)

    async def replica_set_owners(self, namespace: str, label_selector: str) -> dict[str, tuple[str, str]]:
        """ReplicaSet uid -> (the uid of its controlling Deployment, "" without one; the fingerprint
        of its pod template, pod_spec.fingerprint) of the ReplicaSets matching `label_selector`."""
        rs = await self._call(self.apps.list_namespaced_replica_set, namespace, label_selector=label_selector)
        out: dict[str, tuple[str, str]] = {}
        for r in rs.items or []:
            owners = [o for o in (r.metadata.owner_references or []) if o.controller]
            dep = str(owners[0].uid) if owners and owners[0].kind == "Deployment" else ""
            template = self.api.sanitize_for_serialization(r.spec.template.spec) if r.spec.template else {}
            out[str(r.metadata.uid)] = (dep, pod_spec.fingerprint(template or {}))
        return out

    async def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A Job as plain JSON; None when it is gone (404)."""
        return await self._read_raw(self.batch.read_namespaced_job, name, namespace)

    async def job_annotations(self, namespace: str, name: str) -> dict[str, str] | None:
        """A Job's annotations; None when the Job is gone (404)."""
        try:
            j = await self._call(self.batch.read_namespaced_job, name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return dict((j.metadata.annotations if j.metadata else None) or {})

    async def apply_owned(self, obj: Mapping[str, Any], *, keep_replicas: bool = False) -> str:
        """Create, or replace when its spec hash annotation differs. Returns created|replaced|unchanged.

        ``keep_replicas`` (a Deployment whose replicas an HPA sets): a replace writes the replicas the
        Deployment has in the read it replaces (its resourceVersion guards the write: a count the HPA
        sets in between makes the replace fail with 409, and the next pass reads it)."""
        kind, ns, name = obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]
        if await self.create(obj):
            return "created"
        read = {
            "Deployment": self.apps.read_namespaced_deployment,
            "Service": self.core.read_namespaced_service,
        }[kind]
        cur = self.api.sanitize_for_serialization(await self._call(read, name, ns))
        if (cur["metadata"].get("annotations") or {}).get(ANNOTATION_SPEC_HASH) == obj["metadata"][
            "annotations"
        ].get(ANNOTATION_SPEC_HASH):
            return "unchanged"
        new = dict(obj)
        meta = dict(obj["metadata"])
        meta["resourceVersion"] = cur["metadata"]["resourceVersion"]
        new["metadata"] = meta
        if kind == "Service":  # clusterIP is immutable and allocated by the apiserver
            spec = dict(new["spec"])
            for k in ("clusterIP", "clusterIPs"):
                if k in cur["spec"]:
                    spec[k] = cur["spec"][k]
            new["spec"] = spec
            await self._call(self.core.replace_namespaced_service, name, ns, new)
        else:
            if keep_replicas and cur["spec"].get("replicas") is not None:
                new["spec"] = {**new["spec"], "replicas": cur["spec"]["replicas"]}
            await self._call(self.apps.replace_namespaced_deployment, name, ns, new)
        log.info("updated %s %s/%s", kind, ns, name, extra=fields(kind=kind, namespace=ns, name=name))
        return "replaced"

    async def apply_config_map(self, obj: Mapping[str, Any]) -> str:
        """Create a ConfigMap, or replace it when its data differs. Returns created|replaced|unchanged."""
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        try:
            cur = self.api.sanitize_for_serialization(
                await self._call(self.core.read_namespaced_config_map, name, ns)
            )
        except ApiException as e:
            if e.status != 404:
                raise
            await self._call_unparsed(self.core.create_namespaced_config_map, ns, dict(obj))
            log.info(
                "created ConfigMap %s/%s", ns, name, extra=fields(kind="ConfigMap", namespace=ns, name=name)
            )
            return "created"
        if cur.get("data") == obj.get("data"):
            return "unchanged"
        new = {**obj, "metadata": {**obj["metadata"], "resourceVersion": cur["metadata"]["resourceVersion"]}}
        await self._call(self.core.replace_namespaced_config_map, name, ns, new)
        log.info("updated ConfigMap %s/%s", ns, name, extra=fields(kind="ConfigMap", namespace=ns, name=name))
        return "replaced"

    async def served_versions(self, group: str) -> list[str]:
        """The ``group/version`` strings the apiserver serves for an API group (discovery)."""
        groups = await self._call(client.ApisApi(self.api).get_api_versions)
        for g in groups.groups or []:
            if g.name == group:
                return [v.group_version for v in g.versions or []]
        return []

    async def served_resources(self, group_version: str) -> list[str]:
        """The resources (plural names) the apiserver serves in ``group/version``; [] when it serves
        no such group version (404)."""
        group, version = group_version.split("/", 1)
        try:
            res = await self._call(self.custom.get_api_resources, group, version)
        except ApiException as e:
            if e.status == 404:
                return []
            raise
        return [r.name for r in res.resources or []]

    async def apply_autoscaler(self, obj: Mapping[str, Any]) -> str:
        """Create an HPA (in the apiVersion it names) or a KEDA ScaledObject, or replace it when its
        spec hash differs."""
        group, version = obj["apiVersion"].split("/", 1)
        kind, ns, name = obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]
        plural = AUTOSCALER_PLURALS[kind]
        what = fields(kind=kind, namespace=ns, name=name)
        try:
            await self._call_unparsed(
                self.custom.create_namespaced_custom_object, group, version, ns, plural, dict(obj)
            )
            log.info("created %s %s/%s", kind, ns, name, extra=what)
            return "created"
        except ApiException as e:
            if e.status != 409:
                raise
        cur = await self._call(self.custom.get_namespaced_custom_object, group, version, ns, plural, name)
        want = obj["metadata"]["annotations"].get(ANNOTATION_SPEC_HASH)
        if (cur["metadata"].get("annotations") or {}).get(ANNOTATION_SPEC_HASH) == want:
            return "unchanged"
        new = {**obj, "metadata": {**obj["metadata"], "resourceVersion": cur["metadata"]["resourceVersion"]}}
        await self._call(self.custom.replace_namespaced_custom_object, group, version, ns, plural, name, new)
        log.info("updated %s %s/%s", kind, ns, name, extra=what)
        return "replaced"

    async def scaled_objects(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The KEDA ScaledObjects in `namespace` that match `label_selector`, read from the apiserver
        (call only where discovery serves keda.sh/v1alpha1). Read here rather than through a kopf
        watch: kopf looks for a CRD's resources once per CRD event, and the apiserver may serve them
        only after the last event, so a watch could stay unstarted (docs/design.md §"Autoscaling")."""
        res = await self._call(
            self.custom.list_namespaced_custom_object,
            "keda.sh",
            "v1alpha1",
            namespace,
            AUTOSCALER_PLURALS["ScaledObject"],
            label_selector=label_selector,
        )
        return list(res.get("items") or [])

    async def leader_worker_sets(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The LeaderWorkerSets in `namespace` that match `label_selector` (call only where discovery
        serves leaderworkerset.x-k8s.io/v1)."""
        res = await self._call(
            self.custom.list_namespaced_custom_object,
            LWS_GROUP,
            LWS_VERSION,
            namespace,
            LWS_PLURAL,
            label_selector=label_selector,
        )
        return list(res.get("items") or [])

    async def apply_leader_worker_set(
        self, obj: Mapping[str, Any], needs_update: Callable[[Mapping[str, Any], Mapping[str, Any]], bool]
    ) -> str:
        """Create a LeaderWorkerSet, or replace it on the live resourceVersion when `needs_update`
        (the expected object, the live one) says a field we set differs."""
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        what = fields(kind="LeaderWorkerSet", namespace=ns, name=name)
        try:
            await self._call_unparsed(
                self.custom.create_namespaced_custom_object, LWS_GROUP, LWS_VERSION, ns, LWS_PLURAL, dict(obj)
            )
            log.info("created LeaderWorkerSet %s/%s", ns, name, extra=what)
            return "created"
        except ApiException as e:
            if e.status != 409:
                raise
        cur = await self._call(
            self.custom.get_namespaced_custom_object, LWS_GROUP, LWS_VERSION, ns, LWS_PLURAL, name
        )
        if not needs_update(obj, cur):
            return "unchanged"
        new = {**obj, "metadata": {**obj["metadata"], "resourceVersion": cur["metadata"]["resourceVersion"]}}
        await self._call(
            self.custom.replace_namespaced_custom_object, LWS_GROUP, LWS_VERSION, ns, LWS_PLURAL, name, new
        )
        log.info("updated LeaderWorkerSet %s/%s", ns, name, extra=what)
        return "replaced"

    async def create_pod(self, obj: Mapping[str, Any]) -> bool:
        """Create a pod; False when one of its name exists (409): create-if-absent."""
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        try:
            await self._call_unparsed(self.core.create_namespaced_pod, ns, dict(obj))
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        log.info("created Pod %s/%s", ns, name, extra=fields(kind="Pod", namespace=ns, name=name))
        return True

    async def label_pod(self, namespace: str, name: str, labels: Mapping[str, str | None]) -> None:
        """Merge-patch a pod's labels (None removes one); gone already is fine."""
        try:
            await self._call_unparsed(
                self.core.patch_namespaced_pod, name, namespace, {"metadata": {"labels": dict(labels)}}
            )
        except ApiException as e:
            if e.status != 404:
                raise

    async def apply_network_policy(self, obj: Mapping[str, Any]) -> str:
        """Create a NetworkPolicy, or replace it when its spec hash annotation differs."""
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        net = client.NetworkingV1Api(self.api)
        try:
            await self._call_unparsed(net.create_namespaced_network_policy, ns, dict(obj))
            log.info(
                "created NetworkPolicy %s/%s",
                ns,
                name,
                extra=fields(kind="NetworkPolicy", namespace=ns, name=name),
            )
            return "created"
        except ApiException as e:
            if e.status != 409:
                raise
        cur = self.api.sanitize_for_serialization(
            await self._call(net.read_namespaced_network_policy, name, ns)
        )
        want = obj["metadata"]["annotations"].get(ANNOTATION_SPEC_HASH)
        if (cur["metadata"].get("annotations") or {}).get(ANNOTATION_SPEC_HASH) == want:
            return "unchanged"
        new = {**obj, "metadata": {**obj["metadata"], "resourceVersion": cur["metadata"]["resourceVersion"]}}
        await self._call(net.replace_namespaced_network_policy, name, ns, new)
        return "replaced"

    async def apply_rank_exec_access(self, obj: Mapping[str, Any]) -> str:
        """Create a group leader's ServiceAccount, Role or RoleBinding, or replace it when its spec
        hash annotation differs (a RoleBinding's roleRef never changes: one name for the three)."""
        kind, ns, name = obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]
        rbac = client.RbacAuthorizationV1Api(self.api)
        create, read, replace = {
            "ServiceAccount": (
                self.core.create_namespaced_service_account,
                self.core.read_namespaced_service_account,
                self.core.replace_namespaced_service_account,
            ),
            "Role": (rbac.create_namespaced_role, rbac.read_namespaced_role, rbac.replace_namespaced_role),
            "RoleBinding": (
                rbac.create_namespaced_role_binding,
                rbac.read_namespaced_role_binding,
                rbac.replace_namespaced_role_binding,
            ),
        }[kind]
        try:
            await self._call_unparsed(create, ns, dict(obj))
            log.info("created %s %s/%s", kind, ns, name, extra=fields(kind=kind, namespace=ns, name=name))
            return "created"
        except ApiException as e:
            if e.status != 409:
                raise
        cur = self.api.sanitize_for_serialization(await self._call(read, name, ns))
        want = obj["metadata"]["annotations"].get(ANNOTATION_SPEC_HASH)
        if (cur["metadata"].get("annotations") or {}).get(ANNOTATION_SPEC_HASH) == want:
            return "unchanged"
        new = {**obj, "metadata": {**obj["metadata"], "resourceVersion": cur["metadata"]["resourceVersion"]}}
        await self._call(replace, name, ns, new)
        return "replaced"

    async def delete_autoscaler(
        self, namespace: str, name: str, kind: str = "HorizontalPodAutoscaler"
    ) -> bool:
        """Delete an HPA (through autoscaling/v1, served everywhere) or a KEDA ScaledObject; False
        when it is gone (or, for a ScaledObject, when KEDA's API is not served: nothing to delete)."""
        try:
            if kind == "ScaledObject":
                await self._call_unparsed(
                    self.custom.delete_namespaced_custom_object,
                    "keda.sh",
                    "v1alpha1",
                    namespace,
                    AUTOSCALER_PLURALS[kind],
                    name,
                    propagation_policy="Background",
                )
            else:
                await self._call_unparsed(
                    client.AutoscalingV1Api(self.api).delete_namespaced_horizontal_pod_autoscaler,
                    name,
                    namespace,
                )
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        log.info(
            "deleted %s %s/%s",
            kind,
            namespace,
            name,
            extra=fields(kind=kind, namespace=namespace, name=name),
        )
        return True

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        fn = {
            "Job": self.batch.delete_namespaced_job,
            "Deployment": self.apps.delete_namespaced_deployment,
            "Service": self.core.delete_namespaced_service,
            "Pod": self.core.delete_namespaced_pod,
            "ConfigMap": self.core.delete_namespaced_config_map,
            "NetworkPolicy": client.NetworkingV1Api(self.api).delete_namespaced_network_policy,
            "ServiceAccount": self.core.delete_namespaced_service_account,
            "Role": client.RbacAuthorizationV1Api(self.api).delete_namespaced_role,
            "RoleBinding": client.RbacAuthorizationV1Api(self.api).delete_namespaced_role_binding,
        }[kind]
        try:
            await self._call_unparsed(fn, name, namespace, propagation_policy="Background")
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        log.info(
            "deleted %s %s/%s", kind, namespace, name, extra=fields(kind=kind, namespace=namespace, name=name)
        )
        return True

    async def annotate(
        self, kind: str, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> None:
        body = {"metadata": {"annotations": dict(annotations)}}
        try:
            if kind == "TRTEngine":
                await self._call(
                    self.custom.patch_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    namespace,
                    TRTENGINES,
                    name,
                    body,
                )
            else:
                fn = {"Job": self.batch.patch_namespaced_job}[kind]
                await self._call(fn, name, namespace, body)
        except ApiException as e:
            if e.status != 404:
                raise

    async def patch_status(self, plural: str, namespace: str, name: str, patch: Mapping[str, Any]) -> Any:
        return await self._call(
            self.custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            plural,
            name,
            {"status": dict(patch)},
        )

    async def list_custom(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        if namespace:
            res = await self._call(
                self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, plural
            )
        else:
            res = await self._call(self.custom.list_cluster_custom_object, GROUP, VERSION, plural)
        return list(res.get("items") or [])

    async def token_review(self, token: str, audience: str) -> dict[str, Any]:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [audience]},
        }
        res = await self._call(self.auth.create_token_review, body)
        out: dict[str, Any] = self.api.sanitize_for_serialization(res).get("status") or {}
        return out

    async def event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about `obj` (what `kubectl describe` shows). Never raises."""
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace") or "default"
        now = dt.datetime.now(dt.UTC)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta.get('name', 'x')}.{uuid.uuid4().hex[:12]}", "namespace": ns},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta.get("name"),
                "namespace": ns,
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "trtforge-operator"},
            "reportingComponent": "trtforge-operator",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            # The answer is not read: parsing it into the client's models cost more than the POST.
            await self._call_unparsed(self.core.create_namespaced_event, ns, body)
        except ApiException as e:
            log.warning("could not post event %s on %s/%s: %s", reason, ns, meta.get("name"), e.reason)


def clean_status(status: Mapping[str, Any]) -> dict[str, Any]:
    """Drop empty condition messages: a 1.20 apiserver turns "" into null in a merge patch and refuses it."""
    out = dict(status)
    if isinstance(out.get("conditions"), list):
        out["conditions"] = [
            {k: v for k, v in c.items() if not (k == "message" and v == "")} for c in out["conditions"]
        ]
    return out


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any] | None:
    """A merge patch turning status `old` into `new` (None when equal): removed keys become null."""
    old, new = clean_status(old), clean_status(new)
    if old == new:
        return None
    patch: dict[str, Any] = dict(new)
    for k in old:
        if k not in new:
            patch[k] = None
    return patch
