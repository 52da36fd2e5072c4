"""High availability on the test bed, with the operator and the engine broker installed from the chart's
rendered manifests (trtforge_dev.chart_operator): two operator replicas, one Lease; two broker replicas.
(The broker's own must-shows are in test_broker_ha.py.)

- the chart applies server-side (PodDisruptionBudgets as policy/v1beta1, what the chart renders for
  the test bed's 1.20); its two operator replicas are ready while exactly one leads, its two broker
  replicas are ready;
- the leader SIGKILLed in the middle of a 3-target build: the other replica takes over, every target
  becomes Ready, exactly one build Job per engine key;
- the leader cut off from the apiserver (a TCP proxy between it and the apiserver) stops acting and
  exits before the other replica acquires the Lease (both replicas' log timestamps);
- the apiserver SIGKILLed for ~25 s in the middle of a rollout: the InferenceDeployment is Ready again.

Times are printed, never asserted (benchmarks/ha.py measures them); the assertions are on order and
outcome.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from trtforge_dev.chart_operator import (
    BROKER,
    FULLNAME,
    ChartOperator,
    apiserver_killed_mid_rollout,
    first_line,
    leader_killed_mid_build,
    other_holder,
    pod_of_identity,
)
from trtforge_dev.testbed.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]


@pytest.fixture(scope="module")
def ha(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartOperator]:
    op = ChartOperator(
        testbed,
        tmp_path_factory.mktemp("ha"),
        values={
            "metrics": {
                "bindAddress": "0.0.0.0",  # a ServiceMonitor scrapes over the pod network
                "serviceMonitor": {"enabled": True},
                "prometheusRule": {"enabled": True},
            },
            # A shorter Lease than client-go's 15/10/2 s (the chart's defaults): each takeover below
            # waits out one Lease duration, and the order asserted does not depend on its length.
            "operator": {
                "leaderElection": {
                    "leaseDurationSeconds": 8,
                    "renewDeadlineSeconds": 5,
                    "retryPeriodSeconds": 1,
                }
            },
        },
    )
    try:
        op.install()
        op.wait_ready()
        yield op
    finally:
        op.close()


def test_chart_applies_and_one_of_two_ready_replicas_leads(ha: ChartOperator) -> None:
    if ha.skipped:
        print(f"\nnot applied, the test bed's apiserver does not serve them: {ha.skipped}")
    kinds = {(d["apiVersion"], d["kind"]) for d in ha.docs}
    assert set(ha.skipped) <= {
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("monitoring.coreos.com/v1", "PrometheusRule"),
    }
    assert ("apps/v1", "Deployment") in kinds and ("rbac.authorization.k8s.io/v1", "Role") in kinds
    # Both PodDisruptionBudgets (operator, broker) were applied, in the API the test bed serves.
    pdbs = ha.tb.kubectl("get", "pdb", "-n", ha.ns, "-o", "name").stdout.split()
    assert sorted(pdbs) == sorted(
        f"poddisruptionbudget.policy/{n}" for n in (FULLNAME, f"{FULLNAME}-broker")
    ), pdbs
    brokers = ha.pods(component=BROKER)
    assert len(brokers) == 2 and all(
        first_line(ha.logs(b.metadata.name, container=BROKER), "engine broker ready") for b in brokers
    )
    pods = {p.metadata.name for p in ha.pods()}
    assert len(pods) == 2
    leader = ha.leader_pod()
    assert leader in pods
    (standby,) = pods - {leader}
    assert first_line(ha.logs(leader), "leading") is not None
    assert first_line(ha.logs(standby), "waiting to lead") is not None
    assert first_line(ha.logs(standby), "leading") is None  # ready, and idle


def test_leader_killed_mid_build_a_new_holder_finishes_it_once(ha: ChartOperator) -> None:
    r = leader_killed_mid_build(ha, seed=101)
    print(
        f"\nleader {r['killed_pod']} SIGKILLed with {r['ready_targets_at_kill'] or '0/3'} targets Ready; "
        f"{r['new_leader_pod']} took over after {r['takeover_s']} s; "
        f"all Ready {r['ready_after_kill_s']} s after the kill"
    )
    # A new identity holds the Lease (leader_killed_mid_build waits for one). Which pod: whichever
    # candidate sees the Lease expire first, the standby or the killed pod's container once the
    # kubelet has restarted it; both wait out the same expiry. (The partition test below pins the
    # standby: there the old leader's pod cannot reach the apiserver.)
    assert r["new_leader_pod"] in r["pods_at_kill"]
    assert r["ready_targets_at_kill"] != "3/3"  # it was killed mid-build
    assert r["ready_targets"] == "3/3"
    assert len(set(r["target_keys"])) == 3
    assert r["job_keys"] == r["target_keys"]  # exactly one Job per key: none lost, none duplicated


def test_partitioned_leader_stops_before_the_other_acquires(ha: ChartOperator) -> None:
    ha.wait_ready()
    old_identity = ha.lease().spec.holder_identity
    leader = pod_of_identity(old_identity)
    (standby,) = {p.metadata.name for p in ha.pods()} - {leader}
    cut_at = time.time()
    ha.apiserver.cut(leader)
    try:
        identity = wait_for(
            lambda: other_holder(ha, old_identity),
            timeout=120,
            interval=0.2,
            desc="the standby holding the Lease",
        )
        assert pod_of_identity(str(identity)) == standby

        def lost() -> dict[str, Any] | None:
            for previous in (True, False):
                try:
                    line = first_line(ha.logs(leader, previous=previous), "leadership lost; exiting", cut_at)
                except Exception:
                    line = None
                if line:
                    return line
            return None

        lost_line = wait_for(lost, timeout=60, desc="the old leader's 'leadership lost' log line")
        leading_line = wait_for(
            lambda: first_line(ha.logs(standby), "leading", cut_at),
            timeout=30,
            desc="the standby's 'leading'",
        )
    finally:
        ha.apiserver.heal()
    stopped, took_over = float(lost_line["ts"]), float(leading_line["ts"])
    print(
        f"\ncut {leader} off at {cut_at:.3f}; it stopped acting at {stopped:.3f} (+{stopped - cut_at:.2f} s, "
        f"its log); {standby} led from {took_over:.3f} (+{took_over - cut_at:.2f} s, its log)"
    )
    assert stopped < took_over  # never two acting at once
    ha.wait_ready()


def test_apiserver_killed_mid_rollout_converges(ha: ChartOperator, testbed: Any) -> None:
    r = apiserver_killed_mid_rollout(ha, testbed, "ha-rollout", seed=202)
    print(
        f"\napiserver SIGKILLed with runtime pods {r['runtime_states_at_kill']}, "
        f"down {r['down_s']} s; "
        f"InferenceDeployment Ready {r['ready_after_return_s']} s after its return; "
        f"{r['runtime_fetch_retries']} fetch retries in the runtime logs"
    )
    assert r["ready"] == "2/2"
    assert r["exits_80"] == []  # the runtime waited for the broker instead of giving up
