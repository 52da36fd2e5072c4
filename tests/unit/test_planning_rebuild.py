"""Which rebuilds a TRTEngine wants: those of the faults the operator recorded, and those its own
annotation asks for (one of its own targets, nothing more). Pure, table-driven."""

from __future__ import annotations

import json
from typing import Any

import pytest
from trtforge_operator.api import FaultRecord, TargetStatus
from trtforge_operator.observe.views import JobView, NodeView
from trtforge_operator.planning import faults
from trtforge_operator.planning.rebuild import (
    ObservedFaults,
    RebuildCause,
    RebuildRequest,
    RefusedReason,
    holds_back,
    legacy_cleanup_patch,
    plan_rebuilds,
)

from tests.fakes import default_nodes, gpu_node

NOW = 1_800_000_000.0
TTL = 600.0
H100 = "NVIDIA-H100-80GB-HBM3"
KEY_A, KEY_B = "a" * 64, "b" * 64
TARGET = "h100-80gb-hbm3"
ENGINE = "team-a/resnet"
NODES = [
    NodeView.from_k8s(n)
    for n in [gpu_node("gpu-h100-0", H100, 8, allocatable={"nvidia.com/gpu": 7}), *default_nodes()[1:]]
]


def targets(key: str | None = KEY_A) -> list[TargetStatus]:
    return [TargetStatus(name=TARGET, gpu=H100, phase="Ready", engine_key=key)]


def record(
    node: str = "gpu-h100-0", action: str = faults.FaultAction.MOVED_REBUILD, **kw: Any
) -> FaultRecord:
    return FaultRecord.model_validate(
        {"time": NOW - 5, "pod": "p-1", "node": node, "target": TARGET, "xid": 79, "action": action, **kw}
    )


FAULT = ObservedFaults("team-a/serve", (record(),))
FAULT_ID = faults.fault_id(record())
FORGED = json.dumps(
    {
        "requester": "team-a/serve",
        "target": TARGET,
        "engine_key": KEY_B,
        "fault": "f" * 8,
        "avoid_nodes": ["gpu-h100-1", "gpu-h100-2"],
    }
)


@pytest.mark.parametrize(
    ("annotations", "observed", "wanted", "refused"),
    [
        # A recorded fault: its own status's key, the faulty node avoided; nothing to refuse.
        ({}, [FAULT], [("team-a/serve", KEY_A, RebuildCause.FAULT, ("gpu-h100-0",))], []),
        # Recovered, or an action that asked for no rebuild: nothing.
        ({}, [ObservedFaults("team-a/serve", (record(recovered_seconds=3.0),))], [], []),
        (
            {},
            [ObservedFaults("team-a/serve", (record(action=faults.FaultAction.MOVED_RATE_LIMITED),))],
            [],
            [],
        ),
        # Another namespace's records never count for this engine.
        ({}, [ObservedFaults("team-b/serve", (record(),))], [], []),
        # The tenant asks for one of its own targets: that target's own key, no node avoided.
        ({"rebuild.trtforge.io/now": TARGET}, [], [(ENGINE, KEY_A, RebuildCause.ASKED, ())], []),
        ({"rebuild.trtforge.io/now": f" {TARGET}\n"}, [], [(ENGINE, KEY_A, RebuildCause.ASKED, ())], []),
        # A target it does not have, another engine's key with nodes, JSON that is no request: refused.
        ({"rebuild.trtforge.io/x": "b200"}, [], [], [RefusedReason.NOT_A_TARGET]),
        ({"rebuild.trtforge.io/x": FORGED}, [], [], [RefusedReason.NAMES_ENGINE_KEY]),
        ({"rebuild.trtforge.io/x": "{not json"}, [], [], [RefusedReason.MALFORMED]),
        ({"rebuild.trtforge.io/x": "[1]"}, [], [], [RefusedReason.NOT_A_TARGET]),
        # A forged request never changes what a real fault gets.
        (
            {"rebuild.trtforge.io/x": FORGED},
            [FAULT],
            [("team-a/serve", KEY_A, RebuildCause.FAULT, ("gpu-h100-0",))],
            [RefusedReason.NAMES_ENGINE_KEY],
        ),
        # An earlier version's record of a fault the operator still observes is that fault: no refusal.
        (
            {
                "rebuild.trtforge.io/old": json.dumps(
                    {"requester": "team-a/serve", "target": TARGET, "engine_key": KEY_A, "fault": FAULT_ID}
                )
            },
            [FAULT],
            [("team-a/serve", KEY_A, RebuildCause.FAULT, ("gpu-h100-0",))],
            [],
        ),
        # Other annotations are none of this planner's business.
        ({"example.com/rebuild": "yes"}, [], [], []),
    ],
)
def test_a_trtengine_rebuilds_only_from_recorded_faults_and_asks_for_its_own_targets(
    annotations: dict[str, str],
    observed: list[ObservedFaults],
    wanted: list[tuple[str, str, RebuildCause, tuple[str, ...]]],
    refused: list[RefusedReason],
) -> None:
    plan = plan_rebuilds(ENGINE, targets(), annotations, observed, NODES, NOW, TTL)
    assert [(r.requester, r.engine_key, r.cause, r.avoid_nodes) for r in plan.requests] == wanted
    assert [r.reason for r in plan.refused] == refused
    for r in plan.refused:  # the reason names the annotation and what is expected
        assert r.annotation in r.message and f"one of this TRTEngine's targets ({TARGET})" in r.message


def test_an_ask_for_a_target_with_no_engine_yet_waits_silently() -> None:
    plan = plan_rebuilds(ENGINE, targets(None), {"rebuild.trtforge.io/now": TARGET}, [], NODES, NOW, TTL)
    assert plan.requests == [] and plan.refused == []


def test_an_ask_never_takes_a_fault_rebuilds_job_name() -> None:
    """Whatever the annotation's name, an asked rebuild is `-rq…`, a fault's `-rb…`."""
    fault = plan_rebuilds(ENGINE, targets(), {}, [FAULT], NODES, NOW, TTL).requests[0]
    asks = [
        plan_rebuilds(
            ENGINE, targets(), {f"rebuild.trtforge.io/{name}": TARGET}, [], NODES, NOW, TTL
        ).requests[0]
        for name in ("a", FAULT_ID, "p-1")
    ]
    assert "-rb" in fault.job_name and all("-rq" in a.job_name for a in asks)
    assert fault.job_name not in {a.job_name for a in asks}


def _rebuild_job(cause: str | None, *, running: bool = True) -> JobView:
    annotations = {"trtforge.io/rebuild-cause": cause} if cause else {}
    return JobView.from_k8s(
        {
            "metadata": {
                "name": "j",
                "namespace": "build",
                "labels": {"trtforge.io/build-kind": "rebuild"},
                "annotations": annotations,
            },
            "status": {"active": 1} if running else {"succeeded": 1},
        }
    )


ASK = RebuildRequest(requester=ENGINE, target=TARGET, engine_key=KEY_A, fault="x", cause=RebuildCause.ASKED)
FAULT_REQ = RebuildRequest(requester="team-a/serve", target=TARGET, engine_key=KEY_A, fault=FAULT_ID)


@pytest.mark.parametrize(
    ("req", "running", "held_back"),
    [
        (FAULT_REQ, _rebuild_job("asked"), False),  # a tenant's rebuild never holds a fault's back
        (FAULT_REQ, _rebuild_job("fault"), True),  # one fault rebuild of an engine at a time
        (FAULT_REQ, _rebuild_job(None), True),  # a rebuild Job from before the cause was recorded
        (ASK, _rebuild_job("fault"), True),
        (ASK, _rebuild_job("asked"), True),
    ],
)
def test_a_running_rebuild_holds_back_only_what_it_should(
    req: RebuildRequest, running: JobView, held_back: bool
) -> None:
    assert holds_back(req, running) is held_back


def test_an_inferencedeployment_removes_only_its_own_old_annotation_records() -> None:
    mine = json.dumps({"requester": "team-a/serve", "target": TARGET, "engine_key": KEY_A, "fault": "1"})
    other = json.dumps({"requester": "team-a/other", "target": TARGET, "engine_key": KEY_A, "fault": "2"})
    annotations = {
        "rebuild.trtforge.io/1": mine,
        "rebuild.trtforge.io/2": other,
        "rebuild.trtforge.io/3": TARGET,
    }
    assert legacy_cleanup_patch("team-a/serve", annotations) == {"rebuild.trtforge.io/1": None}


def test_refused_annotations_show_in_a_condition_and_one_event_per_change() -> None:
    from trtforge_operator.planning.engine_conditions import REBUILD_REQUESTS, rebuild_requests_condition

    refused = plan_rebuilds(ENGINE, targets(), {"rebuild.trtforge.io/x": FORGED}, [], NODES, NOW, TTL).refused
    conds, event = rebuild_requests_condition([], [], 1, NOW, refused)
    (c,) = conds
    assert (c.type, c.status, c.reason) == (REBUILD_REQUESTS, "False", "RebuildRequestRefused")
    assert "rebuild.trtforge.io/x" in c.message and event is not None and event.type == "Warning"
    again, event2 = rebuild_requests_condition(conds, conds, 1, NOW + 1, refused)
    assert again == conds and event2 is None, "the same refusal: no second Event"
    cleared, event3 = rebuild_requests_condition(conds, conds, 1, NOW + 2, [])
    assert [(c.status, c.reason) for c in cleared] == [("True", "AsExpected")] and event3 is None
    assert rebuild_requests_condition([], [], 1, NOW, []) == ([], None), "never refused: no condition"
