"""The engine broker: serves stored engines to runtime pods, so tenants never hold store credentials,
and takes the model bytes of verify steps (proof of possession, docs/security.md).

URL scheme (the read-only client is :mod:`trtforge.store.http`)::

    GET  /engines/<key>/<file>   the bytes (X-Trtforge-Sha256 for the engine file)
    HEAD /engines/<key>/<file>   200 when it exists
    GET  /engines/<key>/         {"files": [...]}
    GET  /checkpoints/<key>/manifest.json, /tuning/<key>/manifest.json
                                 an LLM artefact's manifest (docs/llm.md §"Artefacts")
    GET  /checkpoints/<key>/<upload>/<path>, /tuning/<key>/<upload>/<path>
                                 one file the manifest lists, streamed (X-Trtforge-Sha256: its sha256)
    HEAD the same                200 when it exists
    PUT  /models/<sha256>        a verify step's model bytes (no header but the token and the
                                 length counts: the source is the operator's grant)
    GET|HEAD|PUT|DELETE /store/<path>, GET /store/?prefix=
                                 the whole store, for the operator's ServiceAccount only
                                 (broker/operator_store.py)

A request carries ``Authorization: Bearer <projected service-account token>`` (audience from the
config). The broker asks the apiserver (TokenReview) who it is: ``system:serviceaccount:<ns>:<sa>``,
with the pod name in the token's extra info.

- An engine file is served to ``<ns>`` only when (1) an InferenceDeployment in ``<ns>`` references a
  TRTEngine (same namespace) whose status lists that engine key, and (2) ``<ns>`` proved it holds
  that engine's model (``Manifest.model_sha256``) through the model source that TRTEngine names now:
  a possession record ``possession/<ns>/<source fingerprint>.json`` of that digest. 401 without a
  valid token, 403 when (1) or (2) fails, 404 when the store has no such file.
- An LLM artefact (a checkpoint or a tuning cache) is served under the same two rules: (1) an
  InferenceDeployment in ``<ns>`` references a TRTEngine whose status names that key
  (``status.checkpoint.checkpointKey``, ``status.targets[].tuningKey``), and (2) ``<ns>`` proved it
  holds the source the checkpoint was quantized from (``CheckpointInfo.source.digest``; for a tuning
  cache, that of the checkpoint its record names) through the ``spec.llm.source`` that TRTEngine
  names now. Only the manifest and the files it lists, in the upload it names, are served.
- A ``PUT /models/<sha256>`` is taken only from a pod of a verify Job the operator created for a
  pending verification: the token's pod (TokenReview: name and uid) must exist, its controller must
  be a Job whose uid the operator recorded in a :class:`VerifyGrant` (``verify-grants/<ns>/<job>``,
  written by the operator, never by a tenant), and its one container must run the image and
  arguments the operator gave that Job. Labels, annotations and headers count for nothing. The digest
  must be the pin, if the source has one; the size at most the grant's ``max_bytes``, refused before
  any byte is spooled when the request says its length. Anything else: 403 (413 for the size), and
  nothing is written. The body is hashed while it is spooled to local disk; only bytes whose sha256
  is the one named are kept: once per digest in the staging area ``models/<sha256>/model.onnx``
  (what build Jobs read), and a possession record for the grant's namespace and source (the source
  the operator's Job read, never one the uploader names). The grant is then used up. 422 when the
  bytes do not match.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import urllib3
from aiohttp import web
from kubernetes.client.rest import ApiException

from trtforge.contract.layout import KEY_RE, engine_path, manifest_path
from trtforge.contract.llm.artefact import (
    KIND_DIRS,
    ArtefactKind,
    ArtefactManifest,
    file_path,
)
from trtforge.contract.llm.artefact import manifest_path as artefact_manifest_path
from trtforge.contract.manifest import Manifest
from trtforge.contract.possession import (
    SHA256_RE,
    PossessionRecord,
    VerifyGrant,
    possession_path,
    source_fingerprint,
    staged_model_path,
    verify_grant_path,
)
from trtforge.logs import fields
from trtforge.store import ObjectNotFound, StoreError
from trtforge_operator.broker.formats import FormatError, checker
from trtforge_operator.broker.operator_store import add_operator_store_routes
from trtforge_operator.broker.pod_match import job_denial, pod_spec_mismatch
from trtforge_operator.config import OperatorConfig
from trtforge_operator.kube import Kube
from trtforge_operator.labels import INFERENCEDEPLOYMENTS, TRTENGINES
from trtforge_operator.metrics import BrokerMetrics, Metrics
from trtforge_operator.store_reader import StoreReader

log = logging.getLogger(__name__)
SA_PREFIX = "system:serviceaccount:"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SHA256_HEADER = "X-Trtforge-Sha256"
AUTH_TTL_S = 5.0
SPOOL_CHUNK = 1 << 20
DEFAULT_MAX_MODEL_BYTES = 64 << 30


class Denied(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Identity:
    namespace: str
    pod: str = ""
    pod_uid: str = ""
    service_account: str = ""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}" if self.pod else self.namespace


@dataclass(frozen=True)
class ModelSourceRef:
    """The model source a TRTEngine names now (what its possession record must be for)."""

    uri: str
    secret: str | None
    pin: str | None

    @property
    def fingerprint(self) -> str:
        return source_fingerprint(self.uri, self.secret, self.pin)


class Authorizer(Protocol):
    async def identify(self, token: str) -> Identity:
        """Who holds `token`; raises Denied (401/403)."""
        ...

    async def check_engine(self, who: Identity, key: str) -> None:
        """Raises Denied (403) unless `who`'s namespace may read engine `key`."""
        ...

    async def check_artefact(self, who: Identity, kind: ArtefactKind, key: str) -> None:
        """Raises Denied (403) unless `who`'s namespace may read LLM artefact `kind`/`key`."""
        ...

    async def check_upload(self, who: Identity, sha256: str, length: int | None) -> VerifyGrant:
        """The pending verification `who` uploads for; raises Denied (403/413/503) otherwise."""
        ...

    def check_operator(self, who: Identity) -> None:
        """Raises Denied (403) unless `who` is the operator (its ServiceAccount)."""
        ...


# The LLM artefacts the broker serves: what an engine's status names (rank engines are not served).
SERVED_ARTEFACTS: tuple[ArtefactKind, ...] = (ArtefactKind.CHECKPOINT, ArtefactKind.TUNING_CACHE)
ArtefactRef = tuple[ArtefactKind, str]


def namespace_of(username: str) -> str | None:
    if not username.startswith(SA_PREFIX):
        return None
    ns, _, sa = username.removeprefix(SA_PREFIX).partition(":")
    return ns if ns and sa else None


def _referenced_engines(
    infds: list[dict[str, Any]], engines: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """The TRTEngines (same namespace) the InferenceDeployments reference, once per reference."""
    out = []
    for d in infds:
        ref = ((d.get("spec") or {}).get("engineRef") or {}).get("name")
        e = engines.get(ref or "")
        if e is not None:
            out.append(e)
    return out


def _source_ref(source: Mapping[str, Any]) -> ModelSourceRef:
    return ModelSourceRef(
        uri=str(source.get("uri") or ""),
        secret=((source.get("secretRef") or {}).get("name")) or None,
        pin=source.get("sha256") or None,
    )


def operator_denial(who: Identity, operator: tuple[str, str] | None) -> Denied | None:
    """Why `who` may not use the operator's store endpoints; None: it is the operator's ServiceAccount
    `operator` (namespace, name). Pure. Without a configured operator ServiceAccount nobody may."""
    if operator is None or not operator[1]:
        return Denied(403, "the store endpoints are off: broker.operator_service_account is not set")
    if (who.namespace, who.service_account) != operator:
        return Denied(
            403,
            f"only the operator's ServiceAccount {operator[0]}/{operator[1]} reads and writes the store "
            f"through the broker; not {who.namespace}/{who.service_account or '?'}",
        )
    return None


def sources_by_key(
    infds: list[dict[str, Any]], engines: dict[str, dict[str, Any]]
) -> dict[str, list[ModelSourceRef]]:
    """Engine key -> the model sources of the TRTEngines (same namespace) that list it in their status
    and that an InferenceDeployment of the namespace references."""
    out: dict[str, list[ModelSourceRef]] = {}
    for e in _referenced_engines(infds, engines):
        src = _source_ref((e.get("spec") or {}).get("model") or {})
        for t in (e.get("status") or {}).get("targets") or []:
            if t.get("engineKey"):
                out.setdefault(str(t["engineKey"]), []).append(src)
    return out


def artefact_sources(
    infds: list[dict[str, Any]], engines: dict[str, dict[str, Any]]
) -> dict[ArtefactRef, list[ModelSourceRef]]:
    """(kind, key) of each LLM artefact that a referenced TRTEngine's status names (its checkpoint,
    each target's tuning cache) -> the ``spec.llm.source`` of those TRTEngines."""
    out: dict[ArtefactRef, list[ModelSourceRef]] = {}
    for e in _referenced_engines(infds, engines):
        llm = (e.get("spec") or {}).get("llm")
        if not llm:
            continue
        src = _source_ref(llm.get("source") or {})
        status = e.get("status") or {}
        ckpt = (status.get("checkpoint") or {}).get("checkpointKey")
        if ckpt:
            out.setdefault((ArtefactKind.CHECKPOINT, str(ckpt)), []).append(src)
        for t in status.get("targets") or []:
            if t.get("tuningKey"):
                out.setdefault((ArtefactKind.TUNING_CACHE, str(t["tuningKey"])), []).append(src)
    return out


def keys_referenced(infds: list[dict[str, Any]], engines: dict[str, dict[str, Any]]) -> set[str]:
    """Engine keys the InferenceDeployments of one namespace reference (via their same-namespace engines)."""
    return set(sources_by_key(infds, engines))


def possession_denial(
    namespace: str,
    what: str,
    sources: Iterable[ModelSourceRef],
    model_sha256: str,
    possession: Callable[[str, str], PossessionRecord | None],
) -> str | None:
    """Why `namespace` has not proven it holds model `model_sha256` through one of `sources` (the
    sources its referencing TRTEngines name now); None: it has. `what` names the artefact."""
    for src in sources:
        rec = possession(namespace, src.fingerprint)
        if rec is not None and rec.proves(namespace, src.fingerprint, model_sha256):
            return None
    return (
        f"namespace {namespace} has not proven it holds the model of {what}: no verify "
        "step of its TRTEngine's current model source streamed a model with that sha256"
    )


def grant_denial(
    namespace: str,
    key: str,
    sources: Iterable[ModelSourceRef],
    manifest: Manifest | None,
    possession: Callable[[str, str], PossessionRecord | None],
) -> str | None:
    """Why `namespace` may not read engine `key` (None: it may). Pure but for the `possession` lookup.

    `sources`: the model sources of the namespace's referencing TRTEngines (empty: none references
    it). Without a manifest there is nothing to serve; the caller answers 404."""
    sources = list(sources)
    if not sources:
        return f"namespace {namespace} has no InferenceDeployment serving engine {key[:12]}"
    if manifest is None:
        return None
    return possession_denial(namespace, f"engine {key[:12]}", sources, manifest.model_sha256, possession)


def artefact_model_digest(
    manifest: ArtefactManifest | None, checkpoint: Callable[[str], ArtefactManifest | None]
) -> str | None:
    """The digest of the source model an LLM artefact was made from: a checkpoint's own record; a
    tuning cache's through the checkpoint its record names (`checkpoint(key)` reads that manifest).
    None when the artefact (or that checkpoint) is not in the store."""
    if manifest is None:
        return None
    if manifest.checkpoint is not None:
        return manifest.checkpoint.source.digest
    if manifest.tuning is not None:
        return artefact_model_digest(checkpoint(manifest.tuning.checkpoint_key), lambda _: None)
    return None


def artefact_denial(
    namespace: str,
    kind: ArtefactKind,
    key: str,
    sources: Iterable[ModelSourceRef],
    model_digest: str | None,
    possession: Callable[[str, str], PossessionRecord | None],
) -> str | None:
    """Why `namespace` may not read LLM artefact `kind`/`key` (None: it may): the rules of engines
    (:func:`grant_denial`), with the digest of the model it was made from (None: nothing to serve; the
    caller answers 404)."""
    sources = list(sources)
    what = f"{kind} {key[:12]}"
    if not sources:
        return f"namespace {namespace} has no InferenceDeployment serving {what}"
    if model_digest is None:
        return None
    return possession_denial(namespace, what, sources, model_digest, possession)


@dataclass(frozen=True)
class UploaderPod:
    """What the broker reads of the pod a token is bound to (from the apiserver, not from the pod)."""

    uid: str
    job: str  # the name of its controller, when that is a Job ("" otherwise)
    job_uid: str
    spec: Mapping[str, Any] = field(default_factory=dict)  # the pod's spec, matched whole

    @classmethod
    def from_k8s(cls, pod: Mapping[str, Any]) -> UploaderPod:
        meta = pod.get("metadata") or {}
        owner: dict[str, Any] = next(
            (
                o
                for o in meta.get("ownerReferences") or []
                if o.get("controller") and o.get("kind") == "Job" and o.get("apiVersion") == "batch/v1"
            ),
            {},
        )
        return cls(
            uid=str(meta.get("uid") or ""),
            job=str(owner.get("name") or ""),
            job_uid=str(owner.get("uid") or ""),
            spec=dict(pod.get("spec") or {}),
        )


def upload_denial(
    who: Identity,
    pod: UploaderPod | None,
    grant: VerifyGrant | None,
    sha256: str,
    length: int | None,
    now: float,
    job: Mapping[str, Any] | None,
) -> Denied | None:
    """Why `who` may not upload model `sha256` (`length` bytes, if said); None: it may. Pure.

    `pod`: the pod `who`'s token is bound to, as the apiserver has it (None: gone or no pod);
    `grant`: the operator's record of the verify Job that is that pod's controller (None: none);
    `job`: that Job as the apiserver has it now (None: gone)."""
    if not who.pod:
        return Denied(403, "only a verify Job's pod may upload a model: this token is bound to no pod")
    if pod is None or (who.pod_uid and pod.uid != who.pod_uid):
        return Denied(403, f"pod {who} does not exist (or is another pod of that name)")
    if not pod.job:
        return Denied(403, f"pod {who} is not a Job's pod; only the operator's verify Jobs upload models")
    if grant is None:
        return Denied(
            403, f"Job {who.namespace}/{pod.job} is not a pending verification the operator created"
        )
    if not grant.job_uid:  # the operator is between recording the Job and creating it
        return Denied(503, f"the verification of Job {pod.job} is being set up; retry")
    if grant.namespace != who.namespace or grant.job != pod.job or grant.job_uid != pod.job_uid:
        return Denied(
            403, f"Job {who.namespace}/{pod.job} is not the verify Job the operator created under that name"
        )
    if (differs := pod_spec_mismatch(grant, {"spec": pod.spec})) is not None:
        return Denied(
            403,
            f"pod {who} does not run what the operator gave Job {pod.job} (image {grant.image}, the "
            f"stage-model command line, its env and volumes): {differs}",
        )
    if (ended := job_denial(grant, job)) is not None:
        return Denied(403, ended)
    if now > grant.expires_at:
        return Denied(403, f"the verification of Job {pod.job} expired; the operator starts another")
    if grant.pin and sha256 != grant.pin:
        return Denied(403, f"Job {pod.job} verifies a source pinned to sha256 {grant.pin}, not {sha256}")
    if length is not None and length > grant.max_bytes:
        return Denied(
            413,
            f"the model is {length} bytes, more than this verification accepts ({grant.max_bytes} "
            "bytes: spec.model.maxSizeBytes or the operator's broker.max_model_bytes)",
        )
    return None


# The apiserver could not answer (down, restarting, partitioned): the client should retry, not give up.
UNAVAILABLE: tuple[type[BaseException], ...] = (ApiException, OSError, urllib3.exceptions.HTTPError)


def _short(e: BaseException) -> str:
    if isinstance(e, ApiException):
        return f"HTTP {e.status} {e.reason}"
    return " ".join(str(e).split())[:200] or type(e).__name__


@dataclass(frozen=True)
class References:
    """What one namespace's InferenceDeployments reference: engine keys and LLM artefacts, each with
    the model sources of the TRTEngines that name it."""

    engines: dict[str, list[ModelSourceRef]]
    artefacts: dict[ArtefactRef, list[ModelSourceRef]]


class KubeAuthorizer:
    """TokenReview, then the InferenceDeployments/TRTEngines of the token's namespace (cached briefly)
    and the store's possession records."""

    def __init__(
        self, kube: Kube, audience: str, store: StoreReader, operator: tuple[str, str] | None = None
    ) -> None:
        self.kube = kube
        self.audience = audience
        self.store = store
        self.operator = operator  # (namespace, ServiceAccount) that may use /store/
        self._tokens: dict[str, tuple[float, Identity]] = {}
        self._refs: dict[str, tuple[float, References]] = {}

    async def identify(self, token: str) -> Identity:
        hit = self._tokens.get(token)
        if hit and time.monotonic() - hit[0] < AUTH_TTL_S:
            return hit[1]
        try:
            st = await self.kube.token_review(token, self.audience)
        except UNAVAILABLE as e:
            raise Denied(503, f"cannot check the token now (TokenReview failed: {_short(e)}); retry") from e
        if not st.get("authenticated"):
            raise Denied(401, f"token not accepted: {st.get('error') or 'not authenticated'}")
        user = st.get("user") or {}
        ns = namespace_of(str(user.get("username", "")))
        if ns is None:
            raise Denied(403, f"{user.get('username')} is not a service account")
        extra = user.get("extra") or {}
        pod = (extra.get(POD_NAME_EXTRA) or [""])[0]
        sa = str(user.get("username", "")).removeprefix(SA_PREFIX).partition(":")[2]
        who = Identity(ns, pod, (extra.get(POD_UID_EXTRA) or [""])[0], sa)
        self._tokens[token] = (time.monotonic(), who)
        return who

    async def _references(self, ns: str, fresh: bool = False) -> References:
        hit = self._refs.get(ns)
        if not fresh and hit and time.monotonic() - hit[0] < AUTH_TTL_S:
            return hit[1]
        try:
            infds = await self.kube.list_custom(INFERENCEDEPLOYMENTS, ns)
            engines = {e["metadata"]["name"]: e for e in await self.kube.list_custom(TRTENGINES, ns)}
        except UNAVAILABLE as e:
            raise Denied(503, f"cannot read the namespace's references now ({_short(e)}); retry") from e
        out = References(sources_by_key(infds, engines), artefact_sources(infds, engines))
        self._refs[ns] = (time.monotonic(), out)
        return out

    async def check_engine(self, who: Identity, key: str) -> None:
        manifest = await asyncio.to_thread(self.store.manifest, key)
        why = None
        for fresh in (False, True):  # a just-created reference or record may not be cached yet
            sources = (await self._references(who.namespace, fresh)).engines.get(key, [])
            why = await asyncio.to_thread(
                grant_denial, who.namespace, key, sources, manifest, self._possession
            )
            if why is None:
                return
        raise Denied(403, why or "denied")

    async def check_artefact(self, who: Identity, kind: ArtefactKind, key: str) -> None:
        def digest() -> str | None:
            m = self.store.artefact_manifest(kind, key)
            return artefact_model_digest(
                m, lambda k: self.store.artefact_manifest(ArtefactKind.CHECKPOINT, k)
            )

        try:
            model_digest = await asyncio.to_thread(digest)
        except StoreError as e:
            raise Denied(503, f"cannot read the manifest of {kind} {key[:12]} now ({e}); retry") from e
        why = None
        for fresh in (False, True):  # as check_engine
            sources = (await self._references(who.namespace, fresh)).artefacts.get((kind, key), [])
            why = await asyncio.to_thread(
                artefact_denial, who.namespace, kind, key, sources, model_digest, self._possession
            )
            if why is None:
                return
        raise Denied(403, why or "denied")

    def _possession(self, ns: str, fp: str) -> PossessionRecord | None:
        return self.store.possession(ns, fp)

    async def check_upload(self, who: Identity, sha256: str, length: int | None) -> VerifyGrant:
        pod: UploaderPod | None = None
        grant: VerifyGrant | None = None
        if who.pod:
            try:
                raw = await self.kube.read_pod(who.namespace, who.pod)
            except UNAVAILABLE as e:
                raise Denied(503, f"cannot read the uploading pod now ({_short(e)}); retry") from e
            pod = UploaderPod.from_k8s(raw) if raw is not None else None
        job: dict[str, Any] | None = None
        if pod is not None and pod.job:
            try:
                grant = await asyncio.to_thread(self.store.verify_grant, who.namespace, pod.job)
            except StoreError as e:
                raise Denied(503, f"cannot read the verification record now ({e}); retry") from e
            try:
                job = await self.kube.read_job(who.namespace, pod.job)
            except UNAVAILABLE as e:
                raise Denied(503, f"cannot read the verify Job now ({_short(e)}); retry") from e
        why = upload_denial(who, pod, grant, sha256, length, time.time(), job)
        if why is not None:
            raise why
        assert grant is not None
        return grant

    def check_operator(self, who: Identity) -> None:
        if (why := operator_denial(who, self.operator)) is not None:
            raise why


class OpenAuthorizer:
    """`broker.auth: none` (local debugging only): anyone, as namespace `X-Trtforge-Namespace` or
    "local"; engines are served without the reference or possession checks."""

    async def identify(self, token: str) -> Identity:
        return Identity(token or "local")

    async def check_engine(self, who: Identity, key: str) -> None:
        return None

    async def check_artefact(self, who: Identity, kind: ArtefactKind, key: str) -> None:
        return None

    async def check_upload(self, who: Identity, sha256: str, length: int | None) -> VerifyGrant:
        raise Denied(403, "model uploads need broker.auth: tokenreview (a verify Job's bound token)")

    def check_operator(self, who: Identity) -> None:
        return None


async def _spool(request: web.Request, dest: str, limit: int, fmt: str) -> tuple[str, int]:
    """Stream the request body into `dest`, hashing it and checking it is a `fmt` file as it comes
    (broker/formats.py); (sha256, size). Denied(413) past `limit`, Denied(422) when not `fmt`."""
    h = hashlib.sha256()
    check = checker(fmt)
    size = 0

    def take(f: Any, chunk: bytes) -> None:
        check.feed(chunk)
        h.update(chunk)
        f.write(chunk)

    try:
        with open(dest, "wb") as f:
            async for chunk in request.content.iter_chunked(SPOOL_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise Denied(413, f"the model is larger than the broker accepts ({limit} bytes)")
                await asyncio.to_thread(take, f, chunk)
        check.finish()
    except FormatError as e:
        raise Denied(422, f"{e}; nothing was recorded") from e
    return h.hexdigest(), size


def make_app(
    store: StoreReader,
    authorizer: Authorizer | None,
    metrics: Metrics | BrokerMetrics | None = None,
    *,
    spool_dir: str | None = None,
    max_model_bytes: int = DEFAULT_MAX_MODEL_BYTES,
    max_bytes_per_second: int = 0,
) -> web.Application:
    """The broker's aiohttp application; `authorizer` None serves anyone (local debugging only).
    `max_bytes_per_second` caps each download (0: no cap)."""
    auth: Authorizer = authorizer if authorizer is not None else OpenAuthorizer()
    open_access = authorizer is None

    async def _identify(request: web.Request) -> Identity:
        if open_access:
            return Identity(request.headers.get("X-Trtforge-Namespace", "local"))
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            raise Denied(401, "no bearer token")
        return await auth.identify(header.removeprefix("Bearer ").strip())

    async def _check(request: web.Request, key: str) -> Identity:
        if not KEY_RE.match(key):
            raise Denied(404, "not an engine key")
        who = await _identify(request)
        await auth.check_engine(who, key)
        return who

    def _count(code: int) -> None:
        if metrics is not None:
            metrics.broker_requests.labels(str(code)).inc()

    def _deny(e: Denied) -> web.Response:
        _count(e.status)
        return web.json_response({"error": str(e)}, status=e.status)

    async def get_file(request: web.Request) -> web.StreamResponse:
        key, name = request.match_info["key"], request.match_info["file"]
        try:
            who = await _check(request, key)
        except Denied as e:
            return _deny(e)
        if "/" in name or name.startswith("."):
            _count(404)
            return web.json_response({"error": "no such file"}, status=404)
        path = engine_path(key, name)
        try:
            exists = await asyncio.to_thread(store.store.exists, path)
        except StoreError as e:
            _count(502)
            return web.json_response({"error": str(e)}, status=502)
        if not exists:
            _count(404)
            return web.json_response({"error": f"no {name} in engine {key[:12]}"}, status=404)
        headers: dict[str, str] = {}
        m = await asyncio.to_thread(store.manifest, key)
        if isinstance(m, Manifest) and m.engine_file == name:
            headers[SHA256_HEADER] = m.sha256
        if request.method == "HEAD":
            _count(200)
            return web.Response(status=200, headers=headers)
        return await _stream(request, path, headers, who, key=key, file=name)

    async def _stream(
        request: web.Request, path: str, headers: dict[str, str], who: Identity, **what: str
    ) -> web.StreamResponse:
        """Stream store file `path`, one chunk in memory at a time, under the rate cap."""
        resp = web.StreamResponse(status=200, headers={**headers, "Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        log.info("broker streaming %s to %s", path, who, extra=fields(client=str(who), **what))
        it = iter(store.store.iter_chunks(path))
        sent, t0 = 0, time.monotonic()
        try:
            while True:
                chunk = await asyncio.to_thread(next, it, None)
                if chunk is None:
                    break
                await resp.write(chunk)
                sent += len(chunk)
                if max_bytes_per_second:  # keep each download under the configured rate
                    ahead = sent / max_bytes_per_second - (time.monotonic() - t0)
                    if ahead > 0:
                        await asyncio.sleep(ahead)
                if isinstance(metrics, BrokerMetrics):
                    metrics.broker_bytes.inc(len(chunk))
        except (ObjectNotFound, StoreError) as e:
            log.warning("broker: %s failed mid-stream: %s", path, e)
            raise
        await resp.write_eof()
        _count(200)
        log.info("broker served %s to %s", path, who, extra=fields(client=str(who), **what))
        return resp

    def artefact_handler(kind: ArtefactKind) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """GET/HEAD of one kind of LLM artefact: its manifest, or a file the manifest lists."""

        async def get_artefact(request: web.Request) -> web.StreamResponse:
            key = request.match_info["key"]
            upload, rel = request.match_info.get("upload"), request.match_info.get("path")
            try:
                if not KEY_RE.match(key):
                    raise Denied(404, f"not a {kind} key")
                who = await _identify(request)
                await auth.check_artefact(who, kind, key)
                try:
                    m = await asyncio.to_thread(store.artefact_manifest, kind, key)
                except StoreError as e:
                    _count(502)
                    return web.json_response({"error": str(e)}, status=502)
                if m is None:
                    raise Denied(404, f"no {kind} {key[:12]} (no manifest)")
                headers: dict[str, str] = {}
                if upload is None:
                    path = artefact_manifest_path(kind, key)
                else:
                    f = next((f for f in m.files if f.path == rel), None)
                    if upload != m.upload or f is None:
                        raise Denied(404, f"{kind} {key[:12]} has no file {upload}/{rel}")
                    path, headers[SHA256_HEADER] = file_path(kind, key, m.upload, f.path), f.sha256
            except Denied as e:
                return _deny(e)
            if request.method == "HEAD":
                _count(200)
                return web.Response(status=200, headers=headers)
            return await _stream(request, path, headers, who, kind=str(kind), key=key, file=rel or "manifest")

        return get_artefact

    async def list_files(request: web.Request) -> web.Response:
        key = request.match_info["key"]
        try:
            await _check(request, key)
        except Denied as e:
            return _deny(e)
        try:
            paths = await asyncio.to_thread(store.store.list, f"engines/{key}/")
        except StoreError as e:
            _count(502)
            return web.json_response({"error": str(e)}, status=502)
        if manifest_path(key) not in paths:
            _count(404)
            return web.json_response({"error": f"no engine {key[:12]}"}, status=404)
        _count(200)
        return web.json_response({"files": sorted(p.rsplit("/", 1)[-1] for p in paths)})

    async def put_model(request: web.Request) -> web.Response:
        sha = request.match_info["sha256"]
        try:
            if not SHA256_RE.match(sha):
                raise Denied(404, "not a model digest (64 lowercase hex)")
            who = await _identify(request)
            grant = await auth.check_upload(who, sha, request.content_length)
            limit = min(grant.max_bytes, max_model_bytes)
            if request.content_length is not None and request.content_length > limit:
                raise Denied(413, f"the model is larger than the broker accepts ({limit} bytes)")
            fd, tmp = tempfile.mkstemp(prefix="trtforge-model-", suffix=".part", dir=spool_dir)
            os.close(fd)
            try:
                got, size = await _spool(request, tmp, limit, grant.format)
                if got != sha:
                    raise Denied(
                        422,
                        f"the bytes sent have sha256 {got} ({size} bytes), not {sha}; nothing was recorded",
                    )
                staged = staged_model_path(sha)
                if not await asyncio.to_thread(store.store.exists, staged):

                    def _put() -> None:
                        with open(tmp, "rb") as f:
                            store.store.put(staged, f)

                    await asyncio.to_thread(_put)
            finally:
                os.unlink(tmp)
            fp = grant.fingerprint
            rec = PossessionRecord(
                namespace=grant.namespace,
                fingerprint=fp,
                sha256=sha,
                size_bytes=size,
                uri=grant.uri,
                secret=grant.secret,
                pod=who.pod,
            )
            await asyncio.to_thread(
                store.store.put_bytes, possession_path(grant.namespace, fp), rec.to_json().encode()
            )
            store.invalidate_possession(grant.namespace, fp)
            # Used up: the same Job's pod cannot record another digest for this source.
            await asyncio.to_thread(store.store.delete, verify_grant_path(grant.namespace, grant.job))
        except Denied as e:
            return _deny(e)
        except (StoreError, OSError) as e:
            _count(502)
            log.warning("broker: could not stage model %s: %s", sha[:12], e)
            return web.json_response({"error": f"could not stage the model: {e}"}, status=502)
        _count(200)
        log.info(
            "possession verified: %s holds model %s",
            who,
            sha[:12],
            extra=fields(
                namespace=grant.namespace,
                sha256=sha,
                bytes=size,
                source=grant.uri,
                job=grant.job,
                client=str(who),
            ),
        )
        return web.json_response({"sha256": sha, "sizeBytes": size, "fingerprint": fp})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=1 << 20)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/engines/{key}/", list_files)
    app.router.add_route("GET", "/engines/{key}/{file}", get_file)
    app.router.add_route("HEAD", "/engines/{key}/{file}", get_file)
    for kind in SERVED_ARTEFACTS:
        handler, d = artefact_handler(kind), KIND_DIRS[kind]
        for method in ("GET", "HEAD"):
            app.router.add_route(method, f"/{d}/{{key}}/manifest.json", handler)
            app.router.add_route(method, f"/{d}/{{key}}/{{upload}}/{{path:.+}}", handler)
    app.router.add_put("/models/{sha256}", put_model)

    async def operator_only(request: web.Request) -> web.Response | None:
        """None when the caller is the operator; else the refusal to answer with."""
        try:
            auth.check_operator(await _identify(request))
        except Denied as e:
            return _deny(e)
        return None

    add_operator_store_routes(app, store, operator_only, _count)
    return app


async def start_broker(
    cfg: OperatorConfig,
    store: StoreReader,
    kube: Kube,
    metrics: Metrics | BrokerMetrics,
    *,
    serve_metrics: bool = False,
) -> web.AppRunner:
    """Listen on broker.host:broker.port; `serve_metrics` adds /metrics (the standalone broker)."""
    operator = (cfg.operator_namespace, cfg.broker.operator_service_account or "")
    auth: Authorizer | None = (
        KubeAuthorizer(kube, cfg.broker.audience, store, operator)
        if cfg.broker.auth == "tokenreview"
        else None
    )
    app = make_app(
        store,
        auth,
        metrics,
        spool_dir=cfg.broker.spool_dir,
        max_model_bytes=cfg.broker.max_model_bytes,
        max_bytes_per_second=cfg.broker.max_bytes_per_second,
    )
    if serve_metrics:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        async def prometheus(_: web.Request) -> web.Response:
            body = generate_latest(metrics.registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        app.router.add_get("/metrics", prometheus)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=cfg.broker.shutdown_grace_seconds)
    await runner.setup()
    site = web.TCPSite(runner, cfg.broker.host, cfg.broker.port)
    await site.start()
    log.info(
        "engine broker listening on %s:%s",
        cfg.broker.host,
        cfg.broker.port,
        extra=fields(url=cfg.broker_url()),
    )
    return runner
