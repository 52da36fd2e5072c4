"""The native group backend's Services (trtforge_operator.apply.group_services)."""

from __future__ import annotations

from trtforge_operator.apply import group_services
from trtforge_operator.planning import groups


def test_the_rank_service_names_every_rank_before_it_is_ready() -> None:
    s = group_services.rank_service("m-g0", "ns")
    assert s["metadata"]["name"] == groups.rank_identities("m", 0, groups.GroupShape(2, 8))[1].subdomain
    spec = s["spec"]
    assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
    assert spec["selector"] == {groups.LABEL_GROUP: "m-g0"}
    assert {p["port"] for p in spec["ports"]} == {groups.RANK_PORT, groups.PROBE_PORT}


def test_the_leader_service_selects_only_leaders_of_whole_groups() -> None:
    s = group_services.leader_service("m", "ns", {"trtforge.io/inferencedeployment": "m"}, [{"port": 8080}])
    assert s["spec"]["selector"] == {
        "trtforge.io/inferencedeployment": "m",
        groups.LABEL_RANK: "0",
        groups.LABEL_GROUP_WHOLE: "true",
    }
    whole = groups.leader_whole_label(groups.GroupAssessment(groups.GroupState.WHOLE))
    broken = groups.leader_whole_label(groups.GroupAssessment(groups.GroupState.BROKEN))
    assert whole == {groups.LABEL_GROUP_WHOLE: "true"} and broken == {groups.LABEL_GROUP_WHOLE: None}
