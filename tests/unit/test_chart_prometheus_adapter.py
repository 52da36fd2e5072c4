"""The chart's prometheus-adapter rules: optional, and they serve exactly the metrics the operator's
HPAs ask for, from series the runtime exports."""

from __future__ import annotations

import re

import yaml
from test_chart_helpers import TEMPLATES, skeleton
from trtforge_operator.api import CUSTOM_METRIC_NAMES
from trtforge_runtime.llm import server_metrics
from trtforge_runtime.serving.metrics import Metrics, exposition

TEMPLATE = TEMPLATES / "prometheus-adapter-rules.yaml"


def test_rules_are_optional() -> None:
    text = TEMPLATE.read_text()
    assert text.startswith("{{- if .Values.metrics.prometheusAdapter.enabled }}")
    values = yaml.safe_load((TEMPLATES.parent / "values.yaml").read_text())
    assert values["metrics"]["prometheusAdapter"] == {"enabled": False, "rateWindow": "1m"}


def test_rules_serve_the_metrics_the_hpas_ask_for_from_the_runtimes_series() -> None:
    (cm,) = skeleton(TEMPLATE.read_text())
    assert cm["kind"] == "ConfigMap"
    rules = yaml.safe_load(cm["data"]["config.yaml"])["rules"]
    served = {r["name"]["as"] for r in rules}
    assert served == set(CUSTOM_METRIC_NAMES.values())
    exported = {
        ln.split("{")[0].split(" ")[0]
        for ln in exposition(_metrics()).decode().splitlines()
        if ln and not ln.startswith("#")
    }
    # An LLM pod's gauges, read from its server's metrics (trtllm-serve's KV-cache use among them).
    exported |= {name for sources in server_metrics.SOURCES.values() for name in sources}
    for r in rules:
        series = r["seriesQuery"].split("{")[0].strip("'")
        assert series in exported, f"{series} is not a series the runtime exports"
        assert re.fullmatch(r["name"]["matches"], series)
        overrides = r["resources"]["overrides"]
        assert overrides == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        assert "<<.LabelMatchers>>" in r["metricsQuery"] and "by (<<.GroupBy>>)" in r["metricsQuery"]
    (rate,) = [r for r in rules if r["name"]["as"] == "trtforge_runtime_requests_per_second"]
    assert "rate(" in rate["metricsQuery"]


def _metrics() -> Metrics:
    from trtforge_runtime.serving.metrics import Outcome

    m = Metrics("m")
    m.in_flight_m.set(1)
    m.queue_depth_m.set(1)
    m.observe_request(Outcome.SUCCESS, 0.001)
    return m
