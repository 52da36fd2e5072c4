"""Operator failover on the test bed, with the operator installed from the chart (two replicas):

- leader SIGKILLed in the middle of a 3-target build, 5 times: the takeover time (kill → the other
  replica's Lease acquireTime) and the time until every target is Ready, with the check that each
  engine key has exactly one build Job;
- the apiserver SIGKILLed for ~25 s in the middle of a 2-replica rollout: the time from its return
  to the InferenceDeployment Ready (target: 30 s).

Scenarios are the ones tests/integration/test_ha.py asserts on (trtforge_dev.chart_operator). The
machine is shared with other work unless said otherwise: times include that noise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import log, machine_info, table, write_result

ROUNDS = 5
LEASE_DURATION_S = 15


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--no-apiserver", action="store_true", help="skip the apiserver restart")
    args = ap.parse_args(argv)
    from trtforge_dev.chart_operator import (
        ChartOperator,
        apiserver_killed_mid_rollout,
        leader_killed_mid_build,
    )
    from trtforge_dev.testbed import handle
    from trtforge_dev.testbed.paths import StatePaths, default_root

    paths = StatePaths(default_root())
    tb = handle.acquire(paths)
    results: dict[str, Any] = {
        "machine": machine_info(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    op = ChartOperator(tb, Path(tempfile.mkdtemp(prefix="bench-ha-")))
    try:
        op.install()
        op.wait_ready()
        rounds = []
        for i in range(args.rounds):
            op.wait_ready()
            r = leader_killed_mid_build(op, seed=5000 + i + int(time.time()) % 1000 * 10)
            r["one_job_per_key"] = r["job_keys"] == r["target_keys"] and len(set(r["target_keys"])) == 3
            log(
                f"round {i + 1}: takeover {r['takeover_s']} s, "
                f"all Ready {r['ready_after_kill_s']} s after the kill"
            )
            rounds.append(r)
        results["leader_killed"] = rounds
        if not args.no_apiserver:
            op.wait_ready()
            results["apiserver_restart"] = apiserver_killed_mid_rollout(
                op, tb, f"bench-rollout-{int(time.time())}", seed=77
            )
            log(
                "apiserver restart: Ready "
                f"{results['apiserver_restart']['ready_after_return_s']} s after its return"
            )
    finally:
        op.close()
        handle.release(paths)
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    write_result("ha", results)
    print(render(results))
    return 0


def render(results: dict[str, Any]) -> str:
    """The rounds' table and the takeover and apiserver-restart summaries."""
    rounds = results["leader_killed"]
    takeovers = [r["takeover_s"] for r in rounds]
    lines = [
        table(
            [
                "round",
                "takeover s",
                f"within {LEASE_DURATION_S} + 5 s",
                "all Ready after the kill s",
                "one Job per key",
            ],
            [
                [
                    i + 1,
                    r["takeover_s"],
                    "yes" if r["takeover_s"] <= LEASE_DURATION_S + 5 else "no",
                    r["ready_after_kill_s"],
                    "yes" if r["one_job_per_key"] else "no",
                ]
                for i, r in enumerate(rounds)
            ],
        ),
        f"Takeover: median {statistics.median(takeovers):.1f} s, max {max(takeovers):.1f} s"
        f" (target: lease duration + 5 s = {LEASE_DURATION_S + 5} s).",
    ]
    ar = results.get("apiserver_restart")
    if ar:
        lines.append(
            f"apiserver restart: the InferenceDeployment Ready {ar['ready_after_return_s']} s after the"
            " apiserver's return (/readyz) (target 30 s)."
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
