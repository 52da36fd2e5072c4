"""`trtforge broker`: the engine broker as its own component (docs/operations.md, high availability).

Stateless: each request is checked with a TokenReview and the namespace's InferenceDeployments,
TRTEngines and possession records, then streamed from the store. Run several replicas behind one
Service; runtime pods and verify Jobs retry another replica when one goes away. It reads the
operator's config file (the same ConfigMap): `broker.*`, the store URIs and `operator_namespace`.
SIGTERM stops accepting, lets running downloads finish (`broker.shutdown_grace_seconds`), then exits.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from trtforge_operator.cli_config import add_config_argument, load_or_report

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "broker", help="run the engine broker alone (stateless; run several)", description=__doc__
    )
    add_config_argument(p)
    p.add_argument("--port", type=int, default=None, help="listen port (default: broker.port of the config)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    cfg = load_or_report(args, "broker")
    if cfg is None:
        return 2
    if args.port is not None:
        cfg = cfg.model_copy(update={"broker": cfg.broker.model_copy(update={"port": args.port})})
    cfg = cfg.with_broker_on_bind_address()  # $TRTFORGE_OPERATOR_BIND_ADDRESS, as the operator
    asyncio.run(main(cfg))
    return 0


async def main(cfg: Any) -> None:
    import asyncio
    import signal

    from trtforge.logs import fields
    from trtforge_operator.broker.server import start_broker
    from trtforge_operator.kube import Kube, load_kube_config
    from trtforge_operator.metrics import BrokerMetrics
    from trtforge_operator.store_reader import StoreReader

    load_kube_config()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = await start_broker(
        cfg, StoreReader(cfg.reader_store_uri), Kube(), BrokerMetrics(), serve_metrics=True
    )
    log.info("engine broker ready", extra=fields(port=cfg.broker.port, store=cfg.reader_store_uri))
    await stop.wait()
    log.info("engine broker stopping; finishing running downloads")
    await runner.cleanup()
