"""`trtforge operator`: run the control plane (kopf handlers, engine broker, metrics, health, GC).

Every replica serves metrics, /healthz and the engine broker; only the one holding the leader Lease
runs the kopf handlers and GC (trtforge_operator.leader).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from trtforge_operator.cli_config import add_config_argument, load_or_report

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("operator", help="run the trtforge operator (kopf)", description=__doc__)
    add_config_argument(p)
    p.add_argument(
        "--namespace",
        action="append",
        default=None,
        help="watch only this namespace (repeatable); default: cluster-wide",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    cfg = load_or_report(args, "operator")
    if cfg is None:
        return 2
    if args.namespace:
        cfg = cfg.model_copy(update={"namespaces": list(args.namespace)})
    try:
        return asyncio.run(main(cfg))
    except KeyboardInterrupt:
        return 0


async def main(cfg: Any) -> int:
    """Serve metrics, health and the broker on every replica; act (kopf, GC) only as the leader."""
    import asyncio
    import time

    from kubernetes import client
    from prometheus_client import start_http_server

    from trtforge.logs import fields
    from trtforge_operator.broker.server import start_broker
    from trtforge_operator.health import start_health
    from trtforge_operator.kube import Kube, load_kube_config
    from trtforge_operator.leader.elector import Elector, KubeLeaseAPI
    from trtforge_operator.leader.runner import replica_identity, run_while_leading
    from trtforge_operator.metrics import Metrics
    from trtforge_operator.store_reader import StoreReader, operator_store_reader
    from trtforge_operator.workqueue import LoopWatch

    load_kube_config()
    metrics = Metrics()
    start_http_server(cfg.metrics_port, addr=cfg.metrics_address())
    kube = Kube()
    store = operator_store_reader(cfg)
    cfg = cfg.with_broker_on_bind_address()
    # A broker in this process serves the store itself, never through a broker.
    served = StoreReader(cfg.reader_store_uri) if cfg.store_via_broker else store
    runner = await start_broker(cfg, served, kube, metrics) if cfg.broker.enabled else None
    le = cfg.leader_election
    identity = replica_identity()
    elector = Elector(
        KubeLeaseAPI(client.ApiClient(), cfg.operator_namespace, le.lease_name),
        identity,
        le,
        on_observe=lambda record: metrics.lease_transitions.set(record.transitions),
    )
    watch = LoopWatch(stuck_after=cfg.liveness_stuck_seconds)
    health = await start_health(
        cfg.bind_address, cfg.liveness_port, identity, elector.leading if le.enabled else None, watch.problem
    )
    namespaces = cfg.watched_namespaces()
    log.info(
        "trtforge operator starting",
        extra=fields(
            namespaces=",".join(namespaces) or "*",
            build_namespace=cfg.build_namespace,
            store=cfg.store_uri,
            engine_source=cfg.engine_source(),
            identity=identity,
            leader_election=le.enabled,
            started=time.time(),
        ),
    )

    async def act(stop: asyncio.Event) -> None:
        await _act(cfg, kube, store, metrics, namespaces, stop, watch)

    try:
        if le.enabled:
            return await run_while_leading(elector, act, on_leading=lambda on: metrics.leader.set(int(on)))
        metrics.leader.set(1)
        await act(asyncio.Event())
        return 0
    finally:
        await health.cleanup()
        if runner is not None:
            await runner.cleanup()


async def _act(
    cfg: Any, kube: Any, store: Any, metrics: Any, namespaces: list[str], stop: Any, watch: Any
) -> None:
    """What the leader does: the kopf handlers and the GC loop, until `stop` is set."""
    import asyncio

    import kopf

    from trtforge_operator.handlers import register
    from trtforge_operator.handlers.gc import gc_loop
    from trtforge_operator.state import State

    state = State(cfg=cfg, kube=kube, store=store, metrics=metrics, watch=watch)
    registry = kopf.OperatorRegistry()
    # kopf's public registry brings no login handler: log in with the Kubernetes client's config
    # (in-cluster or kubeconfig), as load_kube_config did.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    register(state, registry)

    @kopf.on.cleanup(registry=registry)
    async def _end_stop_flag_waiter(**_: Any) -> None:
        """kopf stops on SIGTERM through a handler of its own and leaves its waiter on `stop`
        pending, then waits 5 s for that task before it exits (and the Lease is released). Set
        here, `stop` ends the waiter at once."""
        stop.set()

    gc_task = asyncio.create_task(gc_loop(state)) if cfg.gc.enabled else None
    try:
        await kopf.operator(
            registry=registry,
            standalone=True,  # no kopf peering: the Lease decides who acts
            clusterwide=not namespaces,
            namespaces=namespaces,
            stop_flag=stop,
        )
    finally:
        if gc_task is not None:
            gc_task.cancel()
