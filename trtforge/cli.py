"""The `trtforge` command. Each subcommand lives with its component and registers itself.

Subcommand modules keep their top-level imports light; heavy work is imported inside handlers.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from trtforge import __version__
from trtforge.logs import configure_logging

# subcommand -> module with `register(subparsers)`; the module sets `func` on its parser.
SUBCOMMANDS: dict[str, str] = {
    "cluster": "trtforge.testbed.cli",
    "crds": "trtforge_operator.crdgen",
    "operator": "trtforge_operator.cli",
    "broker": "trtforge_operator.broker_cli",
    "build": "trtforge_builder.cli",
    "stage-model": "trtforge_builder.stage",
    "serve": "trtforge_runtime.cli",
    "gpu": "trtforge.contract.probe_cli",
    "demo": "trtforge.demo",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trtforge", description=__doc__)
    parser.add_argument("--version", action="version", version=f"trtforge {__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=None,
        help="log line format (default: json when stderr is not a terminal)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in SUBCOMMANDS.values():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name is None or not (module_name + ".").startswith(e.name + "."):
                raise
            continue  # a component not installed in this image (e.g. the runtime image has no operator)
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    rc = args.func(args)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
