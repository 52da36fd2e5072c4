"""The NVML probe on a real GPU. Skipped where NVML does not initialise (no NVIDIA driver)."""

from __future__ import annotations

import pytest

from trtforge.contract.gpu import product_label
from trtforge.contract.gpu_probe import GPUProbeError, NVMLProbe, probe_identity


@pytest.fixture
def nvml() -> NVMLProbe:
    try:
        probe = NVMLProbe()
    except (ImportError, GPUProbeError) as e:
        pytest.skip(f"no NVIDIA GPU here: {e}")
    yield probe
    probe.close()


@pytest.mark.gpu
def test_nvml_reports_the_real_gpu(nvml: NVMLProbe) -> None:
    devices = nvml.devices()
    assert devices, "NVML initialised but reported no device"
    d = devices[0]
    assert d.uuid.startswith(("GPU-", "MIG-"))
    assert d.memory_mib > 1024
    assert d.sm_count > 0
    major, minor = (int(x) for x in d.compute_capability.split("."))
    assert major >= 7 and minor >= 0
    assert d.product == product_label(d.name.split(" MIG ")[0])
    assert probe_identity(nvml).product == d.product


@pytest.mark.gpu
def test_nvml_fault_events_register_and_time_out_quietly(nvml: NVMLProbe) -> None:
    assert nvml.wait_for_fault(0.5) is None
