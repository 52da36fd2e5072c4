"""The test bed's custom metrics API, its pure parts: what it reads from a runtime pod's /metrics (the
real exposition of the runtime's Metrics), the per-second rates, the quantities it answers with."""

from __future__ import annotations

from trtforge_dev.testbed.metrics_adapter import (
    METRICS,
    RATE,
    Rates,
    discovery,
    parse_pod_metrics,
    quantity,
)
from trtforge_operator.api import CUSTOM_METRIC_NAMES
from trtforge_runtime.serving.metrics import Metrics, Outcome, exposition


def test_reads_the_runtimes_own_exposition() -> None:
    m = Metrics("tiny")
    m.in_flight_m.set(3)
    m.queue_depth_m.set(2)
    for _ in range(5):
        m.observe_request(Outcome.SUCCESS, 0.001)
    m.observe_request(Outcome.BAD_REQUEST, 0.001)
    got = parse_pod_metrics(exposition(m).decode())
    assert got == {
        "trtforge_runtime_requests_in_flight": 3.0,
        "trtforge_runtime_queue_depth": 2.0,
        "trtforge_runtime_requests": 6.0,  # every outcome: what the pod was asked
    }


def test_serves_every_metric_the_operator_scales_on() -> None:
    assert set(CUSTOM_METRIC_NAMES.values()) == set(METRICS)
    assert {r["name"] for r in discovery()["resources"]} == {f"pods/{m}" for m in METRICS}
    assert RATE == "trtforge_runtime_requests_per_second"


def test_rates() -> None:
    r = Rates()
    assert r.rate("p", 100, 10.0) == 0.0  # first read: no rate yet
    assert r.rate("p", 150, 12.0) == 25.0
    assert r.rate("p", 170, 12.5) == 25.0  # too soon for a new rate: the last one
    assert r.rate("p", 190, 14.0) == 20.0
    assert r.rate("p", 3, 15.0) == 0.0  # the pod restarted: its counter began again
    assert r.rate("q", 7, 15.0) == 0.0  # each pod its own


def test_quantity_in_milli_units() -> None:
    assert quantity(2.5) == "2500m" and quantity(0) == "0m" and quantity(1 / 3) == "333m"
