"""The GPU probe: which devices this process may use, and the faults they report.

One interface, three implementations, chosen by ``TRTFORGE_GPU_PROBE``:

- ``nvml`` — a real NVIDIA GPU through NVML (nvidia-ml-py): identity, and Xid/ECC events.
- ``emulated:<file>`` — the test bed's emulated GPUs: a JSON file (see :class:`EmulatedGPUFile`)
  that the test bed rewrites to inject faults. ``NVIDIA_VISIBLE_DEVICES`` selects the devices
  exactly as the NVIDIA container runtime would.
- ``none`` — no GPU (CPU targets).

Unset means ``nvml`` when NVML initialises, else ``none``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from trtforge.contract.gpu import CPU, FULL_GPU, GPUIdentity, product_label

PROBE_ENV = "TRTFORGE_GPU_PROBE"
VISIBLE_ENV = "NVIDIA_VISIBLE_DEVICES"

# Xid codes after which the GPU cannot be trusted to keep serving (docs/design.md §"GPU faults").
CRITICAL_XIDS = frozenset({46, 48, 62, 63, 64, 74, 79, 94, 95, 119, 120})
# Xids that say one application's work failed while the GPU stays healthy (what NVIDIA's device plugin
# ignores). A tenant's own request can cause them, so they must never move pods or rebuild engines.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


class XidEvent(BaseModel):
    """A GPU fault: an Xid (or an ECC event reported as its Xid, e.g. 48) on one device."""

    model_config = ConfigDict(defer_build=True)

    xid: int
    gpu_uuid: str
    time: float = Field(default_factory=time.time)
    message: str = ""


class GPUDevice(BaseModel):
    """One device as the probe sees it: a whole GPU or a MIG instance."""

    model_config = ConfigDict(defer_build=True, extra="ignore")
    index: int
    uuid: str
    name: str  # NVML name, e.g. "NVIDIA H100 80GB HBM3"
    memory_mib: int
    compute_capability: str  # "9.0"
    mig_profile: str | None = None  # set for a MIG instance
    sm_count: int = 0
    healthy: bool = True
    driver_version: str = ""
    xid_events: list[XidEvent] = Field(default_factory=list)

    @property
    def product(self) -> str:
        """The GFD product label (a MIG instance reports its parent's product)."""
        name = self.name.split(" MIG ", 1)[0]
        return product_label(name)

    def identity(self, arch: str) -> GPUIdentity:
        return GPUIdentity(
            product=self.product,
            compute_capability=self.compute_capability,
            mig_profile=self.mig_profile or FULL_GPU,
            sm_count=self.sm_count,
            memory_mib=self.memory_mib,
            arch=arch,
        )


class GPUInstanceProfile(BaseModel):
    """One MIG GPU-instance profile as NVML reports it (``nvmlDeviceGetGpuInstanceProfileInfoV``).

    NVML answers this for every profile the GPU supports even with MIG off, so the builder and
    runtime learn a slice's real SM count and memory from the driver (docs/design.md §"GPU facts").
    """

    model_config = ConfigDict(defer_build=True, frozen=True)
    index: int  # the NVML_GPU_INSTANCE_PROFILE_* value asked for
    id: int  # the profile id the driver uses (nvidia-smi mig -lgip "ID")
    name: str  # "1g.18gb" (NVML's "MIG 1g.18gb" without the prefix)
    slices: int
    instances: int
    sm_count: int
    memory_mib: int


def parse_gpu_instance_profile(index: int, info: object) -> GPUInstanceProfile:
    """A GPU-instance profile from NVML's ``c_nvmlGpuInstanceProfileInfo_v2_t`` (or anything with its
    fields): ``memorySizeMB`` is MiB, as ``nvidia-smi mig -lgip`` shows it in GiB."""
    raw = getattr(info, "name", b"")
    name = _str(raw).strip().removeprefix("MIG ").strip()
    return GPUInstanceProfile(
        index=index,
        id=int(getattr(info, "id")),  # noqa: B009 - NVML structs are read by field name
        name=name,
        slices=int(getattr(info, "sliceCount")),  # noqa: B009
        instances=int(getattr(info, "instanceCount")),  # noqa: B009
        sm_count=int(getattr(info, "multiprocessorCount")),  # noqa: B009
        memory_mib=int(getattr(info, "memorySizeMB")),  # noqa: B009
    )


class GPUProbeError(RuntimeError):
    pass


class GPUProbe(Protocol):
    """What the builder and runtime need to know about their GPUs."""

    kind: str

    def arch(self) -> str:
        """The CPU architecture of the node (`amd64`, `arm64`), as `kubernetes.io/arch` says it."""
        ...

    def devices(self) -> list[GPUDevice]:
        """The devices visible to this process."""
        ...

    def wait_for_fault(self, timeout_s: float) -> XidEvent | None:
        """Block up to `timeout_s` for a critical fault on a visible device; None if none came."""
        ...

    def close(self) -> None: ...


def host_arch() -> str:
    machine = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _visible_filter(devices: list[GPUDevice], spec: str | None) -> list[GPUDevice]:
    """Apply NVIDIA_VISIBLE_DEVICES semantics: unset/all → all, none/void/'' → none, else uuids or indices."""
    if spec is None or spec.strip() == "all":
        return devices
    spec = spec.strip()
    if spec in ("", "none", "void"):
        return []
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    out = []
    for w in wanted:
        for d in devices:
            if d.uuid == w or (w.isdigit() and d.index == int(w)):
                out.append(d)
    return out


class NoGPUProbe:
    """No GPU: a CPU node."""

    kind = "none"

    def arch(self) -> str:
        return host_arch()

    def devices(self) -> list[GPUDevice]:
        return []

    def wait_for_fault(self, timeout_s: float) -> XidEvent | None:
        time.sleep(timeout_s)
        return None

    def close(self) -> None:
        pass


class EmulatedGPUFile(BaseModel):
    """The test bed's per-node GPU file: the devices and the faults injected into them."""

    model_config = ConfigDict(defer_build=True)

    node: str
    arch: str = "amd64"  # the emulated node's kubernetes.io/arch (a GH200 node is arm64)
    devices: list[GPUDevice]

    @classmethod
    def read(cls, path: Path) -> EmulatedGPUFile:
        return cls.model_validate_json(path.read_text())

    def write(self, path: Path) -> None:
        """Atomic replace, so a probe never reads half a file."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(self.model_dump_json(indent=2))
        os.replace(tmp, path)


class EmulatedGPUProbe:
    """Reads the test bed's emulated GPU file; faults are Xid events appended to a device."""

    kind = "emulated"

    def __init__(self, path: Path, visible: str | None = None, poll_interval_s: float = 0.1) -> None:
        self.path = path
        self.visible = visible if visible is not None else os.environ.get(VISIBLE_ENV)
        self.poll_interval_s = poll_interval_s
        self._seen: set[tuple[str, int, float]] = set()
        try:
            for d in self.devices():
                self._seen.update((e.gpu_uuid, e.xid, e.time) for e in d.xid_events)
        except GPUProbeError:
            pass

    def _read(self) -> EmulatedGPUFile:
        try:
            return EmulatedGPUFile.read(self.path)
        except FileNotFoundError as e:
            raise GPUProbeError(f"emulated GPU file {self.path} does not exist") from e
        except ValueError as e:
            raise GPUProbeError(f"emulated GPU file {self.path} is not valid: {e}") from e

    def arch(self) -> str:
        return self._read().arch

    def devices(self) -> list[GPUDevice]:
        return _visible_filter(self._read().devices, self.visible)

    def wait_for_fault(self, timeout_s: float) -> XidEvent | None:
        """Faults already present when the probe was created are history, not news."""
        deadline = time.monotonic() + timeout_s
        while True:
            for d in self.devices():
                for e in d.xid_events:
                    k = (e.gpu_uuid, e.xid, e.time)
                    if k not in self._seen:
                        self._seen.add(k)
                        if e.xid in CRITICAL_XIDS:
                            return e
            if time.monotonic() >= deadline:
                return None
            time.sleep(min(self.poll_interval_s, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        pass


class NVMLProbe:
    """A real NVIDIA GPU through NVML. Untested here (no GPU); checked on the device machine."""

    kind = "nvml"

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise GPUProbeError(f"NVML did not initialise ({e}); is the NVIDIA driver present?") from e
        self._event_set = None

    def arch(self) -> str:
        return host_arch()

    def gpu_instance_profiles(self, index: int) -> list[GPUInstanceProfile]:
        """Every MIG GPU-instance profile GPU `index` supports, from the driver (works with MIG off)."""
        nv = self._nvml
        h = nv.nvmlDeviceGetHandleByIndex(index)
        out = []
        for p in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfoV(h, p)
            except nv.NVMLError:  # not supported on this GPU (or no MIG at all)
                continue
            out.append(parse_gpu_instance_profile(p, info))
        return out

    def _handles(self) -> list[tuple[int, object, GPUInstanceProfile | None]]:
        nv = self._nvml
        out: list[tuple[int, object, GPUInstanceProfile | None]] = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            try:
                current, _pending = nv.nvmlDeviceGetMigMode(h)
            except nv.NVMLError:
                current = 0
            if current:
                by_id = {p.id: p for p in self.gpu_instance_profiles(i)}
                for j in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
                    try:
                        mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                    except nv.NVMLError:
                        continue
                    gi = nv.nvmlDeviceGetGpuInstanceById(h, nv.nvmlDeviceGetGpuInstanceId(mh))
                    profile = by_id.get(int(nv.nvmlGpuInstanceGetInfo(gi).profileId))
                    if profile is None:
                        raise GPUProbeError(
                            f"MIG device {j} of GPU {i}: its GPU-instance profile is not one NVML lists"
                        )
                    out.append((i, mh, profile))
            else:
                out.append((i, h, None))
        return out

    def devices(self) -> list[GPUDevice]:
        nv = self._nvml
        driver = _str(nv.nvmlSystemGetDriverVersion())
        out = []
        for index, h, profile in self._handles():
            major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
            memory = int(nv.nvmlDeviceGetMemoryInfo(h).total) // (1024 * 1024)
            if profile is not None:  # the slice's SMs and memory from its GPU-instance profile
                sms, memory = profile.sm_count, profile.memory_mib
            else:
                sms = self._sm_count(h, major, minor)
            out.append(
                GPUDevice(
                    index=index,
                    uuid=_str(nv.nvmlDeviceGetUUID(h)),
                    name=_str(nv.nvmlDeviceGetName(h)),
                    memory_mib=memory,
                    compute_capability=f"{major}.{minor}",
                    mig_profile=profile.name if profile is not None else None,
                    sm_count=sms,
                    driver_version=driver,
                )
            )
        return out

    def _sm_count(self, handle: object, major: int, minor: int) -> int:
        """SMs of a whole GPU. Attributes are for MIG instances; whole GPUs report CUDA cores instead
        (seen on an H200: attributes NotSupported, 16896 cores = 132 SMs x 128)."""
        nv = self._nvml
        try:
            return int(nv.nvmlDeviceGetAttributes(handle).multiprocessorCount)
        except nv.NVMLError:
            pass
        try:
            cores = int(nv.nvmlDeviceGetNumGpuCores(handle))
        except nv.NVMLError:
            return 0
        per_sm = 64 if (major, minor) in ((7, 0), (7, 5), (8, 0)) else 128
        return cores // per_sm

    def wait_for_fault(self, timeout_s: float) -> XidEvent | None:
        nv = self._nvml
        if self._event_set is None:
            self._event_set = nv.nvmlEventSetCreate()
            mask = nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError
            for _i, h, _p in self._handles():
                try:
                    nv.nvmlDeviceRegisterEvents(h, mask, self._event_set)
                except nv.NVMLError_NotSupported:
                    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._event_set)
        try:
            data = nv.nvmlEventSetWait_v2(self._event_set, int(timeout_s * 1000))
        except nv.NVMLError_Timeout:
            return None
        xid = int(data.eventData) if data.eventType == nv.nvmlEventTypeXidCriticalError else 48
        uuid = _str(nv.nvmlDeviceGetUUID(data.device))
        if xid not in CRITICAL_XIDS:
            return None
        return XidEvent(xid=xid, gpu_uuid=uuid, message=f"NVML event type {data.eventType}")

    def close(self) -> None:
        nv = self._nvml
        if self._event_set is not None:
            nv.nvmlEventSetFree(self._event_set)
            self._event_set = None
        nv.nvmlShutdown()


def _str(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v


def probe_from_env(spec: str | None = None) -> GPUProbe:
    """Build the probe named by `spec` (default: ``$TRTFORGE_GPU_PROBE``)."""
    spec = spec if spec is not None else os.environ.get(PROBE_ENV, "")
    if spec == "none":
        return NoGPUProbe()
    if spec.startswith("emulated:"):
        return EmulatedGPUProbe(Path(spec.removeprefix("emulated:")))
    if spec == "nvml":
        return NVMLProbe()
    if spec == "":
        try:
            return NVMLProbe()
        except (GPUProbeError, ImportError):
            return NoGPUProbe()
    raise GPUProbeError(f"{PROBE_ENV}={spec!r} is not one of: nvml, emulated:<file>, none")


def probe_identity(probe: GPUProbe) -> GPUIdentity:
    """The identity of the first visible device, or the CPU identity when there is none."""
    devs = probe.devices()
    if not devs:
        return GPUIdentity(
            product=CPU, compute_capability="none", mig_profile=FULL_GPU, sm_count=0, arch=probe.arch()
        )
    return devs[0].identity(probe.arch())
