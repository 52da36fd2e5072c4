"""The emulated GPU probe: device selection as the NVIDIA container runtime does it, and fault events."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from trtforge.contract.gpu_probe import (
    APPLICATION_XIDS,
    CRITICAL_XIDS,
    EmulatedGPUFile,
    EmulatedGPUProbe,
    GPUDevice,
    GPUProbeError,
    XidEvent,
    probe_from_env,
    probe_identity,
)


def gpu_file(tmp_path: Path, arch: str = "amd64") -> Path:
    devices = [
        GPUDevice(
            index=i,
            uuid=f"GPU-{i}",
            name="NVIDIA H100 80GB HBM3",
            memory_mib=81559,
            compute_capability="9.0",
            sm_count=132,
        )
        for i in range(2)
    ]
    path = tmp_path / "gpus.json"
    EmulatedGPUFile(node="n", arch=arch, devices=devices).write(path)
    return path


def test_visible_devices_by_uuid_index_and_none(tmp_path: Path) -> None:
    path = gpu_file(tmp_path)
    assert [d.uuid for d in EmulatedGPUProbe(path, visible="GPU-1").devices()] == ["GPU-1"]
    assert [d.uuid for d in EmulatedGPUProbe(path, visible="0").devices()] == ["GPU-0"]
    assert EmulatedGPUProbe(path, visible="none").devices() == []
    assert len(EmulatedGPUProbe(path, visible="all").devices()) == 2


def test_identity_uses_the_emulated_node_arch(tmp_path: Path) -> None:
    probe = EmulatedGPUProbe(gpu_file(tmp_path, arch="arm64"), visible="GPU-0")
    ident = probe_identity(probe)
    assert ident.product == "NVIDIA-H100-80GB-HBM3"
    assert ident.arch == "arm64"
    assert ident.mig_profile == "full"


def test_new_fault_on_a_visible_device_is_reported_old_ones_are_not(tmp_path: Path) -> None:
    path = gpu_file(tmp_path)
    data = EmulatedGPUFile.read(path)
    data.devices[0].xid_events.append(XidEvent(xid=79, gpu_uuid="GPU-0", time=1.0))
    data.write(path)
    probe = EmulatedGPUProbe(path, visible="GPU-0", poll_interval_s=0.02)
    assert probe.wait_for_fault(0.1) is None  # history, not news

    def inject() -> None:
        time.sleep(0.1)
        d = EmulatedGPUFile.read(path)
        d.devices[0].healthy = False
        d.devices[0].xid_events.append(XidEvent(xid=48, gpu_uuid="GPU-0"))
        d.write(path)

    t = threading.Thread(target=inject)
    t.start()
    event = probe.wait_for_fault(3.0)
    t.join()
    assert event is not None and event.xid == 48 and event.gpu_uuid == "GPU-0"


def test_fault_on_another_device_is_not_ours(tmp_path: Path) -> None:
    path = gpu_file(tmp_path)
    probe = EmulatedGPUProbe(path, visible="GPU-0", poll_interval_s=0.02)
    d = EmulatedGPUFile.read(path)
    d.devices[1].xid_events.append(XidEvent(xid=79, gpu_uuid="GPU-1"))
    d.write(path)
    assert probe.wait_for_fault(0.2) is None


@pytest.mark.parametrize("xid", [999, *sorted(APPLICATION_XIDS)])
def test_non_critical_xid_is_ignored(tmp_path: Path, xid: int) -> None:
    """Unknown Xids and application Xids (a tenant's request can cause those) are not GPU faults."""
    path = gpu_file(tmp_path)
    probe = EmulatedGPUProbe(path, visible="GPU-0", poll_interval_s=0.02)
    d = EmulatedGPUFile.read(path)
    d.devices[0].xid_events.append(XidEvent(xid=xid, gpu_uuid="GPU-0"))
    d.write(path)
    assert probe.wait_for_fault(0.2) is None


def test_application_and_critical_xids_are_disjoint() -> None:
    assert not APPLICATION_XIDS & CRITICAL_XIDS


def test_probe_selection_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(GPUProbeError, match="nvml, emulated:<file>, none"):
        probe_from_env("cuda")
    missing = EmulatedGPUProbe.__new__(EmulatedGPUProbe)
    missing.path, missing.visible = tmp_path / "absent.json", None
    with pytest.raises(GPUProbeError, match="does not exist"):
        missing.devices()
    assert probe_from_env("none").devices() == []


def test_gpu_instance_profile_is_read_from_nvml_fields() -> None:
    """NVML's c_nvmlGpuInstanceProfileInfo_v2_t, as a real H200 filled it for 1g.35gb."""
    from types import SimpleNamespace

    from trtforge.contract.gpu_probe import parse_gpu_instance_profile

    info = SimpleNamespace(
        id=15, sliceCount=1, instanceCount=4, multiprocessorCount=26, memorySizeMB=33280, name=b"MIG 1g.35gb"
    )
    p = parse_gpu_instance_profile(9, info)
    assert (p.index, p.id, p.name, p.slices, p.instances, p.sm_count, p.memory_mib) == (
        9,
        15,
        "1g.35gb",
        1,
        4,
        26,
        33280,
    )
