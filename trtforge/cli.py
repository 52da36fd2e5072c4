"""The `trtforge` command. Each installed component registers its subcommands through the
`trtforge.commands` entry-point group, so an image has exactly the subcommands of what it installs
(the runtime image has no `operator`, no `cluster`).

An entry point names a `register(subparsers)` function that adds its parser and sets `func` on it.
Subcommand modules keep their top-level imports light; heavy work is imported inside handlers. When
the command line names a subcommand, only that subcommand's module is imported (`trtforge serve`'s
cold start pays for no other component's parser). A product subcommand (:data:`PRODUCT_COMMANDS`)
is found without reading any distribution's metadata when its package is installed.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from trtforge import __version__
from trtforge.logs import configure_logging

ENTRY_POINT_GROUP = "trtforge.commands"
# The product's own subcommands, as its packages declare them in ENTRY_POINT_GROUP (a unit test keeps
# them equal). A command line naming one imports it straight from here when its package is
# installed: finding it through the entry points reads every installed distribution's metadata first
# (30-40 ms, before `trtforge serve` could begin its cold start; docs/design.md, "Runtime cold
# start"). The entry points stay the registry: anything else, and a package not installed, is
# looked up there, so an image still has exactly the subcommands of what it installs.
PRODUCT_COMMANDS = {
    "gpu": "trtforge.contract.probe_cli:register",
    "operator": "trtforge_operator.cli:register",
    "broker": "trtforge_operator.broker.cli:register",
    "crds": "trtforge_operator.crdgen:register",
    "serve": "trtforge_runtime.cli:register",
    "serve-llm": "trtforge_runtime.llm.cli:register",
    "build": "trtforge_builder.cli:register",
    "stage-model": "trtforge_builder.stage:register",
}


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named on a command line (the first word that is not an option), if any."""
    takes_value = {"--log-level", "--log-format"}
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in takes_value:
            skip = True
        elif not a.startswith("-"):
            return a
    return None


def product_registrar(command: str | None) -> Callable[[Any], None] | None:
    """The `register` function of product subcommand `command`, imported; None when `command` is not
    one of :data:`PRODUCT_COMMANDS` or its package is not installed (an error inside it is raised)."""
    target = PRODUCT_COMMANDS.get(command or "")
    if target is None:
        return None
    module, _, attr = target.partition(":")
    try:
        found = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and (module == e.name or module.startswith(e.name + ".")):
            return None  # not installed in this image
        raise
    register: Callable[[Any], None] = getattr(found, attr)
    return register


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with `command` one of the installed subcommands, only that one's."""
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
    register = product_registrar(command)
    if register is not None:
        register(sub)
        return parser
    from importlib.metadata import entry_points

    entries = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    named = [e for e in entries if e.name == command]
    for entry in named or entries:
        entry.load()(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(command_of(argv))
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    rc = args.func(args)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
