"""Pure parts of the test bed: waiting, the reflect2 patch, node profiles and GFD labels, GPU
allocation and faults, pod env/phase rules, the binary cache check, mount scripts."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from pydantic import ValidationError
from trtforge_dev.testbed import binaries, gpus, procs, reflect2_patch
from trtforge_dev.testbed.build import BinariesError, check_debian_packages, deb_src_entry
from trtforge_dev.testbed.gpus import allocate
from trtforge_dev.testbed.kubelet import podspec
from trtforge_dev.testbed.kubelet.process import ContainerProcess, exit_code_of, mount_script
from trtforge_dev.testbed.kubelet.volumes import Mount
from trtforge_dev.testbed.profile import (
    MIG_OVERRIDE_FILE,
    MigSpec,
    NodeProfile,
    ProfileError,
    capacity,
    effective_node,
    gpu_file,
    load_profile,
    node_labels,
    node_object,
    node_status,
)
from trtforge_dev.testbed.wait import WaitTimeout, wait_for

from trtforge.contract.gpu import KNOWN_GPUS, product_label
from trtforge.contract.gpu_probe import EmulatedGPUProbe

# --- wait_for -------------------------------------------------------------------------------------


def test_wait_for_returns_first_truthy_value() -> None:
    calls = iter([0, None, "", "yes"])
    assert wait_for(lambda: next(calls), timeout=5, interval=0.001) == "yes"


def test_wait_for_timeout_names_condition_and_last_value() -> None:
    with pytest.raises(TimeoutError) as e:
        wait_for(lambda: [], timeout=0.05, interval=0.01, desc="the pod to be Ready")
    assert "the pod to be Ready" in str(e.value) and "last observed: []" in str(e.value)
    assert isinstance(e.value, WaitTimeout)


def test_wait_for_ignores_only_listed_errors() -> None:
    with pytest.raises(WaitTimeout, match="KeyError"):
        wait_for(lambda: {}["x"], timeout=0.05, interval=0.01, ignore=(KeyError,))
    with pytest.raises(ZeroDivisionError):
        wait_for(lambda: 1 / 0, timeout=1)


# --- reflect2 ---------------------------------------------------------------------------------------
LINK = """package reflect2

//go:linkname mapiterinit reflect.mapiterinit
func mapiterinit(rtype unsafe.Pointer, m unsafe.Pointer) *hiter

type hiter struct {
	key   unsafe.Pointer // Must be in first position.
	value unsafe.Pointer // Must be in second position.
	// rest fields are ignored
}

func add() {}
"""
MAP = """func (type2 *UnsafeMapType) UnsafeIterate(obj unsafe.Pointer) MapIterator {
	return &UnsafeMapIterator{
		hiter:      mapiterinit(type2.rtype, *(*unsafe.Pointer)(obj)),
		pKeyRType:  type2.pKeyRType,
	}
}
"""


def test_reflect2_patch_is_complete_and_idempotent(tmp_path: Path) -> None:
    d = tmp_path / reflect2_patch.REL_DIR
    d.mkdir(parents=True)
    (d / "unsafe_link.go").write_text(LINK)
    (d / "unsafe_map.go").write_text(MAP)
    assert reflect2_patch.apply(tmp_path) is True
    link, m = (d / "unsafe_link.go").read_text(), (d / "unsafe_map.go").read_text()
    assert reflect2_patch.NEW_DECL in link and reflect2_patch.OLD_DECL not in link
    assert "checkBucket uintptr" in link and "func add() {}" in link
    assert "var it hiter\n\tmapiterinit(type2.rtype, *(*unsafe.Pointer)(obj), &it)" in m
    assert "hiter:      &it," in m and "pKeyRType:  type2.pKeyRType" in m
    assert reflect2_patch.apply(tmp_path) is False


def test_reflect2_patch_refuses_unknown_source(tmp_path: Path) -> None:
    d = tmp_path / reflect2_patch.REL_DIR
    d.mkdir(parents=True)
    (d / "unsafe_link.go").write_text("package reflect2\n")
    (d / "unsafe_map.go").write_text(MAP)
    with pytest.raises(reflect2_patch.PatchError, match=r"unsafe_link\.go"):
        reflect2_patch.apply(tmp_path)


# --- profiles and labels ------------------------------------------------------------------------------


def test_default_profile_nodes_and_gfd_labels() -> None:
    prof = load_profile()
    names = [n.name for n in prof.nodes]
    assert names == [
        "gpu-h100-0",
        "gpu-h100-1",
        "gpu-h100-2",
        "gpu-h100-3",
        "gpu-gh200-0",
        "gpu-b200-mig-0",
        "cpu-0",
    ]
    h100 = node_labels(prof.node("gpu-h100-0"))
    assert h100["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert (h100["nvidia.com/gpu.compute.major"], h100["nvidia.com/gpu.compute.minor"]) == ("9", "0")
    assert h100["nvidia.com/gpu.count"] == "8" and h100["kubernetes.io/arch"] == "amd64"
    assert "nvidia.com/mig.config.state" not in h100
    gh = node_labels(prof.node("gpu-gh200-0"))
    assert gh["kubernetes.io/arch"] == "arm64" and gh["nvidia.com/gpu.count"] == "1"
    b200 = node_labels(prof.node("gpu-b200-mig-0"))
    assert b200["nvidia.com/mig.strategy"] == "mixed" and b200["nvidia.com/mig.config.state"] == "success"
    assert b200["nvidia.com/mig-3g.90gb.count"] == "2" and b200["nvidia.com/mig-1g.23gb.count"] == "8"
    assert b200["nvidia.com/gpu.compute.major"] == "10"
    cpu = node_labels(prof.node("cpu-0"))
    assert not any(k.startswith("nvidia.com/") for k in cpu)


def test_gpu_file_identity_matches_labels_and_probe(tmp_path: Path) -> None:
    prof = load_profile()
    b200 = gpu_file(prof.node("gpu-b200-mig-0"))
    migs = [d for d in b200.devices if d.mig_profile == "3g.90gb"]
    assert len(migs) == 2 and migs[0].name == "NVIDIA B200 MIG 3g.90gb"
    # The emulated figures are the known-GPU table's: no SM count where NVML was never read (B200),
    # NVML's own figures where it was (H200), never g x 16.
    assert migs[0].product == "NVIDIA-B200" and migs[0].sm_count == 0
    assert "nvidia.com/mig-3g.90gb.multiprocessors" not in node_labels(prof.node("gpu-b200-mig-0"))
    h200 = KNOWN_GPUS["NVIDIA-H200"]
    assert h200.mig["1g.35gb"].sm_count == 26 and h200.mig["3g.71gb"].memory_mib == 71424
    gh = gpu_file(prof.node("gpu-gh200-0"))
    assert gh.arch == "arm64" and product_label(gh.devices[0].name) == "NVIDIA-GH200-480GB"
    f = tmp_path / "gpus.json"
    gh.write(f)
    probe = EmulatedGPUProbe(f, visible=gh.devices[0].uuid)
    assert probe.arch() == "arm64" and [d.uuid for d in probe.devices()] == [gh.devices[0].uuid]
    assert len({d.uuid for d in gpu_file(prof.node("gpu-h100-0")).devices}) == 8
    # Stable across runs, distinct across nodes.
    assert (
        gpu_file(prof.node("gpu-h100-0")).devices[0].uuid == gpu_file(prof.node("gpu-h100-0")).devices[0].uuid
    )
    assert (
        gpu_file(prof.node("gpu-h100-0")).devices[0].uuid != gpu_file(prof.node("gpu-h100-1")).devices[0].uuid
    )


def test_status_capacity_counts_all_allocatable_only_healthy() -> None:
    p = load_profile().node("gpu-b200-mig-0")
    f, _ = gpus.with_fault(gpu_file(p), 0, 79, 1.0)
    st = node_status(p, f, "2025-01-01T00:00:00Z")
    res = f.devices[0].mig_profile
    assert st["capacity"][f"nvidia.com/mig-{res}"] == str(int(st["allocatable"][f"nvidia.com/mig-{res}"]) + 1)
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in st["conditions"])


def test_bad_profile_names_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "nodes.yaml"
    bad.write_text("nodes:\n  - name: n\n    product: NVIDIA-Nope\n    gpus: 1\n")
    with pytest.raises(
        ProfileError, match=r"nodes\.yaml.*nodes\.0\.product.*unknown GPU product 'NVIDIA-Nope'"
    ):
        load_profile(bad)
    bad.write_text(
        "nodes:\n  - name: m\n    product: NVIDIA-B200\n    gpus: 1\n    mig: {layout: [{'7g.180gb': 2}]}\n"
    )
    with pytest.raises(ProfileError, match="more than 7 slices"):
        load_profile(bad)


# --- GPUs -------------------------------------------------------------------------------------------


def test_allocate_picks_healthy_free_devices_and_refuses_too_many() -> None:
    f = gpu_file(load_profile().node("gpu-h100-0"))
    f, bad = gpus.with_fault(f, 0, 79, 1.0)
    got = gpus.allocate(f, {"nvidia.com/gpu": 2}, taken={f.devices[1].uuid})
    assert [d.uuid for d in got] == [f.devices[2].uuid, f.devices[3].uuid]
    with pytest.raises(gpus.AllocationError, match=r"7 free healthy nvidia\.com/gpu, the pod asks for 8"):
        gpus.allocate(f, {"nvidia.com/gpu": 8}, taken=set())
    assert bad.uuid == f.devices[0].uuid


def test_fault_critical_vs_noncritical_and_heal(tmp_path: Path) -> None:
    f = gpu_file(load_profile().node("gpu-h100-1"))
    f2, d = gpus.with_fault(f, 2, 48, 5.0)
    assert not d.healthy and f2.devices[2].xid_events[0].xid == 48 and f.devices[2].healthy
    f3, d3 = gpus.with_fault(f2, 3, 999, 6.0)
    assert d3.healthy and f3.devices[3].xid_events[0].xid == 999
    f3, d31 = gpus.with_fault(f3, 4, 31, 6.5)  # an application's page fault: the GPU stays healthy
    assert d31.healthy and f3.devices[4].xid_events[0].xid == 31
    with pytest.raises(gpus.GPUError, match="out of range"):
        gpus.with_fault(f, 8, 79, 1.0)
    healed = gpus.healed(f3)
    assert all(x.healthy for x in healed.devices) and healed.devices[2].xid_events
    path = tmp_path / "g.json"
    f.write(path)
    probe = EmulatedGPUProbe(path, visible="all", poll_interval_s=0.01)
    gpus.update(path, lambda g: gpus.with_fault(g, None, 48, 7.0)[0])
    ev = probe.wait_for_fault(1.0)
    assert ev is not None and ev.xid == 48 and ev.gpu_uuid == f.devices[0].uuid


def test_gpu_requests_reads_nvidia_resources_only() -> None:
    assert gpus.gpu_requests({"cpu": "1", "nvidia.com/gpu": "2", "nvidia.com/mig-1g.23gb": 1}) == {
        "nvidia.com/gpu": 2,
        "nvidia.com/mig-1g.23gb": 1,
    }


# --- pod rules ----------------------------------------------------------------------------------------


def test_expand_like_kubernetes() -> None:
    env = {"A": "x", "B": "y"}
    assert podspec.expand("$(A)-$(B)-$(C)-$$(A)-$$", env) == "x-y-$(C)-$(A)-$"


def test_container_env_order_and_sources() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns", "labels": {"app": "a"}}, "spec": {"nodeName": "n1"}}
    c = {
        "name": "c",
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "s", "key": "nope", "optional": True}}},
            {"name": "BOTH", "value": "$(CM_x)/$(S)/$(POD_IP)"},
        ],
    }
    env = podspec.container_env(
        pod,
        c,
        {"POD_IP": "127.1.0.9"},
        "127.1.0.9",
        lambda kind, n, o: {"k": "sv"} if kind == "secret" else {"x": "1"},
    )
    assert env["IP"] == "127.1.0.9" and env["APP"] == "a" and env["S"] == "sv" and "OPT" not in env
    assert env["BOTH"] == "1/sv/127.1.0.9"


def test_command_needs_a_command() -> None:
    assert podspec.command_line({"name": "c", "command": ["echo"], "args": ["$(X)"]}, {"X": "1"}) == [
        "echo",
        "1",
    ]
    with pytest.raises(podspec.ConfigError, match="ignores images"):
        podspec.command_line({"name": "c", "args": []}, {})


@pytest.mark.parametrize(
    ("policy", "states", "phase"),
    [
        ("Never", [("terminated", 0), ("terminated", 0)], "Succeeded"),
        ("Never", [("terminated", 0), ("terminated", 1)], "Failed"),
        ("OnFailure", [("terminated", 1)], "Running"),
        ("Always", [("terminated", 0)], "Running"),
        ("Never", [("running", None), ("terminated", 1)], "Running"),
        ("Never", [("waiting", None)], "Pending"),
    ],
)
def test_pod_phase(policy: str, states: list[tuple[str, int | None]], phase: str) -> None:
    assert podspec.pod_phase(policy, True, False, states) == phase


def test_pod_phase_init() -> None:
    assert podspec.pod_phase("Never", False, False, [("waiting", None)]) == "Pending"
    assert podspec.pod_phase("Never", False, True, [("waiting", None)]) == "Failed"


def test_pod_ips_are_loopback_and_distinct() -> None:
    ips = [podspec.pod_ip_for(n) for n in range(600)]
    assert len(set(ips)) == 600 and ips[0] == "127.1.0.1"
    assert all(ip.startswith("127.") and not ip.endswith((".0", ".255")) for ip in ips)
    assert podspec.pod_ip_for(0, 7) == "127.7.0.1" and podspec.pod_ip_for(254, 7) == "127.7.1.1"
    with pytest.raises(ValueError, match=r"block 127\.7\.0\.0/16"):
        podspec.pod_ip_for(254 * 256, 7)


def test_two_test_beds_get_different_pod_blocks() -> None:
    """Two checkouts on one machine each run a test bed: their pods must not share addresses."""
    a, b = podspec.pod_block_for("/work/a/.cluster"), podspec.pod_block_for("/work/b/.cluster")
    assert a != b and all(1 <= x <= 254 for x in (a, b))
    assert podspec.pod_block_for("/work/a/.cluster") == a


def test_mount_script_binds_in_order_then_execs(tmp_path: Path) -> None:
    f = tmp_path / "term"
    f.write_text("")
    s = mount_script([Mount(tmp_path, "/data", True), Mount(f, "/dev/termination-log", False)])
    lines = s.splitlines()
    assert lines[-1] == 'exec "$@"'
    assert lines.index(f"exec 10<{tmp_path}") < lines.index("mkdir -p /data")
    bind = "mount --no-canonicalize --bind /proc/self/fd/10 /data"
    assert lines.index("mkdir -p /data") < lines.index(bind)
    assert "mount -o remount,bind,ro /data" in s and "exec 10<&- 11<&-" in lines[-2]
    assert exit_code_of(-15) == 143 and exit_code_of(3) == 3


def test_container_sees_its_volumes_and_the_host_paths_it_needs_under_a_shadowing_mount(
    tmp_path: Path,
) -> None:
    """An emptyDir at an ancestor of the other volumes' sources and of the project (an operator's
    runtime pod mounts /tmp; CI may clone the project under /tmp) hides neither from the container."""
    shadow = next(p for p in tmp_path.parents if p != Path("/") and p.parent == Path("/"))
    empty = tmp_path / "emptydir"
    data = tmp_path / "data"
    project = tmp_path / "project"
    for d in (empty, data, project):
        d.mkdir()
    (data / "hello").write_text("from the volume")
    (project / "code.py").write_text("from the project")
    mounts = [Mount(empty, str(shadow), False), Mount(data, "/mnt/trtforge-test-data", True)]
    argv = ["sh", "-c", f"cat /mnt/trtforge-test-data/hello; echo; cat {project}/code.py; echo; ls {shadow}"]
    proc = ContainerProcess(argv, {"PATH": "/usr/bin:/bin"}, tmp_path, mounts, tmp_path / "log", (project,))
    assert proc.proc.wait(timeout=30) == 0, (tmp_path / "log").read_text()
    out = (tmp_path / "log").read_text().splitlines()
    assert out[:2] == ["from the volume", "from the project"]
    assert out[2:] == [tmp_path.relative_to(shadow).parts[0]]  # the emptyDir, holding only the way back


# --- binaries, ports, Debian -------------------------------------------------------------------------


def test_cache_problems_detects_corruption(tmp_path: Path) -> None:
    for n in binaries.KUBE_BINARIES:
        (tmp_path / n).write_text(f"#!/bin/sh\necho {n}\n")
        (tmp_path / n).chmod(0o755)
    binaries.write_sums(tmp_path)
    assert binaries.cache_problems(tmp_path) == []
    (tmp_path / "kube-apiserver").write_text("truncated")
    assert binaries.cache_problems(tmp_path) == [
        f"{tmp_path / 'kube-apiserver'} does not match its checksum in {tmp_path / 'SHA256SUMS'}"
    ]
    (tmp_path / "kubectl").chmod(0o644)
    assert any("not executable" in p for p in binaries.cache_problems(tmp_path))
    assert binaries.cache_problems(tmp_path / "nope") == [f"{tmp_path / 'nope'} does not exist"]


def test_resolve_reports_corrupt_cache_and_what_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRTFORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    with pytest.raises(binaries.BinariesError, match=r"not installed.*trtforge cluster install"):
        binaries.resolve()
    d = binaries.cache_bin_dir()
    d.mkdir(parents=True)
    (d / "SHA256SUMS").write_text("")
    with pytest.raises(
        binaries.BinariesError, match=r"is corrupt.*run `trtforge cluster install` to rebuild"
    ):
        binaries.resolve()


def test_missing_debian_packages_say_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import trtforge_dev.testbed.build as build

    monkeypatch.setattr(build, "missing_debian_packages", lambda packages=(): ["golang-go", "rsync"])
    with pytest.raises(
        BinariesError,
        match=r"missing Debian packages: golang-go rsync\. Install them with "
        r"`sudo apt-get install -y golang-go rsync` \(or `make deps`\)",
    ):
        check_debian_packages()


def test_deb_src_entry_follows_the_binary_mirror(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
    )
    entry = deb_src_entry(tmp_path, tmp_path / "os-release")
    assert entry.startswith(
        "Types: deb-src\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
    )


def test_port_in_use_message() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(
            procs.PortInUseError, match=f"port {port} on 127.0.0.1 \\(for etcd\\) is already in use"
        ):
            procs.check_port_free(port, "etcd")
    assert procs.free_port() > 0


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = procs.free_ports(8)
    assert len(ports) == 8
    assert len(set(ports)) == 8
    socks = [socket.socket() for _ in ports]
    try:
        for s, p in zip(socks, ports, strict=True):
            s.bind(("127.0.0.1", p))  # each is free once the picker let it go
    finally:
        for s in socks:
            s.close()


def test_free_ports_are_leased_to_a_live_process_and_below_the_ephemeral_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a lease file of this test's own
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from trtforge_dev.testbed import procs; print(*procs.free_ports(4)); input()",
        ],
        env={**os.environ, "TMPDIR": str(tmp_path)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        theirs = [int(p) for p in holder.stdout.readline().split()]
        assert len(theirs) == 4 and all(p in procs.PORT_RANGE and p < low for p in theirs), theirs
        leases = tmp_path / "trtforge-port-leases.json"
        state = json.loads(leases.read_text())
        assert state["held"] == {str(p): holder.pid for p in theirs}
        leases.write_text(json.dumps({**state, "next": theirs[0]}))  # the search starts at their ports
        ours = procs.free_ports(4)
        assert not set(ours) & set(theirs), (ours, theirs)
    finally:
        holder.communicate("\n")
    assert procs.free_ports(0) == []
    held = json.loads(leases.read_text())["held"]  # their process ended: only our leases are left
    assert held == {str(p): os.getpid() for p in ours}


def test_stop_never_kills_an_unmarked_pid(tmp_path: Path) -> None:
    # Our own pid carries no marker for this root: stop() must leave it alone.
    procs.stop(os.getpid(), tmp_path, grace_s=0.1)
    assert stat.S_ISDIR(os.stat(f"/proc/{os.getpid()}").st_mode)


def test_the_pod_block_comes_from_the_environment_where_set_and_is_checked() -> None:
    assert podspec.pod_block("/work/a/.cluster", {}) == podspec.pod_block_for("/work/a/.cluster")
    assert podspec.pod_block("/work/a/.cluster", {podspec.POD_BLOCK_ENV: "17"}) == 17
    for bad in ("0", "255", "x", "-3"):
        with pytest.raises(ValueError, match=r"TRTFORGE_POD_BLOCK=.*1 to 254"):
            podspec.pod_block("/work/a/.cluster", {podspec.POD_BLOCK_ENV: bad})


def test_single_strategy_mig_node_labels_resources_and_taints() -> None:
    """A node under mig.strategy=single: GFD's slice product label, every instance a nvidia.com/gpu."""
    p = NodeProfile.model_validate(
        {
            "name": "gh200-single",
            "product": "NVIDIA-GH200-480GB",
            "gpus": 1,
            "mig": {"strategy": "single", "config": "all-3g.48gb", "layout": [{"3g.48gb": 2}]},
            "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
        }
    )
    labels = node_labels(p)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-GH200-480GB-MIG-3g.48gb"
    assert labels["nvidia.com/mig.strategy"] == "single" and labels["nvidia.com/gpu.count"] == "2"
    assert not any(k.startswith("nvidia.com/mig-") for k in labels)
    f = gpu_file(p)
    assert capacity(p, f, healthy_only=True)["nvidia.com/gpu"] == "2"
    assert [d.mig_profile for d in allocate(f, {"nvidia.com/gpu": 2}, set(), single=True)] == ["3g.48gb"] * 2
    assert node_object(p)["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    with pytest.raises(ValidationError, match="slices every GPU alike"):
        MigSpec.model_validate({"strategy": "single", "layout": [{"3g.48gb": 1, "1g.12gb": 1}]})


def test_a_mig_layout_set_on_the_running_node_overrides_the_profile(tmp_path: Path) -> None:
    base = load_profile().node("gpu-gh200-0")
    assert effective_node(base, tmp_path) == base
    (tmp_path / MIG_OVERRIDE_FILE).write_text(
        MigSpec(strategy="single", config="all-3g.48gb", layout=[{"3g.48gb": 2}]).model_dump_json()
    )
    eff = effective_node(base, tmp_path)
    assert eff.mig_single and node_labels(eff)["nvidia.com/gpu.product"] == "NVIDIA-GH200-480GB-MIG-3g.48gb"
