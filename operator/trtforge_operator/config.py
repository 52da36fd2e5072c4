"""Operator configuration: one typed model, read once at start from a YAML file and the environment.

Precedence: defaults < the file named by ``--config`` / ``$TRTFORGE_OPERATOR_CONFIG`` < environment
variables ``TRTFORGE_OPERATOR_<FIELD>`` for top-level scalar fields (e.g. ``TRTFORGE_OPERATOR_STORE_URI``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trtforge.contract import images
from trtforge.contract.engine_key import Backend
from trtforge.contract.quantity import QuantityError, parse_quantity
from trtforge_operator.leader.lease import timing_problem

ENV_PREFIX = "TRTFORGE_OPERATOR_"
CONFIG_ENV = "TRTFORGE_OPERATOR_CONFIG"


class ConfigError(ValueError):
    """The configuration is invalid; the message names the field or file."""


def _default_backends() -> dict[str, Backend]:
    return {"gpu": "tensorrt", "cpu": "onnxruntime"}


# The taint GPU node pools carry on most clusters (the GPU Operator's docs, managed node pools).
GPU_TOLERATION: dict[str, Any] = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _default_tolerations() -> list[dict[str, Any]]:
    return [dict(GPU_TOLERATION)]


class BuildSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    deadline_seconds: int = Field(default=3600, ge=60)  # a Job's activeDeadlineSeconds
    backoff_limit: int = Field(default=0, ge=0)  # pod retries inside one Job attempt
    max_attempts: int = Field(default=3, ge=1)  # Job attempts before Stalled
    retry_base_seconds: float = Field(default=30.0, ge=0)  # backoff after attempt n: base * 2^(n-1)
    retry_max_seconds: float = Field(default=600.0, ge=0)
    max_concurrent: int = Field(default=8, ge=1)  # build Jobs running at once, cluster-wide
    max_concurrent_per_namespace: int = Field(default=4, ge=1)  # ... requested from one namespace
    # A finished build Job is deleted this long after it finished, once every requester has recorded
    # its result (docs/design.md "Finished build Jobs"); 0 keeps them all.
    finished_job_ttl_seconds: float = Field(default=3600.0, ge=0)
    cpu: str = "2"
    memory: str = "8Gi"
    scratch_size: str = "20Gi"
    env: dict[str, str] = Field(default_factory=dict)  # extra env for build pods
    # Where the builder image's llama.cpp tools are, for LLM quantize and tune Jobs on the llama.cpp
    # backend (passed as --llama-bin-dir); unset: the image's PATH.
    llama_bin_dir: str | None = None
    # The accuracy gate's evaluation length in chunks of the evaluation text (passed to quantize Jobs
    # as --perplexity-chunks); 0: the whole text.
    llm_perplexity_chunks: int = Field(default=0, ge=0)
    # llama-bench runs of each setting in tune Jobs (passed as --repetitions).
    llm_bench_repetitions: int = Field(default=2, ge=1)

    @field_validator("cpu", "memory", "scratch_size")
    @classmethod
    def _quantity(cls, v: str) -> str:
        try:
            if parse_quantity(v) <= 0:
                raise ValueError(f"{v!r} must be more than 0")
        except QuantityError as e:
            raise ValueError(str(e)) from e
        return v


class GCSettings(BaseModel):
    """Engines stay in the store (a shared cache) until GC removes unreferenced ones; off by default."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = False
    interval_seconds: float = Field(default=3600.0, gt=0)
    min_age_seconds: float = Field(default=7 * 24 * 3600.0, ge=0)  # never collect younger engines
    keep_latest: int = Field(default=0, ge=0)  # always keep this many most recent unreferenced ones
    # Clock skew allowed between the apiserver (a Job's start, a listing) and a pod (a manifest's or a
    # possession record's time): what is younger than a guard by less than this stays a pass.
    clock_skew_seconds: float = Field(default=60.0, ge=0)


class BrokerSettings(BaseModel):
    """The engine broker: serves engines to runtime pods that present a projected service-account token."""

    model_config = ConfigDict(extra="forbid")
    # Also run the broker inside `trtforge operator` (one process: local runs, the test bed). The
    # chart runs it as its own Deployment (`trtforge broker`), so serving never waits for the operator.
    enabled: bool = True
    host: str = "0.0.0.0"
    port: int = 8081
    url: str | None = None  # what runtime pods use; default http://trtforge-broker.<operator ns>.svc:<port>
    audience: str = "trtforge-broker"
    token_expiration_seconds: int = Field(default=3600, ge=600)
    auth: Literal["tokenreview", "none"] = "tokenreview"  # "none" only for local debugging
    # Where runtime pods and verify Jobs reach the broker: `url`, or `endpoints` tried in turn where
    # there are no Service IPs (the test bed); default http://trtforge-broker.<operator ns>.svc:<port>.
    endpoints: list[str] = Field(default_factory=list)
    shutdown_grace_seconds: float = Field(default=20.0, ge=0)  # a stopping broker finishes downloads
    spool_dir: str | None = None  # where verify uploads are hashed before they enter the store (temp dir)
    max_model_bytes: int = Field(default=64 << 30, ge=1)  # the largest model a verify step may upload
    max_bytes_per_second: int = Field(default=0, ge=0)  # per download, to spare the store; 0 = no cap
    # The ServiceAccount (in operator_namespace) whose token may read and write the whole store through
    # the broker's /store/ endpoints: the operator's, where it mounts no claim (store_via_broker).
    operator_service_account: str | None = None


class VerifySettings(BaseModel):
    """Verify Jobs: a tenant proves it holds its model before it may use an engine (docs/security.md)."""

    model_config = ConfigDict(extra="forbid")
    cpu: str = "500m"
    memory: str = "1Gi"
    deadline_seconds: int = Field(default=1800, ge=60)
    # Verify Jobs running at once in one namespace (each reads a whole model and streams it to the
    # broker); more wait, with the reason in their TRTEngine's status.
    max_concurrent_per_namespace: int = Field(default=4, ge=1)


CacheSharing = Literal["all", "namespace", "groups"]
CACHE_GROUP_LABEL = "trtforge.io/cache-group"


class CacheSettings(BaseModel):
    """Who shares engines in the store. Possession is proven in every case; sharing decides whose
    builds a namespace may hit at all.

    - ``all``: one cache for every namespace.
    - ``namespace``: each namespace its own cache.
    - ``groups``: namespaces whose label ``group_label`` has the same value share one cache; a
      namespace without the label has its own. Namespace labels are set by the platform team (tenants
      with ``edit`` cannot label their namespace).
    """

    model_config = ConfigDict(extra="forbid")
    sharing: CacheSharing = "groups"
    group_label: str = Field(default=CACHE_GROUP_LABEL, min_length=1, max_length=316)

    def scope(self, namespace: str, namespace_labels: dict[str, str] | None) -> str:
        """The cache scope of `namespace` (see trtforge.contract.possession.scoped_key)."""
        if self.sharing == "all":
            return ""
        if self.sharing == "groups":
            group = (namespace_labels or {}).get(self.group_label, "")
            if group:
                return f"group:{group}"
        return f"ns:{namespace}"


class LeaderElectionSettings(BaseModel):
    """Leader election on a coordination.k8s.io/v1 Lease in operator_namespace (client-go's defaults).

    A replica acts only while it holds the Lease; a holder that cannot renew within the renew deadline
    exits; a candidate takes over when the Lease has not been renewed for a lease duration.
    """

    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    lease_name: str = Field(default="trtforge-operator", pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    lease_duration_seconds: int = Field(default=15, ge=2)
    renew_deadline_seconds: float = Field(default=10.0, gt=0)
    retry_period_seconds: float = Field(default=2.0, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> LeaderElectionSettings:
        problem = timing_problem(
            self.lease_duration_seconds, self.renew_deadline_seconds, self.retry_period_seconds
        )
        if problem:
            raise ValueError(problem)
        return self


class FaultSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    suspect_node_ttl_seconds: float = 3600.0  # keep pods off a faulty node this long (or while unhealthy)
    history: int = Field(default=10, ge=1)  # status.faults keeps the last N


class GroupSettings(BaseModel):
    """Rank groups (docs/llm.md "Groups")."""

    model_config = ConfigDict(extra="forbid")
    # A trtllm-serve group spanning pods launches its ranks with mpirun, whose launcher execs into the
    # worker pods: the operator gives the leader its own ServiceAccount and a Role with pods/exec on
    # its workers by name, which it may only do holding pods/exec itself (RBAC's escalation rule).
    # Off (the chart's rbac.rankExec), such a group is refused in its Groups condition.
    rank_exec: bool = False


class AutoscalingSettings(BaseModel):
    """What the operator's autoscalers need from the cluster (docs/operations.md, Autoscaling)."""

    model_config = ConfigDict(extra="forbid")
    # The Prometheus (its HTTP query API) a KEDA ScaledObject's prometheus trigger asks, e.g.
    # http://prometheus-operated.monitoring.svc:9090; unset: `provider: KEDA` is refused in status.
    keda_prometheus_address: str | None = None
    # The window of the request rate (RequestRate) in a KEDA trigger's query, as prometheus-adapter's.
    rate_window: str = Field(default="1m", pattern=r"^[0-9]+(ms|s|m|h)$")
    # The served autoscaling APIs (HPA versions, KEDA's ScaledObject) are looked up again after this
    # long, and sooner (miss_retry_seconds) when a pass wants one that the last look did not find.
    discovery_ttl_seconds: float = Field(default=300.0, gt=0)
    miss_retry_seconds: float = Field(default=10.0, ge=0)


class FrontProxySettings(BaseModel):
    """HAProxy in front of every runtime pod (apply/front_proxy.py; docs/security.md, "Hostile clients")."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = False
    image: str = "haproxy:2.6"
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    # Calls a second one client address may start on each port; past it, 429.
    calls_per_client_per_second: int = Field(default=200, ge=1)
    resources: dict[str, Any] = Field(default_factory=dict)  # the sidecar's requests and limits


class OperatorConfig(BaseModel):
    """Everything `trtforge operator` needs; see docs/operations for the YAML form."""

    model_config = ConfigDict(extra="forbid")
    namespaces: list[str] = Field(default_factory=list)  # watched namespaces; empty = cluster-wide
    operator_namespace: str = "trtforge-system"
    build_namespace: str = "trtforge-system"
    # The store as build Jobs see it (pvc://claim/prefix or s3://bucket/prefix) ...
    store_uri: str = images.DEFAULT_STORE_URI
    # ... and as the operator process sees it (a mounted path, the same S3 prefix); default: store_uri.
    operator_store_uri: str | None = None
    # The operator reads and writes the store through the broker (as its ServiceAccount) instead, and
    # mounts no claim: a claim that cannot bind then holds only the broker, and the operator says why
    # in StoreReady (docs/design.md §"Store claim that cannot bind").
    store_via_broker: bool = False
    store_credentials_secret: str | None = None  # in the build namespace; mounted into build Jobs (S3)
    # What runtime pods get as --store: the broker URL (default) or a store URI they can read themselves.
    runtime_store_uri: str | None = None
    builder_image: str = images.BUILDER.reference()
    # Runtime pods get the slim image for a version-compatible engine and the full one otherwise
    # (docs/design.md §"Runtime image per engine"); an InferenceDeployment's spec.runtime.image wins.
    runtime_image: str = images.RUNTIME.reference()
    runtime_image_full: str = images.RUNTIME_FULL.reference()
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    # Secrets (names) every pod the operator makes pulls its image with: build and verify Jobs and
    # runtime pods. A verify Job and runtime pods run in the tenant's namespace: the Secret must exist
    # there too (docs/install.md, Private registries).
    image_pull_secrets: list[str] = Field(default_factory=list)
    # Tolerations of every pod the operator makes (build, verify, runtime); default: NVIDIA's GPU taint.
    tolerations: list[dict[str, Any]] = Field(default_factory=_default_tolerations)
    build_service_account: str = "trtforge-builder"
    # The backend builds use per kind of target: "gpu", "cpu", or a GPU product label (most specific
    # wins). Only its name: versions are what the builder image really has, which the builder reports
    # (docs/design.md §"Engine keys"); the operator never guesses them.
    backends: dict[str, Backend] = Field(default_factory=_default_backends)
    build: BuildSettings = Field(default_factory=BuildSettings)
    gc: GCSettings = Field(default_factory=GCSettings)
    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    verify: VerifySettings = Field(default_factory=VerifySettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    faults: FaultSettings = Field(default_factory=FaultSettings)
    groups: GroupSettings = Field(default_factory=GroupSettings)
    autoscaling: AutoscalingSettings = Field(default_factory=AutoscalingSettings)
    front_proxy: FrontProxySettings = Field(default_factory=FrontProxySettings)
    leader_election: LeaderElectionSettings = Field(default_factory=LeaderElectionSettings)
    # Level-based resync, counted from each object's own last pass and jittered by +-10%
    # (docs/design.md §"Scale"). InferenceDeployments: their rollout and fault timers ride on it.
    resync_seconds: float = Field(default=30.0, gt=0)
    # TRTEngines: every input of a pass but the store has a watch or a timer of its own, so this only
    # catches what changed in the store behind the operator's back; short periods cost O(N) per period.
    engine_resync_seconds: float = Field(default=300.0, gt=0)
    # /healthz fails (503) when one reconcile has run this long, or no loop has come round this long.
    liveness_stuck_seconds: float = Field(default=300.0, gt=0)
    liveness_port: int = 8080
    metrics_port: int = 9090
    # Where metrics, /healthz and the broker listen. A pod's own IP instead of every address where
    # pods share one network (the test bed: TRTFORGE_OPERATOR_BIND_ADDRESS from status.podIP).
    bind_address: str = "0.0.0.0"
    # Where /metrics listens: "0.0.0.0" is where /healthz does (bind_address); one address such as
    # 127.0.0.1 keeps the tenants' object names in the series inside the pod (the chart's default).
    metrics_bind_address: str = "0.0.0.0"
    runtime_service_account: str = "default"  # in tenant namespaces; needs no API permissions

    def backend_for(self, gpu: str) -> Backend:
        """The backend builds for `gpu` (a product label or "cpu") ask for."""
        if gpu in self.backends:
            return self.backends[gpu]
        kind = "cpu" if gpu == "cpu" else "gpu"
        if kind in self.backends:
            return self.backends[kind]
        raise ConfigError(f"backends: no entry for {gpu!r} or {kind!r}; add one to the operator config")

    @property
    def reader_store_uri(self) -> str:
        return self.operator_store_uri or self.store_uri

    def broker_url(self) -> str:
        """What runtime pods and verify Jobs get: one URL, or endpoints separated by commas."""
        if self.broker.endpoints:
            return ",".join(e.rstrip("/") for e in self.broker.endpoints)
        if self.broker.url:
            return self.broker.url.rstrip("/")
        return f"http://trtforge-broker.{self.operator_namespace}.svc:{self.broker.port}"

    def with_broker_on_bind_address(self) -> OperatorConfig:
        """The broker listens where metrics and /healthz do when `bind_address` names one address
        (a pod's own IP where pods share one network) and `broker.host` is left at every address."""
        if self.bind_address == "0.0.0.0" or self.broker.host != "0.0.0.0":
            return self
        return self.model_copy(update={"broker": self.broker.model_copy(update={"host": self.bind_address})})

    def metrics_address(self) -> str:
        """The address /metrics listens on (see `metrics_bind_address`)."""
        return self.bind_address if self.metrics_bind_address == "0.0.0.0" else self.metrics_bind_address

    def watched_namespaces(self) -> list[str]:
        """The namespaces the operator watches and acts in: those configured and the build namespace;
        empty for every namespace. The chart binds the operator's rights in exactly these."""
        return sorted({*self.namespaces, self.build_namespace}) if self.namespaces else []

    def runtime_image_for(self, version_compatible: bool) -> str:
        """The default runtime image for an engine: slim (lean TensorRT) loads only version-compatible
        engines, so any other engine gets the full image."""
        return self.runtime_image if version_compatible else self.runtime_image_full

    def pod_defaults(self) -> dict[str, Any]:
        """What every pod the operator makes carries: its tolerations and image pull secrets."""
        out: dict[str, Any] = {}
        if self.tolerations:
            out["tolerations"] = [dict(t) for t in self.tolerations]
        if self.image_pull_secrets:
            out["imagePullSecrets"] = [{"name": n} for n in self.image_pull_secrets]
        return out

    def engine_source(self) -> str:
        """The --store runtime pods get."""
        return self.runtime_store_uri or self.broker_url()


def _env_overrides(env: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    scalar = {
        "store_uri",
        "operator_store_uri",
        "runtime_store_uri",
        "store_credentials_secret",
        "builder_image",
        "runtime_image",
        "runtime_image_full",
        "build_namespace",
        "operator_namespace",
        "resync_seconds",
        "engine_resync_seconds",
        "liveness_stuck_seconds",
        "liveness_port",
        "metrics_port",
        "bind_address",
        "metrics_bind_address",
        "image_pull_policy",
        "build_service_account",
        "runtime_service_account",
    }
    for name in scalar:
        v = env.get(ENV_PREFIX + name.upper())
        if v is not None:
            out[name] = v
    ns = env.get(ENV_PREFIX + "NAMESPACES")
    if ns is not None:
        out["namespaces"] = [n.strip() for n in ns.split(",") if n.strip()]
    return out


def _expand_backends(data: dict[str, Any]) -> None:
    """`backends: {gpu: local-onnxruntime}` (older configs) means onnxruntime; a mapping with a
    version is refused: the builder reports versions, the operator does not predict them."""
    backends = data.get("backends")
    if not isinstance(backends, dict):
        return
    for k, v in list(backends.items()):
        if v == "local-onnxruntime":
            backends[k] = "onnxruntime"
        elif isinstance(v, dict):
            extra = sorted(set(v) - {"backend"})
            if extra:
                raise ConfigError(
                    f"operator config field 'backends.{k}': {', '.join(extra)} are not set here; "
                    "give only the backend name (tensorrt or onnxruntime): the builder reports the "
                    "versions it really has (docs/design.md, Engine keys)"
                )
            backends[k] = v.get("backend")


def load_config(path: str | Path | None = None, env: dict[str, str] | None = None) -> OperatorConfig:
    """Read the config file (if any) and the environment; raise ConfigError naming what is wrong."""
    env = dict(os.environ) if env is None else env
    path = path or env.get(CONFIG_ENV)
    data: dict[str, Any] = {}
    if path:
        p = Path(path)
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except OSError as e:
            raise ConfigError(f"operator config {p}: cannot read it ({e.strerror})") from e
        except yaml.YAMLError as e:
            raise ConfigError(f"operator config {p}: not valid YAML ({e})") from e
        if not isinstance(loaded, dict):
            raise ConfigError(
                f"operator config {p}: expected a mapping at the top, got {type(loaded).__name__}"
            )
        data = {k.replace("-", "_"): v for k, v in loaded.items()}
    data.update(_env_overrides(env))
    _expand_backends(data)
    try:
        return OperatorConfig.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"operator config field {where!r}: {first['msg']}") from e
