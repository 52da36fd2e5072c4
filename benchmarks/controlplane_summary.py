"""The control-plane benchmark's arithmetic and tables: medians over runs, verdicts, rendering.

Each N runs several times (``--runs``, default 3), since one run's t(2000)/t(500) moved from 3.78 to
5.12 between two runs of the same commit; every time-based verdict is judged on the median of the
runs. A run that did not finish within its timeout counts as slower than any that did.

A run's time counts from its first create to its last Ready (or its last Job): what a platform team
that applies N engines at once waits for. The time after the last create is shown too, but it is the
operator's time less the creators', so it moves with how fast the 16 creating clients go, which is
faster per engine at larger N (docs/benchmarks.md §4).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from benchmarks.common import table

RUNS = 3
RATIO_GOAL = 4.4  # t(2000)/t(500), on the medians: at most this (linear would be 4)


def runs_of(cases: list[dict[str, Any]], scenario: str, n: int) -> list[dict[str, Any]]:
    return [c for c in cases if c["scenario"] == scenario and c["n"] == n]


def total_s(case: dict[str, Any]) -> float:
    """Seconds from the run's first create to done (inf: it did not finish)."""
    return math.inf if case["done_s"] is None else round(case["apply_s"] + case["done_s"], 2)


def median_s(cases: list[dict[str, Any]], scenario: str, n: int) -> float | None:
    """Median of the runs' times from the first create (inf where the median run did not finish);
    None: never run."""
    runs = runs_of(cases, scenario, n)
    if not runs:
        return None
    return float(statistics.median(total_s(c) for c in runs))


def medians(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (scenario, N): every run's time from the first create and their median, in the
    order first run."""
    keys = list(dict.fromkeys((c["scenario"], c["n"]) for c in cases))
    return [
        {
            "scenario": s,
            "n": n,
            "runs": [_shown(total_s(c)) for c in runs_of(cases, s, n)],
            "median_s": median_s(cases, s, n),
        }
        for s, n in keys
    ]


def _within(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def _shown(value: float | None) -> float | str | None:
    return "not finished" if value is not None and math.isinf(value) else value


def verdicts(cases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The control plane's targets against what was measured (met None: not measured)."""
    out: dict[str, dict[str, Any]] = {}

    def put(name: str, value: Any, ok: bool | None) -> None:
        out[name] = {"value": value, "met": ok}

    t500, t2000 = median_s(cases, "cache", 500), median_s(cases, "cache", 2000)
    put("cache N=2000 all Ready within 60 s (median)", _shown(t2000), _within(t2000, 60))
    ratio = None
    if t500 and t2000 is not None:
        ratio = t2000 / t500 if not math.isinf(t2000) else math.inf
    put(
        f"time(2000)/time(500) <= {RATIO_GOAL} (medians)",
        _shown(None if ratio is None else round(ratio, 2)),
        _within(ratio, RATIO_GOAL),
    )
    rss = [c["operator_peak_rss_mb"] for c in runs_of(cases, "cache", 2000) if c["operator_peak_rss_mb"]]
    put(
        "operator peak RSS <= 600 MB at N=2000 (highest run)",
        max(rss, default=None),
        _within(max(rss, default=None), 600),
    )
    writes = [c["quiet"]["status_writes"] for c in runs_of(cases, "cache", 2000) if c.get("quiet")]
    put(
        "zero status writes in the quiet window (N=2000, every run)",
        max(writes, default=None),
        None if not writes else max(writes) == 0,
    )
    tj = median_s(cases, "jobs", 2000)
    put("jobs N=2000: all 6000 Jobs within 90 s (median)", _shown(tj), _within(tj, 90))
    return out


def _settled(settle: dict[str, Any] | None) -> str:
    """The settle wait before a case, as a table cell ('-' for results from before it existed)."""
    if not settle:
        return "-"
    cell = f"{settle['waited_s']} ({settle['load_at_start']} -> {settle['load_at_end']})"
    return cell if settle["reason"] == "settled" else f"{cell}, timed out"


def median_run(cases: list[dict[str, Any]], scenario: str, n: int) -> dict[str, Any]:
    """The run whose time is the median (the upper middle of an even count): the row a table shows."""
    runs = sorted(runs_of(cases, scenario, n), key=total_s)
    return runs[len(runs) // 2]


def _quiet(q: dict[str, Any] | None) -> str:
    """The quiet window after a cache case as one cell: what the operator did while nothing changed."""
    if not q:
        return ""
    return (
        f"{q['seconds']} s, {q['engines']} engines: {q['status_writes']} writes,"
        f" {q['reconciles']} reconciles, {q['resource_version_changes']} RV changes,"
        f" {q.get('api_requests')} API req"
        f" (idle {q.get('api_requests_idle_baseline')}), CPU {q.get('operator_cpu_util')}"
    )


def render(results: dict[str, Any]) -> str:
    """One row per scenario and N: every run's done s, their median, and the median run's figures."""
    cases = results["cases"]
    rows = []
    for m in medians(cases):
        c = median_run(cases, m["scenario"], m["n"])
        rows.append(
            [
                c["scenario"],
                c["n"],
                c["targets"],
                _shown(m["median_s"]),
                ", ".join(str(r) for r in m["runs"]),
                c["apply_s"],
                c["done_s"],
                c.get("status_done_s") if c["scenario"] == "jobs" else "",
                c["jobs_created"],
                c["cache_hits"],
                c["operator_peak_rss_mb"],
                c["api_requests_per_engine"],
                c["status_writes"],
                c["reconciles"],
                c.get("reconcile_s_per_engine"),
                f"{c.get('loadavg_1m_before', '-')} / {c.get('loadavg_1m_after', '-')}",
                _settled(c.get("load_settle")),
                _quiet(c.get("quiet")),
            ]
        )
    cpus = results.get("machine", {}).get("cpus", "?")
    v = verdicts(cases)
    return "\n".join(
        [
            "Control plane: N TRTEngines x 3 targets created by 16 concurrent clients"
            " (cache: all from the store; jobs: all build); times count from the first create; each row"
            " shows the median run of its N",
            table(
                [
                    "scenario",
                    "N",
                    "targets",
                    "s from the first create (median)",
                    "every run's",
                    "of which creating s",
                    "after the last create s",
                    "jobs: status written s after the last create",
                    "Jobs created",
                    "cache hits",
                    "operator peak RSS MB",
                    "API req/engine",
                    "status writes",
                    "reconciles",
                    "reconcile s/engine",
                    f"load 1m before / after ({cpus} CPUs)",
                    "waited for load ≤ max (s)",
                    "quiet window after it (nothing changes)",
                ],
                rows,
            ),
            "",
            "Targets:",
            table(
                ["target", "measured", "verdict"],
                [[k, x["value"], {None: "-", True: "met", False: "missed"}[x["met"]]] for k, x in v.items()],
            ),
        ]
    )
