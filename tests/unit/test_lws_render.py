"""The `lws` backend's pure parts (trtforge_operator.apply.lws): rendering, readiness, equality."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from trtforge_operator.apply import lws


def _w(**kw: Any) -> lws.GroupWorkload:
    base: dict[str, Any] = dict(
        name="m-mn", namespace="ns", groups=3, ranks=2,
        leader={"containers": [{"name": "runtime", "image": "i", "args": ["serve-llm", "--lws"]}]},
        worker={"containers": [{"name": "runtime", "image": "i"}]},
        labels={"app": "m"}, owner={"apiVersion": "trtforge.io/v1alpha1", "kind": "InferenceDeployment",
                                    "name": "m", "uid": "u", "controller": True},
    )  # fmt: skip
    return lws.GroupWorkload(**{**base, **kw})


def test_one_leaderworkerset_per_role_with_group_restarts_and_leader_first_startup() -> None:
    obj = lws.render(_w())
    assert (obj["apiVersion"], obj["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    spec = obj["spec"]
    assert spec["replicas"] == 3 and spec["startupPolicy"] == "LeaderCreated"
    assert spec["rolloutStrategy"] == {
        "type": "RollingUpdate", "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
    }  # fmt: skip
    t = spec["leaderWorkerTemplate"]
    assert (t["size"], t["restartPolicy"]) == (2, "RecreateGroupOnPodRestart")
    assert t["leaderTemplate"]["metadata"]["labels"] == {"app": "m", "trtforge.io/group-role": "leader"}
    assert t["workerTemplate"]["spec"]["containers"][0]["name"] == "runtime"
    assert obj["metadata"]["ownerReferences"][0]["kind"] == "InferenceDeployment"


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"ranks": 1}, "ranks 1"), ({"groups": -1}, "groups -1"), ({"max_unavailable": 0}, "not both 0")],
)
def test_wrong_numbers_are_refused_by_name(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        lws.render(_w(**kw))


def _cond(status: str, reason: str = "R") -> dict[str, Any]:
    return {"type": "Available", "status": status, "reason": reason, "message": "m"}


def test_readiness_is_the_available_condition() -> None:
    assert lws.readiness(None).reason == "Progressing"
    assert not lws.readiness({"status": {}}).ready
    assert lws.readiness({"status": {"conditions": [_cond("True")]}}) == lws.Readiness(True, "R", "m")
    assert not lws.readiness({"status": {"conditions": [_cond("False")]}}).ready
    stale = {
        "metadata": {"generation": 3},
        "status": {"observedGeneration": 2, "conditions": [_cond("True")]},
    }
    assert lws.readiness(stale) == lws.Readiness(False, "Progressing", "generation 3 not yet observed (2)")


def test_server_defaults_are_no_change_and_our_fields_are() -> None:
    expected = lws.render(_w())
    live = copy.deepcopy(expected)
    live["metadata"].update(resourceVersion="7", generation=1, labels={"app": "m", "extra": "x"})
    live["spec"]["networkConfig"] = {"subdomainPolicy": "Shared"}  # a server default
    live["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["imagePullPolicy"] = (
        "Always"
    )
    assert not lws.needs_update(expected, live)
    changed = copy.deepcopy(live)
    changed["spec"]["leaderWorkerTemplate"]["size"] = 4
    assert lws.needs_update(expected, changed)
    fewer = copy.deepcopy(live)
    fewer["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["args"] = ["serve-llm"]
    assert lws.needs_update(expected, fewer)
    relabelled = copy.deepcopy(live)
    relabelled["metadata"]["labels"] = {"app": "other"}
    assert lws.needs_update(expected, relabelled)
    assert lws.update_body(expected, live)["metadata"]["resourceVersion"] == "7"


def test_lws_without_its_crd_is_refused_with_a_clear_condition() -> None:
    assert lws.crd_refusal(True) is None
    r = lws.crd_refusal(False)
    assert r is not None and r.reason == "LeaderWorkerSetCRDMissing"
    assert "leaderworkersets.leaderworkerset.x-k8s.io" in r.message and "groupBackend native" in r.message
