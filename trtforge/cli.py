"""The `trtforge` command. Each installed component registers its subcommands through the
`trtforge.commands` entry-point group, so an image has exactly the subcommands of what it installs
(the runtime image has no `operator`, no `cluster`).

An entry point names a `register(subparsers)` function that adds its parser and sets `func` on it.
Subcommand modules keep their top-level imports light; heavy work is imported inside handlers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from trtforge import __version__
from trtforge.logs import configure_logging

ENTRY_POINT_GROUP = "trtforge.commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trtforge", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--version", action="version", version=f"trtforge {__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=None,
        help="log line format (default: json when stderr is not a terminal)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        entry.load()(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    rc = args.func(args)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
