"""Prometheus metrics of the operator (served on ``metrics_port``)."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from trtforge.contract.build_result import BuildFailure, parse_build_message


class Metrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.reconciles = Counter(
            "trtforge_reconciles_total",
            "Reconciles by kind and outcome",
            ["kind", "outcome"],
            registry=registry,
        )
        self.reconcile_seconds = Histogram(
            "trtforge_reconcile_seconds", "Time of one reconcile", ["kind"], registry=registry
        )
        self.status_writes = Counter(
            "trtforge_status_writes_total", "Status patches actually sent", ["kind"], registry=registry
        )
        self.jobs_created = Counter(
            "trtforge_build_jobs_created_total", "Build Jobs created", ["kind"], registry=registry
        )
        self.builds_running = Gauge("trtforge_builds_running", "Build Jobs running now", registry=registry)
        self.cache_hits = Counter(
            "trtforge_engine_cache_hits_total",
            "Targets served from the store without a build",
            registry=registry,
        )
        self.faults = Counter(
            "trtforge_gpu_faults_total", "GPU faults handled", ["action"], registry=registry
        )
        self.recovery_seconds = Histogram(
            "trtforge_fault_recovery_seconds",
            "Fault to Ready again",
            buckets=(5, 10, 20, 30, 60, 120, 300, 600, 1800),
            registry=registry,
        )
        self.broker_requests = Counter(
            "trtforge_broker_requests_total",
            "Engine broker requests by status code",
            ["code"],
            registry=registry,
        )
        self.gc_deleted = Counter(
            "trtforge_gc_engines_deleted_total", "Engines removed by GC", registry=registry
        )
        self.leader = Gauge(
            "trtforge_leader", "1 while this replica holds the leader Lease and acts", registry=registry
        )
        self.lease_transitions = Gauge(
            "trtforge_leader_transitions",
            "Times the leader Lease changed hands (its spec.leaseTransitions, as this replica last saw it)",
            registry=registry,
        )
        # Per-object state for alerts (chart: templates/prometheusrule.yaml); set by the leader only.
        # `tenant_namespace`, not `namespace`: scraping adds the operator pod's own `namespace` label.
        self.engine_stalled = Gauge(
            "trtforge_engine_stalled",
            "1 while a TRTEngine's Stalled condition is True (a target gave up after its attempts)",
            ["tenant_namespace", "name"],
            registry=registry,
        )
        self.finished_jobs_deleted = Counter(
            "trtforge_finished_jobs_deleted_total",
            "Finished build Jobs deleted after their TTL, once every requester had recorded them",
            registry=registry,
        )
        self.refused_transitions = Counter(
            "trtforge_refused_target_transitions_total",
            "Target state changes the transition table refuses (a planner bug; status shows what was seen)",
            ["before", "after"],
            registry=registry,
        )
        self.build_failures = Counter(
            "trtforge_build_failures_total",
            "Build Jobs that ended in failure, by the builder's typed reason",
            ["reason"],
            registry=registry,
        )
        self.deployment_replicas = Gauge(
            "trtforge_inferencedeployment_replicas",
            "Runtime pods an InferenceDeployment wants, all targets",
            ["tenant_namespace", "name"],
            registry=registry,
        )
        self.deployment_ready_replicas = Gauge(
            "trtforge_inferencedeployment_ready_replicas",
            "Runtime pods of an InferenceDeployment that are Ready",
            ["tenant_namespace", "name"],
            registry=registry,
        )

    def observe_engine(self, namespace: str, name: str, status: Any) -> None:
        """From a TRTEngine's status as just planned (TRTEngineStatus)."""
        stalled = any(c.type == "Stalled" and c.status == "True" for c in status.conditions)
        self.engine_stalled.labels(namespace, name).set(int(stalled))

    def observe_deployment(self, namespace: str, name: str, status: Any) -> None:
        """From an InferenceDeployment's status as just planned (InferenceDeploymentStatus)."""
        self.deployment_replicas.labels(namespace, name).set(status.desired_replicas or 0)
        self.deployment_ready_replicas.labels(namespace, name).set(status.ready_replicas or 0)

    def observe_build_result(self, line: str) -> None:
        """A finished build pod's result line, counted once per Job (when it is first recorded)."""
        parsed = parse_build_message(line)
        if isinstance(parsed, BuildFailure):
            self.build_failures.labels(parsed.reason).inc()

    def forget(self, kind: str, namespace: str, name: str) -> None:
        """Drop a deleted object's series."""
        gauges = (
            [self.engine_stalled]
            if kind == "trte"
            else [self.deployment_replicas, self.deployment_ready_replicas]
        )
        for g in gauges:
            try:
                g.remove(namespace, name)
            except KeyError:
                pass


class BrokerMetrics:
    """Metrics of a standalone engine broker (`trtforge broker`)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.broker_requests = Counter(
            "trtforge_broker_requests_total",
            "Engine broker requests by status code",
            ["code"],
            registry=registry,
        )
        self.broker_bytes = Counter(
            "trtforge_broker_served_bytes_total", "Engine bytes the broker streamed", registry=registry
        )
