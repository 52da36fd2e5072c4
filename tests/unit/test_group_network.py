"""The rank port's NetworkPolicy (trtforge_operator.apply.group_network)."""

from __future__ import annotations

import pytest
from trtforge_operator.apply.group_network import rank_port_policy
from trtforge_operator.planning.groups import LABEL_GROUP


def test_only_the_groups_own_pods_reach_the_rank_port() -> None:
    p = rank_port_policy("m-g0", "ns", [8000, 8080])
    spec = p["spec"]
    assert spec["podSelector"] == {"matchLabels": {LABEL_GROUP: "m-g0"}} and spec["policyTypes"] == [
        "Ingress"
    ]
    rank, rest = spec["ingress"]
    assert rank == {
        "from": [{"podSelector": {"matchLabels": {LABEL_GROUP: "m-g0"}}}],
        "ports": [{"protocol": "TCP", "port": 50052}],
    }
    assert "from" not in rest and [x["port"] for x in rest["ports"]] == [8000, 8080]


def test_the_rank_port_is_never_also_open() -> None:
    with pytest.raises(ValueError, match="rank port 50052 is also among the open ports"):
        rank_port_policy("m-g0", "ns", [8000, 50052])
