"""The NVML probe on a real GPU. Skipped where NVML does not initialise (no NVIDIA driver)."""

from __future__ import annotations

import pytest

from trtforge.contract.gpu import KNOWN_GPUS, product_label
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
    # The probe's reading against NVML's own, read here independently, and against the contract's
    # table where the product is one we know.
    import pynvml

    nvml_cc = pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(d.index))
    assert d.compute_capability == f"{nvml_cc[0]}.{nvml_cc[1]}"
    known = KNOWN_GPUS.get(d.product)
    if known is not None:
        assert d.compute_capability == "{}.{}".format(*known.compute_capability)
    assert d.product == product_label(d.name.split(" MIG ")[0])
    assert probe_identity(nvml).product == d.product


@pytest.mark.gpu
def test_nvml_fault_events_register_and_time_out_quietly(nvml: NVMLProbe) -> None:
    assert nvml.wait_for_fault(0.5) is None
