"""The cold-start table: medians, the spread of the starts behind them, and older result files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.coldstart import render

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _results(runs: dict[str, list[float]] | None) -> dict[str, Any]:
    serve = {"total_s": 0.5, "warm_began_s": 0.2, "to_listening_s": 0.45, "canary_s": 0.04}
    entry: dict[str, Any] = {
        "floor": {"total_s": 0.4, "read_s": 0.05, "session_s": 0.25},
        "serve_cold": serve,
        "serve_restart": {**serve, "total_s": 0.44},
        "ratio_cold": 1.25,
        "ratio_restart": 1.1,
    }
    if runs is not None:
        entry["runs"] = runs
    return {
        "model": "resnet50",
        "artifact_bytes": 102_000_000,
        "publisher": "trtforge build",
        "cpus": "0-1",
        "sources": {"pvc": entry},
        "not_measured": {},
    }


def _row(text: str, start: str) -> list[str]:
    (line,) = [ln for ln in text.splitlines() if ln.startswith("| pvc") and f"| {start}" in ln]
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_table_shows_the_spread_of_the_starts_behind_each_median() -> None:
    text = render(
        _results({"floor": [0.41, 0.38, 0.45], "cold": [0.52, 0.47, 0.55], "restart": [0.43, 0.46, 0.44]})
    )
    cold, restart = _row(text, "cold"), _row(text, "restart")
    assert cold[2:4] == ["0.5", "0.470-0.550"] and restart[2:4] == ["0.44", "0.430-0.460"]
    assert cold[-6:-4] == ["0.4", "0.380-0.450"] and cold[-1] == "1.25x"
    assert cold[-3] == "-"  # a file's floor has no S3 client


def test_the_s3_floor_shows_what_its_client_took() -> None:
    results = _results(None)
    entry = results["sources"].pop("pvc")
    entry["floor"] = {**entry["floor"], "read_s": 0.37, "client_s": 0.21}
    results["sources"]["s3"] = entry
    (line,) = [ln for ln in render(results).splitlines() if ln.startswith("| s3") and "| cold" in ln]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[-4:-2] == ["0.37", "0.21"]


def test_results_recorded_without_the_starts_still_render() -> None:
    assert _row(render(_results(None)), "restart")[3] == "-"
    assert _row(render(_results({"floor": [0.4], "cold": [0.5]})), "restart")[3] == "-"
    for name in ("coldstart.json", "coldstart-h200.json"):  # the files docs/benchmarks.md renders
        assert "| pvc" in render(json.loads((RESULTS / name).read_text()))
