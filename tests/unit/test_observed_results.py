"""What finished build and verify pods reported is parsed once, into the pod's view (observe/views.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from trtforge_operator.observe.views import JobView, PodView

from trtforge.contract.build_result import BuildFailure, BuildResult


def pod(exit_code: int | None, message: str = "", reason: str = "") -> dict[str, Any]:
    state: dict[str, Any] = {"running": {}}
    if exit_code is not None:
        state = {"terminated": {"exitCode": exit_code, "message": message, "reason": reason}}
    return {
        "metadata": {"name": "p", "namespace": "trtforge-builds"},
        "status": {"phase": "Running", "containerStatuses": [{"name": "build", "state": state}]},
    }


RESULT = json.dumps(
    {
        "key": "k1",
        "uri": "u",
        "manifestUri": "m",
        "sha256": "s",
        "sizeBytes": 1,
        "backend": "onnxruntime",
        "backendVersion": "1",
        "computeCapability": "9.0",
        "gpu": "g",
        "buildSeconds": 1.0,
        "totalSeconds": 2.0,
        "cacheHit": False,
    }
)
FAILURE = '{"error": "model does not parse", "reason": "InvalidModel", "exitCode": 3}'


@pytest.mark.parametrize(
    ("body", "kind", "detail"),
    [
        (pod(None), None, None),
        (pod(0, "log line\n" + RESULT), BuildResult, "k1"),
        (pod(3, FAILURE), BuildFailure, "InvalidModel"),
        (pod(137, "", "OOMKilled"), BuildFailure, "OOMKilled"),
        (pod(1, "Traceback ...\nRuntimeError: boom"), BuildFailure, "RuntimeError: boom"),
    ],
)
def test_a_build_pods_result_is_parsed_with_the_pod(
    body: dict[str, Any], kind: type | None, detail: str | None
) -> None:
    reported = PodView.from_build_pod(body).reported
    assert (type(reported) if reported is not None else None) is kind
    if isinstance(reported, BuildResult):
        assert reported.key == detail
    elif isinstance(reported, BuildFailure):
        assert detail in (reported.reason, reported.error)
    assert PodView.from_k8s(body).reported is None, "other pods carry no parsed result"


@pytest.mark.parametrize(
    ("body", "failed"),
    [(pod(None), False), (pod(0, RESULT), False), (pod(3, FAILURE), True), (pod(2, "no json here"), True)],
)
def test_a_verify_pod_reports_only_a_failure(body: dict[str, Any], failed: bool) -> None:
    reported = PodView.from_verify_pod(body).reported
    assert isinstance(reported, BuildFailure) is failed and (reported is None) is not failed


def test_a_job_uses_its_pods_result_until_it_carries_its_own() -> None:
    reported = PodView.from_build_pod(pod(0, RESULT)).reported
    bare = JobView(name="j", namespace="trtforge-builds", labels={}, annotations={})
    assert bare.result() is None and not bare.recorded
    seen = JobView(name="j", namespace="trtforge-builds", labels={}, annotations={}, reported=reported)
    assert (seen.result() or {}).get("key") == "k1" and not seen.recorded


GATE = json.dumps(
    {
        "error": "accuracy gate: perplexity 23.0856 against the source's 19.9618",
        "reason": "ValidationFailed",
        "exitCode": 96,
        "perplexity": {"source": 19.9618, "result": 23.0856, "increase": 0.1565, "maxIncrease": 0.01},
    }
)


def test_a_quantize_pods_gate_refusal_keeps_both_figures_on_the_job() -> None:
    from trtforge.contract.llm.result import QuantizeFailure

    reported = PodView.from_build_pod(pod(96, "log\n" + GATE)).reported
    assert isinstance(reported, QuantizeFailure) and reported.perplexity is not None
    recorded = json.loads(reported.to_line())  # what RecordResult writes onto the Job
    assert recorded["perplexity"] == {
        "source": 19.9618,
        "result": 23.0856,
        "increase": 0.1565,
        "maxIncrease": 0.01,
    }
    assert type(PodView.from_build_pod(pod(3, FAILURE)).reported) is BuildFailure  # others as before
