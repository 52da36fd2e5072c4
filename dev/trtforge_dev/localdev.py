"""Running the operator against the local test bed: CRDs, a build namespace with its store and model
PVCs, an operator config, and `trtforge operator` as a subprocess (killable, restartable).

Used by the integration/e2e tests and by `trtforge demo`. The operator is scoped to the namespaces it
is given, so several can share one test bed without seeing each other's resources.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from trtforge_operator.config import CACHE_GROUP_LABEL

from trtforge_dev.testbed.procs import free_ports
from trtforge_dev.testbed.wait import wait_for

STORE_CLAIM = "trtforge-store"
MODELS_CLAIM = "models"


def install_crds(tb: Any) -> None:
    """Apply the operator's packaged CRDs (CEL rules need --validate=false on a 1.20 kubectl) and wait
    for them to be established."""
    from trtforge_operator.crdgen import packaged_crds

    for text in packaged_crds().values():
        tb.kubectl("apply", "--validate=false", "-f", "-", input=text)
    for name in ("trtengines.trtforge.io", "inferencedeployments.trtforge.io"):
        tb.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")


def _create_if_absent(create: Any, *args: Any) -> None:
    """Call a client `create_*`; an object that already exists (409) is fine."""
    try:
        create(*args)
    except ApiException as e:
        if e.status != 409:
            raise


def ensure_namespace(api: client.ApiClient, name: str) -> None:
    core: Any = client.CoreV1Api(api)
    _create_if_absent(
        core.create_namespace, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )


def label_namespace(api: client.ApiClient, ns: str, labels: dict[str, str]) -> None:
    """What a platform team does to put namespaces into one cache group (tenants cannot)."""
    core: Any = client.CoreV1Api(api)
    core.patch_namespace(ns, {"metadata": {"labels": labels}})


def _claim(core: Any, ns: str, name: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}},
    }
    _create_if_absent(core.create_namespaced_persistent_volume_claim, ns, body)


def claim_path(api: client.ApiClient, ns: str, name: str, timeout: float = 60) -> Path:
    """The host directory behind a bound test-bed PVC."""
    core: Any = client.CoreV1Api(api)

    def bound() -> str | None:
        pvc = core.read_namespaced_persistent_volume_claim(name, ns)
        if not pvc.spec.volume_name:
            return None
        pv = core.read_persistent_volume(pvc.spec.volume_name)
        return str(pv.spec.host_path.path) if pv.spec.host_path else None

    return Path(str(wait_for(bound, timeout=timeout, desc=f"PVC {ns}/{name} bound")))


def prepare_build_namespace(api: client.ApiClient, ns: str) -> tuple[Path, Path]:
    """The build namespace with its ServiceAccount and the store PVC, and a host directory of test
    models (for tenants' `models` claims, see tenant_models_claim); returns (store dir, models dir).

    The build namespace has no model claim: model sources live in the tenants' own namespaces."""
    ensure_namespace(api, ns)
    core: Any = client.CoreV1Api(api)
    _create_if_absent(core.create_namespaced_service_account, ns, {"metadata": {"name": "trtforge-builder"}})
    _claim(core, ns, STORE_CLAIM)
    store = claim_path(api, ns, STORE_CLAIM)
    models = store.parent / f"{store.name}-test-models"
    models.mkdir(parents=True, exist_ok=True)
    return store, models


def tenant_models_claim(api: client.ApiClient, ns: str, host_dir: Path, name: str = MODELS_CLAIM) -> str:
    """A claim `name` in tenant namespace `ns`, bound to a PV on `host_dir` (the test bed's stand-in
    for a team's model volume); several tenants may be given the same directory, as several teams
    may mount one read-only model share. Returns the PV's name (cluster-scoped: delete it after)."""
    core: Any = client.CoreV1Api(api)
    host_dir.mkdir(parents=True, exist_ok=True)
    pv_name = f"{name}-{ns}"[:63]
    _create_if_absent(
        core.create_persistent_volume,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv_name, "labels": {"trtforge.io/test-models": "true"}},
            "spec": {
                "capacity": {"storage": "10Gi"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(host_dir), "type": "Directory"},
                "claimRef": {"namespace": ns, "name": name},
            },
        },
    )
    _create_if_absent(
        core.create_namespaced_persistent_volume_claim,
        ns,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": pv_name,
                "resources": {"requests": {"storage": "10Gi"}},
            },
        },
    )
    claim_path(api, ns, name)  # wait until bound
    return pv_name


def write_config(
    path: Path, *, build_ns: str, namespaces: Sequence[str], store_dir: Path, **overrides: Any
) -> dict[str, Any]:
    """An operator config for the test bed: ONNX Runtime keys, the broker on a free loopback port."""
    broker_port, liveness_port, metrics_port = free_ports(3)
    cfg: dict[str, Any] = {
        "namespaces": list(namespaces),
        "operator_namespace": build_ns,
        "build_namespace": build_ns,
        "store_uri": f"pvc://{STORE_CLAIM}/",
        "operator_store_uri": str(store_dir),
        "backends": {"gpu": "local-onnxruntime", "cpu": "local-onnxruntime"},
        "broker": {"port": broker_port, "url": f"http://127.0.0.1:{broker_port}"},
        "liveness_port": liveness_port,
        "metrics_port": metrics_port,
        "resync_seconds": 15,
        "engine_resync_seconds": 15,
        "build": {
            "cpu": "100m",
            "memory": "1Gi",
            "retry_base_seconds": 5,
            "max_concurrent": 4,
            "max_concurrent_per_namespace": 4,
        },
    }
    for k, v in overrides.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k] = {**cfg[k], **v}
        else:
            cfg[k] = v
    path.write_text(yaml.safe_dump(cfg))
    return cfg


class OperatorProcess:
    """`trtforge operator` (or another `trtforge` command on the operator's config, such as
    `broker --port N`) as a child process with its own log file."""

    def __init__(
        self, config: Path, kubeconfig: Path, log: Path, command: Sequence[str] = ("operator",)
    ) -> None:
        self.config, self.kubeconfig, self.log = config, kubeconfig, log
        self.command = list(command)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        exe = shutil.which("trtforge", path=str(Path(sys.executable).parent)) or "trtforge"
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "TRTFORGE_LOG_FORMAT": "text",
            # Its leader-election identity, the same on every restart (as a pod's name is): a
            # restarted operator renews its own Lease at once instead of waiting it out.
            "TRTFORGE_LEADER_IDENTITY": f"local-{self.config.stem}",
        }
        self.starts += 1
        with self.log.open("ab") as out:
            when = time.strftime("%H:%M:%S")
            out.write(f"\n===== {self.command[0]} start #{self.starts} at {when} =====\n".encode())
            self.proc = subprocess.Popen(
                [exe, *self.command, "--config", str(self.config)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def kill(self) -> None:
        """SIGKILL: no clean-up, as a node failure or OOM kill would do."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def __enter__(self) -> OperatorProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def get_custom(api: client.ApiClient, plural: str, ns: str, name: str) -> dict[str, Any]:
    co: Any = client.CustomObjectsApi(api)
    return dict(co.get_namespaced_custom_object("trtforge.io", "v1alpha1", ns, plural, name))


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return None


def is_true(obj: dict[str, Any], type_: str) -> bool:
    c = condition(obj, type_)
    gen = (obj.get("metadata") or {}).get("generation")
    return bool(
        c and c.get("status") == "True" and (obj.get("status") or {}).get("observedGeneration") == gen
    )


def delete_with_cleanup(api: client.ApiClient, ns: str, plural: str, name: str) -> None:
    co: Any = client.CustomObjectsApi(api)
    try:
        co.delete_namespaced_custom_object("trtforge.io", "v1alpha1", ns, plural, name)
    except ApiException as e:
        if e.status != 404:
            raise


RESOURCE_PLURALS = ("inferencedeployments", "trtengines")


def delete_resources(api: client.ApiClient, namespaces: Iterable[str], finalizer_wait_s: float) -> None:
    """Delete every InferenceDeployment and TRTEngine in `namespaces`, give the operator up to
    `finalizer_wait_s` to run their finalizers, then strip the finalizers it did not remove, so that
    their namespaces can go (an operator stopped or slow under load would hold them forever)."""
    co: Any = client.CustomObjectsApi(api)
    namespaces = list(namespaces)

    def left() -> list[tuple[str, str, str]]:
        out = []
        for ns in namespaces:
            for plural in RESOURCE_PLURALS:
                with contextlib.suppress(ApiException):
                    items = co.list_namespaced_custom_object("trtforge.io", "v1alpha1", ns, plural)["items"]
                    out += [(ns, plural, o["metadata"]["name"]) for o in items]
        return out

    for ns, plural, name in left():
        with contextlib.suppress(ApiException):
            delete_with_cleanup(api, ns, plural, name)
    if finalizer_wait_s > 0:
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: not left(), timeout=finalizer_wait_s, desc="our resources deleted")
    for ns, plural, name in left():
        with contextlib.suppress(ApiException):
            co.patch_namespaced_custom_object(
                "trtforge.io", "v1alpha1", ns, plural, name, {"metadata": {"finalizers": None}}
            )


def tiny_model(path: Path, seed: int = 0, features: int = 16) -> str:
    """A small static ONNX model (MatMul → Add → Relu, input [1, features]); returns its sha256."""
    import hashlib

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array((rng.standard_normal((features, 8)) * 0.3).astype(np.float32), "w")
    b = numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "b")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Add", ["h", "b"], ["z"]),
            helper.make_node("Relu", ["z"], ["y"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="trtforge")
    model.ir_version = 8
    data = model.SerializeToString()
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


class OperatorEnv:
    """A build namespace, tenant namespaces and a running operator scoped to them, on the test bed."""

    def __init__(
        self,
        tb: Any,
        workdir: Path,
        tenants: Sequence[str],
        *,
        build_ns: str | None = None,
        cache_group: str | None = None,
        brokers: int = 0,
        **config: Any,
    ) -> None:
        """`cache_group`: label every tenant namespace into this cache group (the default sharing
        policy, `groups`, then lets them share engines). `brokers`: run that many standalone brokers
        (`trtforge broker`, self.brokers) instead of the one inside the operator; runtime pods get
        their endpoints as a list."""
        import secrets

        self.tb = tb
        self.workdir = workdir
        self.suffix = secrets.token_hex(3)
        self.build_ns = build_ns or f"trtforge-build-{self.suffix}"
        self.tenants = list(tenants)
        self.api = tb.api_client()
        install_crds(tb)
        self.store_dir, self.models_dir = prepare_build_namespace(self.api, self.build_ns)
        self.pvs: list[str] = []
        for ns in self.tenants:
            ensure_namespace(self.api, ns)
            if cache_group:
                label_namespace(self.api, ns, {CACHE_GROUP_LABEL: cache_group})
            # Each tenant's own `models` claim; in the test bed they share one directory of models.
            self.pvs.append(tenant_models_claim(self.api, ns, self.models_dir))
        workdir.mkdir(parents=True, exist_ok=True)
        ports = free_ports(brokers)
        if brokers:
            config["broker"] = {
                **config.get("broker", {}),
                "enabled": False,
                "endpoints": [f"http://127.0.0.1:{p}" for p in ports],
            }
        self.config_path = workdir / f"operator-{self.suffix}.yaml"
        self.config = write_config(
            self.config_path,
            build_ns=self.build_ns,
            namespaces=[*self.tenants, self.build_ns],
            store_dir=self.store_dir,
            **config,
        )
        self.op = OperatorProcess(self.config_path, tb.kubeconfig, workdir / f"operator-{self.suffix}.log")
        self.brokers = [
            OperatorProcess(
                self.config_path,
                tb.kubeconfig,
                workdir / f"broker-{i}-{self.suffix}.log",
                command=("broker", "--port", str(p)),
            )
            for i, p in enumerate(ports)
        ]

    def start(self) -> None:
        for b in self.brokers:
            b.start()
        self.op.start()

    def apply(self, obj: dict[str, Any] | str, namespace: str) -> None:
        text = obj if isinstance(obj, str) else yaml.safe_dump(obj)
        self.tb.kubectl("apply", "-n", namespace, "-f", "-", input=text)

    def get(self, plural: str, ns: str, name: str) -> dict[str, Any]:
        return get_custom(self.api, plural, ns, name)

    def jobs(self) -> list[Any]:
        batch: Any = client.BatchV1Api(self.api)
        return list(
            batch.list_namespaced_job(
                self.build_ns, label_selector="app.kubernetes.io/managed-by=trtforge-operator"
            ).items
        )

    def pods(self, ns: str, selector: str = "") -> list[Any]:
        core: Any = client.CoreV1Api(self.api)
        return list(core.list_namespaced_pod(ns, label_selector=selector).items)

    def node_labels(self, node: str) -> dict[str, str]:
        core: Any = client.CoreV1Api(self.api)
        return dict(core.read_node(node).metadata.labels or {})

    def wait_true(
        self, plural: str, ns: str, name: str, cond: str = "Ready", timeout: float = 180
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            obj = self.get(plural, ns, name)
            stalled = condition(obj, "Stalled")
            if cond != "Stalled" and stalled and stalled.get("status") == "True":
                raise AssertionError(f"{plural} {ns}/{name} is Stalled: {stalled.get('message')}")
            return obj if is_true(obj, cond) else None

        try:
            found: dict[str, Any] | None = wait_for(
                check, timeout=timeout, desc=f"{plural} {ns}/{name} {cond}", ignore=(ApiException,)
            )
        except TimeoutError as e:
            raise AssertionError(f"{e}\n--- operator log tail:\n{self.op.tail()}") from e
        assert found is not None
        return found

    @contextlib.contextmanager
    def tenant_with_tiny_engine(self, test_id: str, gpu: str) -> Iterator[str]:
        """One of the tenant namespaces, taken for a test (`test_id`, e.g. pytest's node id): a Ready
        one-target TRTEngine `tiny` for `gpu` of a model of its own; its InferenceDeployments and
        TRTEngines are deleted (finalizers run) when the block ends."""
        ns = self.tenants.pop(0)
        digest = hashlib.sha256(test_id.encode()).hexdigest()
        name = f"m-{digest[:16]}"
        sha = tiny_model(self.models_dir / f"{name}.onnx", seed=int(digest[:8], 16))
        self.apply(engine_manifest("tiny", sha, [{"gpu": gpu}], model=f"pvc://models/{name}.onnx"), ns)
        self.wait_true("trtengines", ns, "tiny", timeout=240)
        try:
            yield ns
        finally:
            co: Any = client.CustomObjectsApi(self.api)
            for plural in ("inferencedeployments", "trtengines"):
                for o in co.list_namespaced_custom_object("trtforge.io", "v1alpha1", ns, plural)["items"]:
                    delete_with_cleanup(self.api, ns, plural, o["metadata"]["name"])

    def close(self) -> None:
        """Delete our resources while the operator runs (finalizers), then stop it; drop the namespaces."""
        core: Any = client.CoreV1Api(self.api)
        delete_resources(self.api, self.tenants, finalizer_wait_s=30 if self.op.alive() else 0)
        self.op.stop()
        for b in self.brokers:
            b.stop()
        for ns in [*self.tenants, self.build_ns]:
            try:
                core.delete_namespace(ns)
            except ApiException:
                pass
        for pv in self.pvs:
            try:
                core.delete_persistent_volume(pv)
            except ApiException:
                pass
        self.api.close()


def engine_manifest(
    name: str,
    sha256: str | None,
    targets: Sequence[dict[str, Any]],
    model: str = "pvc://models/tiny.onnx",
    precision: str = "fp32",
) -> dict[str, Any]:
    m: dict[str, Any] = {"uri": model}
    if sha256:
        m["sha256"] = sha256
    return {
        "apiVersion": "trtforge.io/v1alpha1",
        "kind": "TRTEngine",
        "metadata": {"name": name},
        "spec": {"model": m, "precision": precision, "targets": list(targets)},
    }


def deployment_manifest(name: str, engine: str, replicas: int = 1, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "trtforge.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": name},
        "spec": {"engineRef": {"name": engine}, "replicas": replicas, **spec},
    }
