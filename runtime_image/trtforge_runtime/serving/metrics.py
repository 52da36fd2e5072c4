"""Prometheus metrics of one runtime process (served on /metrics).

Under ``--workers N`` (trtforge_runtime.lifecycle.workers) each worker writes its values into the directory
named by ``PROMETHEUS_MULTIPROC_DIR`` and :func:`exposition` aggregates all of them, so any worker's
``/metrics`` shows the pod: counters and histograms summed, gauges as their mode says.
"""

from __future__ import annotations

import enum
import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Outcome(enum.StrEnum):
    """How an inference request ended: the ``outcome`` label of the request metrics, the same for
    every protocol."""

    SUCCESS = "success"
    BAD_REQUEST = "bad_request"
    NOT_FOUND = "not_found"
    TIMEOUT = "timeout"
    TOO_LARGE = "too_large"
    UNSUPPORTED_ENCODING = "unsupported_encoding"
    UNAVAILABLE = "unavailable"
    ERROR = "error"


_LATENCY = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


class Metrics:
    def __init__(self, model: str, worker: int | None = None) -> None:
        """`worker`: this process's index among the workers of ``serve --workers N`` (None: the only
        process), the ``worker`` label of the per-worker request count."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "trtforge_runtime_requests", "Inference requests by outcome", ["model", "outcome"], registry=r
        )
        self.latency = Histogram(
            "trtforge_runtime_request_duration_seconds",
            "Inference request latency (body read to response) by outcome",
            ["model", "outcome"],
            buckets=_LATENCY,
            registry=r,
        )
        self.batch_size = Histogram(
            "trtforge_runtime_batch_size",
            "Rows per executed batch",
            ["model"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=r,
        )
        self.queue_time = Histogram(
            "trtforge_runtime_queue_duration_seconds",
            "Time a request waited for an execution instance",
            ["model"],
            buckets=_LATENCY,
            registry=r,
        )
        self.compute_time = Histogram(
            "trtforge_runtime_compute_duration_seconds",
            "Backend time per batch",
            ["model"],
            buckets=_LATENCY,
            registry=r,
        )
        self.queue_depth = Gauge(
            "trtforge_runtime_queue_depth",
            "Requests waiting for an instance",
            ["model"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.in_flight = Gauge(
            "trtforge_runtime_requests_in_flight",
            "Inference requests accepted and not yet answered (queued or executing): the load signal "
            "to autoscale on",
            ["model"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.ready = Gauge(
            "trtforge_runtime_ready",
            "1 when the model serves (every worker)",
            ["model"],
            registry=r,
            multiprocess_mode="livemin",
        )
        self.startup = Gauge(
            "trtforge_runtime_startup_seconds",
            "Seconds spent per start-up phase",
            ["phase"],
            registry=r,
            multiprocess_mode="max",
        )
        self.engine_load = Gauge(
            "trtforge_runtime_engine_load_seconds",
            "Seconds to load the engine",
            registry=r,
            multiprocess_mode="max",
        )
        self.gpu_faults = Counter(
            "trtforge_runtime_gpu_faults", "GPU faults seen", ["gpu", "xid"], registry=r
        )
        self.execution_errors = Counter(
            "trtforge_runtime_execution_errors", "Backend execution errors", ["model"], registry=r
        )
        self.solo_batches = Counter(
            "trtforge_runtime_solo_batches",
            "Batches that ran alone on the solo instance (every core's threads)",
            ["model"],
            registry=r,
        )
        self.batch_cap = Gauge(
            "trtforge_runtime_batch_cap",
            "Largest batch the pool forms now: the max batch size, or less where bigger batches stopped"
            " computing each row faster (learned from the pool's batch timings)",
            ["model"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.open_connections = Gauge(
            "trtforge_runtime_open_connections",
            "HTTP connections the server handles",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.connections_refused = Counter(
            "trtforge_runtime_connections_refused",
            "Connections answered and closed at once because --max-connections were open",
            registry=r,
        )
        self.worker_requests = Counter(
            "trtforge_runtime_worker_requests",
            "Inference requests answered by each worker process of `serve --workers N` (any outcome)",
            ["model", "worker"],
            registry=r,
        )
        self.model = model
        self._worker_m = self.worker_requests.labels(model, str(worker)) if worker is not None else None
        # Pre-bound children: labels() costs a dict lookup per call on the hot path.
        self.batch_size_m = self.batch_size.labels(model)
        self.queue_time_m = self.queue_time.labels(model)
        self.compute_time_m = self.compute_time.labels(model)
        self.queue_depth_m = self.queue_depth.labels(model)
        self.in_flight_m = self.in_flight.labels(model)
        self.ready_m = self.ready.labels(model)
        self.solo_batches_m = self.solo_batches.labels(model)
        self.batch_cap_m = self.batch_cap.labels(model)
        self._outcomes: dict[Outcome, tuple[Counter, Histogram]] = {}

    def observe_request(self, outcome: Outcome, seconds: float) -> None:
        pair = self._outcomes.get(outcome)
        if pair is None:
            label = outcome.value
            pair = (self.requests.labels(self.model, label), self.latency.labels(self.model, label))
            self._outcomes[outcome] = pair
        pair[0].inc()
        pair[1].observe(seconds)
        if self._worker_m is not None:
            self._worker_m.inc()


def exposition(metrics: Metrics) -> bytes:
    """The text exposition of `metrics`, or of every worker's when they share a multiprocess directory."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        return bytes(generate_latest(metrics.registry))
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=directory)
    return bytes(generate_latest(registry))
