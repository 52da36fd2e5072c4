"""Prometheus metrics of the operator (served on ``metrics_port``)."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram


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
