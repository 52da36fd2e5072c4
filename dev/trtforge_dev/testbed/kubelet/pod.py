"""One pod's life on an emulated node, in its own thread: admit (address, GPUs) → volumes → init
containers in order → containers (probes, restarts with back-off) → status → graceful deletion.
"""

from __future__ import annotations

import base64
import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from trtforge.contract.gpu_probe import PROBE_ENV, VISIBLE_ENV
from trtforge.logs import fields
from trtforge_dev.testbed import gpus
from trtforge_dev.testbed.kubelet.context import KubeletContext
from trtforge_dev.testbed.kubelet.podspec import (
    ConfigError,
    command_line,
    container_env,
    image_stand_in,
    pod_phase,
    will_restart,
)
from trtforge_dev.testbed.kubelet.probes import Prober
from trtforge_dev.testbed.kubelet.process import ContainerProcess
from trtforge_dev.testbed.kubelet.volumes import Mount, NotReady, VolumeBuilder, container_mounts
from trtforge_dev.testbed.podlogs import log_name

log = logging.getLogger(__name__)

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0
BACKOFF_RESET_AFTER_S = 60.0
TICK_S = 0.1
# A failed API call (apiserver down, restarting, overloaded) is retried, never fatal: as a kubelet's
# pod workers do, the pod keeps running and its status is written once the apiserver answers again.
API_ERRORS: tuple[type[BaseException], ...] = (ApiException, urllib3.exceptions.HTTPError, OSError)
API_RETRY_START_S = 0.5
API_RETRY_MAX_S = 5.0


def api_retry_delay(failures: int) -> float:
    """Seconds before the next try after `failures` failed API calls in a row (doubling, capped)."""
    if failures <= 0:
        return 0.0
    return min(API_RETRY_START_S * 2 ** (failures - 1), API_RETRY_MAX_S)


def transient(e: BaseException) -> bool:
    """An API error worth retrying: no answer at all, or 429/5xx. A 4xx answer is final."""
    if isinstance(e, ApiException):
        return e.status is None or e.status == 0 or e.status == 429 or e.status >= 500
    return isinstance(e, API_ERRORS)


def now_iso(t: float | None = None) -> str:
    dt = datetime.fromtimestamp(time.time() if t is None else t, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_dir_name(ns: str, name: str, uid: str) -> str:
    return f"{ns}_{name}_{uid}"


@dataclass
class Container:
    spec: dict[str, Any]
    init: bool
    proc: ContainerProcess | None = None
    state: str = "waiting"
    reason: str = "ContainerCreating"
    message: str = ""
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    restarts: int = 0
    last: dict[str, Any] | None = None
    ready: bool = False
    started: bool = False
    next_start: float = 0.0
    backoff: float = BACKOFF_START_S
    env: dict[str, str] = field(default_factory=dict)
    readiness: Prober | None = None
    liveness: Prober | None = None
    startup: Prober | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def terminated(self) -> dict[str, Any]:
        code = self.exit_code or 0
        return {
            "exitCode": code,
            "reason": self.reason or ("Completed" if code == 0 else "Error"),
            "message": self.message or None,
            "startedAt": now_iso(self.started_at),
            "finishedAt": now_iso(self.finished_at),
        }

    def status(self, uid: str) -> dict[str, Any]:
        st: dict[str, Any]
        if self.state == "running":
            st = {"running": {"startedAt": now_iso(self.started_at)}}
        elif self.state == "terminated":
            st = {"terminated": self.terminated()}
        else:
            st = {"waiting": {"reason": self.reason, "message": self.message or None}}
        out: dict[str, Any] = {
            "name": self.name,
            "ready": self.ready,
            "restartCount": self.restarts,
            "state": st,
            "image": self.spec.get("image") or "none",
            "imageID": "",
            "started": self.state == "running" and self.started,
            "lastState": self.last or {},
        }
        if self.proc is not None:
            out["containerID"] = f"trtforge://{uid}/{self.name}/{self.restarts}"
        return out


class PodWorker(threading.Thread):
    """Runs one pod. `update()` feeds it the latest object; `kill()` ends it without API writes."""

    def __init__(self, ctx: KubeletContext, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.ctx = ctx
        self.pod = pod
        self.uid: str = meta["uid"]
        self.ns: str = meta["namespace"]
        self.pod_name: str = meta["name"]
        self.node: str = pod["spec"]["nodeName"]
        self.core: Any = client.CoreV1Api(ctx.api)
        self.dir = ctx.paths.pods / pod_dir_name(self.ns, self.pod_name, self.uid)
        self.deleting = threading.Event()
        self.killed = threading.Event()
        self.finished = threading.Event()
        self.lock = threading.Lock()
        self.ip = ""
        self.gpu_uuids: list[str] = []
        self.init_containers = [Container(c, True) for c in pod["spec"].get("initContainers") or []]
        self.containers = [Container(c, False) for c in pod["spec"]["containers"]]
        self.policy: str = pod["spec"].get("restartPolicy") or "Always"
        self.init_done = not self.init_containers
        self.init_failed = False
        self.phase = "Pending"
        self.pod_reason: str | None = None
        self.pod_message: str | None = None
        self.start_time = time.time()
        self.last_status: dict[str, Any] | None = None
        self.status_failures = 0  # failed status writes in a row
        self.status_retry_at = 0.0
        self.volumes: dict[str, Path] = {}

    # --- called from the dispatcher thread -------------------------------------------------------
    def update(self, pod: dict[str, Any]) -> None:
        with self.lock:
            self.pod = pod
        if pod["metadata"].get("deletionTimestamp"):
            self.deleting.set()

    def container_running(self, name: str) -> bool:
        return any(c.name == name and c.state == "running" for c in self.init_containers + self.containers)

    def kill(self) -> None:
        """Node down or the pod vanished: end every process now, write nothing to the API."""
        self.killed.set()

    # --- the pod's life --------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._run()
        except Exception:
            log.exception("pod worker failed", extra=fields(pod=f"{self.ns}/{self.pod_name}"))
            self._stop_all(0)
        finally:
            self._release()
            self.finished.set()

    def _stopped(self) -> bool:
        return self.killed.is_set() or self.ctx.stopping.is_set()

    def _run(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        prev = self.pod.get("status") or {}
        self.ip = self.ctx.ips.acquire(self.uid, prefer=prev.get("podIP"))
        if not self._admit():
            return self._finish_deletion_when_asked()
        if self._recover(prev):
            return self._finish_deletion_when_asked()
        self._push_status()
        while not self._prepare_volumes():
            if self._stopped() or self.deleting.is_set():
                return self._terminate()
            time.sleep(1.0)
        while not self._stopped() and not self.deleting.is_set():
            self._step()
            self._push_status()
            if self.phase in ("Succeeded", "Failed"):
                self._release()
                break
            time.sleep(TICK_S)
        self._terminate()

    def _recover(self, prev: dict[str, Any]) -> bool:
        """A pod that already ran here before its node (or this kubelet) restarted: with restartPolicy
        Never it has failed (returns True); otherwise its containers start again, counted as restarts."""
        before = {s["name"]: s for s in prev.get("containerStatuses") or []}
        ran = [s for s in before.values() if set(s.get("state") or {}) & {"running", "terminated"}]
        if not ran:
            return False
        self.init_done = True
        for c in self.containers:
            old = before.get(c.name) or {}
            c.restarts = int(old.get("restartCount") or 0)
            if set(old.get("state") or {}) & {"running", "terminated"}:
                c.last = {"terminated": {"exitCode": 137, "reason": "Error", "message": "the node restarted"}}
                c.restarts += 1
        if self.policy != "Never":
            return False
        for c in self.containers:
            c.state, c.exit_code, c.reason, c.message = "terminated", 137, "Error", "the node restarted"
            c.started_at = c.finished_at = time.time()
        self.phase, self.pod_reason, self.pod_message = "Failed", "NodeRestarted", "the node restarted"
        self._push_status()
        return True

    def _admit(self) -> bool:
        wanted: dict[str, int] = {}
        for c in self.init_containers + self.containers:
            res = c.spec.get("resources") or {}
            req = gpus.gpu_requests(res.get("limits") or res.get("requests"))
            for k, v in req.items():
                wanted[k] = max(wanted.get(k, 0), v) if c.init else wanted.get(k, 0) + v
        try:
            assert self.ctx.gpus is not None
            devices = self.ctx.gpus.allocate(self.node, self.uid, wanted)
        except gpus.AllocationError as e:
            self.phase, self.pod_reason, self.pod_message = "Failed", "UnexpectedAdmissionError", str(e)
            self._push_status()
            log.warning("pod rejected", extra=fields(pod=f"{self.ns}/{self.pod_name}", reason=str(e)))
            return False
        self.gpu_uuids = [d.uuid for d in devices]
        return True

    def _gpu_env(self) -> dict[str, str]:
        gpu_file = self.ctx.paths.gpu_file(self.node)
        if not gpu_file.is_file():
            return {}
        return {
            PROBE_ENV: f"emulated:{gpu_file.resolve()}",
            VISIBLE_ENV: ",".join(self.gpu_uuids) if self.gpu_uuids else "void",
        }

    def _prepare_volumes(self) -> bool:
        try:
            self.volumes = VolumeBuilder(self.ctx.api, self.pod, self.dir, self.ip).build()
            return True
        except NotReady as e:
            for c in self.init_containers + self.containers:
                c.reason, c.message = "ContainerCreating", str(e)
            self._push_status()
            return False
        except API_ERRORS as e:
            if not transient(e):
                raise
            log.warning(
                "volumes: API unavailable, retrying",
                extra=fields(pod=f"{self.ns}/{self.pod_name}", error=str(e)[:200]),
            )
            return False

    # --- containers ----------------------------------------------------------------------------
    def _lookup(self, kind: str, name: str, optional: bool) -> dict[str, str] | None:
        try:
            if kind == "secret":
                s = self.core.read_namespaced_secret(name, self.ns)
                return {k: base64.b64decode(v).decode() for k, v in (s.data or {}).items()}
            cm = self.core.read_namespaced_config_map(name, self.ns)
            return dict(cm.data or {})
        except ApiException as e:
            if e.status == 404:
                if optional:
                    return None
                raise ConfigError(f'{kind} "{name}" not found') from e
            raise

    def _start(self, c: Container) -> None:
        home = self.dir / "home"
        home.mkdir(parents=True, exist_ok=True)
        base = self.ctx.base_env(self.uid, self.pod_name, self.ip, home)
        base.update(self._gpu_env())
        try:
            env = image_stand_in(container_env(self.pod, c.spec, base, self.ip, self._lookup))
            argv = command_line(c.spec, env)
            mounts = container_mounts(c.spec, self.volumes)
        except (ConfigError, NotReady) as e:
            c.state, c.reason, c.message = "waiting", "CreateContainerConfigError", str(e)
            c.next_start = time.time() + 1.0
            return
        except API_ERRORS as e:
            if not transient(e):
                raise
            c.state, c.reason, c.message = "waiting", "CreateContainerConfigError", "API unavailable"
            c.next_start = time.time() + 1.0
            return
        cdir = self.dir / "containers" / c.name
        cdir.mkdir(parents=True, exist_ok=True)
        term = cdir / "termination-log"
        term.write_text("")
        term_path = c.spec.get("terminationMessagePath") or "/dev/termination-log"
        mounts = [*mounts, Mount(source=term, target=term_path, read_only=False)]
        log_path = self.dir / "logs" / log_name(c.name)
        if c.restarts and log_path.exists():
            log_path.replace(log_path.with_name(log_name(c.name, previous=True)))
        c.env = env
        c.proc = ContainerProcess(
            argv,
            env,
            Path(c.spec.get("workingDir") or home),
            mounts,
            log_path,
            keep_visible=self.ctx.host_paths(),
        )
        c.state, c.reason, c.message, c.exit_code = "running", "", "", None
        c.started_at, c.finished_at = c.proc.started_at, None
        c.ready = False
        started_at = c.proc.started_at
        c.startup = (
            Prober(c.spec["startupProbe"], c.spec, self.ip, env, started_at)
            if c.spec.get("startupProbe")
            else None
        )
        c.started = c.startup is None
        c.readiness = (
            Prober(c.spec["readinessProbe"], c.spec, self.ip, env, started_at)
            if c.spec.get("readinessProbe") and not c.init
            else None
        )
        c.liveness = (
            Prober(c.spec["livenessProbe"], c.spec, self.ip, env, started_at)
            if c.spec.get("livenessProbe") and not c.init
            else None
        )
        log.info(
            "container started",
            extra=fields(
                pod=f"{self.ns}/{self.pod_name}", container=c.name, pid=c.proc.pid, node=self.node, ip=self.ip
            ),
        )

    def _exited(self, c: Container, code: int, reason: str | None = None) -> None:
        c.state, c.exit_code, c.finished_at = "terminated", code, time.time()
        c.ready = False
        c.reason = reason or ("Completed" if code == 0 else "Error")
        msg = ""
        term = self.dir / "containers" / c.name / "termination-log"
        try:
            msg = term.read_text(errors="replace")[:4096]
        except OSError:
            pass
        if not msg and code != 0 and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            try:
                lines = (self.dir / "logs" / log_name(c.name)).read_text(errors="replace").splitlines()
                msg = "\n".join(lines[-80:])[-2048:]
            except OSError:
                pass
        c.message = msg
        ran = (c.finished_at or 0) - (c.started_at or 0)
        if ran >= BACKOFF_RESET_AFTER_S:
            c.backoff = BACKOFF_START_S
        log.info(
            "container exited",
            extra=fields(pod=f"{self.ns}/{self.pod_name}", container=c.name, exit_code=code),
        )

    def _maybe_restart(self, c: Container) -> None:
        """A terminated container that policy restarts: wait out its back-off, then start it again."""
        if c.state != "terminated" or not will_restart(self.policy, c.exit_code or 0):
            return
        self._restart_after_backoff(c)

    def _watch(self, c: Container) -> None:
        """Exit and probes of a running container."""
        if c.proc is None or c.state != "running":
            return
        code = c.proc.poll()
        if code is not None:
            self._exited(c, code)
            return
        if c.startup is not None and not c.started:
            verdict = c.startup.tick(c.proc.pid)
            if verdict is True:
                c.started = True
            elif verdict is False:
                self._exited(c, c.proc.stop(self._grace()), "Error")
                c.message = "startup probe failed"
            return
        if c.liveness is not None and c.liveness.tick(c.proc.pid) is False:
            code = c.proc.stop(self._grace())
            self._exited(c, code, "Error")
            c.message = c.message or "liveness probe failed"
            return
        c.ready = c.readiness.tick(c.proc.pid) is True if c.readiness is not None else True

    def _step(self) -> None:
        now = time.time()
        if not self.init_done:
            for c in self.init_containers:
                if c.state == "terminated" and c.exit_code == 0:
                    continue
                if c.proc is None and c.state == "waiting":
                    if now >= c.next_start:
                        self._start(c)
                    return
                self._watch(c)
                if c.state == "terminated" and c.exit_code != 0:
                    if self.policy == "Never":
                        self.init_failed = True
                        self.phase = "Failed"
                        return
                    self._restart_after_backoff(c)
                return
            self.init_done = True
        for c in self.containers:
            if c.proc is None and c.state == "waiting":
                if now >= c.next_start:
                    self._start(c)
                continue
            self._watch(c)
            self._maybe_restart(c)
        states = [(c.state, c.exit_code) for c in self.containers]
        self.phase = pod_phase(self.policy, self.init_done, self.init_failed, states)

    def _restart_after_backoff(self, c: Container) -> None:
        """Start a terminated container again once its back-off (doubling, capped) has passed."""
        now = time.time()
        if c.next_start == 0.0:
            c.next_start = now + c.backoff
            c.backoff = min(c.backoff * 2, BACKOFF_MAX_S)
        if now >= c.next_start:
            c.last = {"terminated": c.terminated()}
            c.restarts += 1
            c.next_start = 0.0
            self._start(c)

    # --- status ------------------------------------------------------------------------------------
    def _conditions(self) -> list[dict[str, Any]]:
        now = now_iso()
        ready = self.phase == "Running" and all(c.ready for c in self.containers)
        if self.phase == "Succeeded":
            ready = False
        old = {c["type"]: c for c in (self.pod.get("status") or {}).get("conditions") or []}

        def cond(t: str, ok: bool, reason: str | None = None) -> dict[str, Any]:
            prev = old.get(t)
            status = "True" if ok else "False"
            since = prev["lastTransitionTime"] if prev and prev.get("status") == status else now
            out = {"type": t, "status": status, "lastProbeTime": None, "lastTransitionTime": since}
            if reason and not ok:
                out["reason"] = reason
            return out

        conds = [
            cond(
                "Initialized",
                self.init_done or self.phase in ("Succeeded", "Failed"),
                "ContainersNotInitialized",
            ),
            cond("Ready", ready, "ContainersNotReady"),
            cond("ContainersReady", ready, "ContainersNotReady"),
        ]
        if "PodScheduled" in old:
            conds.append(old["PodScheduled"])
        return conds

    def _status(self) -> dict[str, Any]:
        st: dict[str, Any] = {
            "phase": self.phase,
            "conditions": self._conditions(),
            "hostIP": "127.0.0.1",
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}] if self.ip else [],
            "startTime": now_iso(self.start_time),
            "qosClass": "BestEffort",
            "containerStatuses": [c.status(self.uid) for c in self.containers],
        }
        if self.init_containers:
            st["initContainerStatuses"] = [c.status(self.uid) for c in self.init_containers]
        if self.pod_reason:
            st["reason"], st["message"] = self.pod_reason, self.pod_message
        return st

    def _push_status(self) -> None:
        """Write the status when it changed; after a failed write, retry with back-off (never raise)."""
        if self.killed.is_set():
            return
        st = self._status()
        comparable = {k: v for k, v in st.items() if k != "conditions"}
        comparable["c"] = [(c["type"], c["status"]) for c in st["conditions"]]
        if comparable == self.last_status:
            return
        if time.time() < self.status_retry_at:
            return
        try:
            obj = self.core.patch_namespaced_pod_status(self.pod_name, self.ns, {"status": st})
        except API_ERRORS as e:
            if isinstance(e, ApiException) and e.status == 404:
                return
            self.status_failures += 1
            self.status_retry_at = time.time() + api_retry_delay(self.status_failures)
            if self.status_failures == 1 or not transient(e):
                log.warning(
                    "pod status update failed; retrying",
                    extra=fields(
                        pod=f"{self.ns}/{self.pod_name}",
                        status=getattr(e, "status", None),
                        error=str(getattr(e, "body", None) or e)[:400],
                    ),
                )
            return
        with self.lock:
            self.pod = self.ctx.api.sanitize_for_serialization(obj)
        self.last_status = comparable
        if self.status_failures:
            log.info(
                "pod status written again",
                extra=fields(pod=f"{self.ns}/{self.pod_name}", failures=self.status_failures),
            )
        self.status_failures, self.status_retry_at = 0, 0.0

    # --- the end -------------------------------------------------------------------------------------
    def _grace(self) -> float:
        meta = self.pod["metadata"]
        g = meta.get("deletionGracePeriodSeconds")
        if g is None:
            g = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        return float(g if g is not None else 30)

    def _stop_all(self, grace: float) -> None:
        running = [c for c in self.init_containers + self.containers if c.proc and c.state == "running"]
        for c in running:
            assert c.proc is not None
            c.proc.signal(signal.SIGTERM)
        deadline = time.time() + grace
        for c in running:
            assert c.proc is not None
            code = c.proc.stop(max(0.0, deadline - time.time()))
            self._exited(c, code, "Error" if code else "Completed")

    def _terminate(self) -> None:
        if self.killed.is_set():
            self._stop_all(0)
            return
        if self.ctx.stopping.is_set():
            self._stop_all(2)
            return
        self._stop_all(self._grace())
        self._release()
        self._finish_deletion_when_asked()

    def _finish_deletion_when_asked(self) -> None:
        """Terminal pods wait here for deletion; then the kubelet removes the object (grace 0)."""
        while not self.deleting.is_set():
            if self._stopped():
                return
            self._push_status()  # a final status the apiserver missed (it was down) is written now
            self.deleting.wait(0.5)
        if self.killed.is_set():
            return
        failures = 0
        while not self._stopped():
            self._push_status()
            try:
                self.core.delete_namespaced_pod(
                    self.pod_name,
                    self.ns,
                    grace_period_seconds=0,
                    body=client.V1DeleteOptions(
                        grace_period_seconds=0, preconditions=client.V1Preconditions(uid=self.uid)
                    ),
                )
                log.info("pod deleted", extra=fields(pod=f"{self.ns}/{self.pod_name}"))
                return
            except API_ERRORS as e:
                if isinstance(e, ApiException) and e.status in (404, 409):
                    return
                if not transient(e):
                    log.warning("pod delete failed", extra=fields(pod=f"{self.ns}/{self.pod_name}", status=e))
                    return
                failures += 1
                if failures == 1:
                    log.warning(
                        "pod delete failed; retrying",
                        extra=fields(pod=f"{self.ns}/{self.pod_name}", error=str(e)[:200]),
                    )
                time.sleep(api_retry_delay(failures))

    def _release(self) -> None:
        assert self.ctx.gpus is not None
        self.ctx.gpus.release(self.uid)
        if self.phase in ("Succeeded", "Failed") or self.deleting.is_set() or self.killed.is_set():
            self.ctx.ips.release(self.uid)
