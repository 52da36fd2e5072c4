"""The pure parts of benchmarks/cycles.py: reading ``perf report``'s table, and how its samples
become shares by role and code. The report text is an excerpt of a real run's, as input."""

from __future__ import annotations

import pytest

from benchmarks.cycles import (
    KINDS,
    ROLES,
    Row,
    _stat_pct,
    attribute,
    code_kind,
    parse_report,
    role_by_threads,
    share_factors,
    window_summary,
)

REPORT = """\
# To display the perf.data header info, please use --header/--header-only options.
#
# Samples: 18K of event 'cpu-clock:ppp'
#
#      Samples      Pid:Command          Shared Object
# ............  .......................  ..................................
#
          1300        0:swapper          [kernel.kallsyms]
             4    28015:memfd:sealed-91  [kernel.kallsyms]
             2    28015:memfd:sealed-91  memfd:sealed-91173221a7ea (deleted)
           490    31614:python           [kernel.kallsyms]
             7    31614:python           _asyncio.cpython-311-x86_64-linux-gnu.so
          7300    30302:trtforge         onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so
           320    30302:trtforge         libc.so.6
           640    30293:trtforge         libpython3.11.so.1.0
"""


def test_the_report_table_is_read_row_by_row_and_comments_are_skipped() -> None:
    rows = parse_report(REPORT)
    assert len(rows) == 8
    assert rows[0] == Row(1300, 0, "swapper", "[kernel.kallsyms]")
    assert rows[2] == Row(2, 28015, "memfd:sealed-91", "memfd:sealed-91173221a7ea (deleted)")
    assert rows[5].tid == 30302 and rows[5].dso.startswith("onnxruntime_pybind11_state")
    assert parse_report("# only comments\n\nnot a row\n") == []


@pytest.mark.parametrize(
    ("dso", "kind"),
    [
        ("onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so", "backend"),
        ("/opt/venv/lib/libonnxruntime.so.1.20", "backend"),
        ("[kernel.kallsyms]", "kernel"),
        ("[vdso]", "kernel"),
        ("libc.so.6", "libc"),
        ("libpython3.11.so.1.0", "python"),
        ("python3.11", "python"),
        ("_multiarray_umath.cpython-311-x86_64-linux-gnu.so", "other"),
    ],
)
def test_code_kind_by_shared_object(dso: str, kind: str) -> None:
    assert code_kind(dso) == kind


def test_samples_go_to_the_role_of_their_thread() -> None:
    role = role_by_threads(ceiling=set(), loop=30293, server={30293, 30302}, client={31614})
    acc = attribute(parse_report(REPORT), role)
    assert set(acc) == set(ROLES) and all(set(k) == set(KINDS) for k in acc.values())
    assert acc["idle"]["kernel"] == 1300
    assert acc["loop"] == {"backend": 0, "libc": 0, "python": 640, "kernel": 0, "other": 0}
    assert acc["instances"]["backend"] == 7300 and acc["instances"]["libc"] == 320
    assert acc["client"]["kernel"] == 490 and acc["client"]["other"] == 7
    assert acc["other"]["kernel"] == 4 and acc["other"]["other"] == 2
    assert acc["ceiling"] == dict.fromkeys(KINDS, 0)


def test_the_ceiling_role_wins_over_the_others() -> None:
    role = role_by_threads(ceiling={7}, loop=None, server=set(), client=set())
    assert role(Row(1, 7, "python", "x")) == "ceiling"
    assert role(Row(1, 8, "python", "x")) == "other"


def test_the_native_clients_process_is_the_client_whatever_its_thread() -> None:
    role = role_by_threads(ceiling=set(), loop=5, server={5, 6}, client={9})
    assert role(Row(1, 4242, "v2load-9fb9a560", "[kernel.kallsyms]")) == "client"
    assert role(Row(1, 4243, "python", "x")) == "other"


def test_window_summary_shares_and_backend_time_per_image() -> None:
    acc = {r: dict.fromkeys(KINDS, 0) for r in ROLES}
    acc["instances"]["backend"] = 8 * 1999  # 8 s of CPU at 1999 Hz
    acc["loop"]["python"] = 2 * 1999
    s = window_summary(acc, images=2000, cpus=2)
    assert s["backend_share_pct"] == 80.0
    assert s["backend_cpu_ms_per_image"] == 4.0  # 8 s over 2000 images
    assert s["by_role_pct"]["loop"] == 20.0 and s["by_role_pct"]["idle"] == 0.0
    assert list(s["shares_pct"]) == ["instances/backend", "loop/python"]


def test_share_factors_split_the_share_of_the_ceiling() -> None:
    ceiling = {"backend_share_pct": 96.0, "backend_cpu_ms_per_image": 3.3}
    server = {"backend_share_pct": 81.6, "backend_cpu_ms_per_image": 3.4}
    f = share_factors(server, ceiling)
    assert f["cycles_factor"] == 0.85
    assert f["speed_factor"] == pytest.approx(3.3 / 3.4, abs=1e-3)
    assert f["product"] == pytest.approx(0.85 * 3.3 / 3.4, abs=1e-3)


def test_proc_stat_split_between_two_lines() -> None:
    before = "cpu  100 0 10 50 0 0 0 0 0 0"
    after = "cpu  280 0 20 60 0 0 0 0 0 0"
    assert _stat_pct(before, after) == {"user": 90.0, "system": 5.0, "idle": 5.0}
