"""The CPUs a process may use (its affinity capped by its cgroup's CPU limit), shared by the runtime and
the builder, as pure functions over the values the kernel gives: a fake cgroup folder as the input."""

from __future__ import annotations

from pathlib import Path

from trtforge.cpus import affinity, available_cpus, cgroup_cpu_limit, effective_cpus, quota_cpus


def test_quota_from_cgroup_v2_and_v1() -> None:
    assert quota_cpus(cpu_max="max 100000") is None
    assert quota_cpus(cpu_max="400000 100000") == 4.0
    assert quota_cpus(cpu_max="150000 100000") == 1.5
    assert quota_cpus(cfs_quota_us="-1", cfs_period_us="100000") is None
    assert quota_cpus(cfs_quota_us="200000", cfs_period_us="100000") == 2.0
    assert quota_cpus() is None


def test_cgroup_files_are_read_v2_first(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path) is None  # no files: no limit
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(tmp_path) == 3.0
    (tmp_path / "cpu.max").write_text("800000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == 8.0
    (tmp_path / "cpu.max").write_text("garbage\n")  # not understood: v1, not a wrong number
    assert cgroup_cpu_limit(tmp_path) == 3.0


def test_the_limit_caps_the_affinity_rounded_up() -> None:
    assert effective_cpus(64, None) == 64
    assert effective_cpus(64, 4.0) == 4
    assert effective_cpus(64, 1.5) == 2
    assert effective_cpus(64, 0.25) == 1
    assert effective_cpus(2, 8.0) == 2  # pinned to fewer CPUs than the limit


def test_available_cpus_are_the_affinity_capped_by_the_limit(tmp_path: Path) -> None:
    assert available_cpus(tmp_path) == len(affinity())  # no files: no limit
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    assert available_cpus(tmp_path) == 1
