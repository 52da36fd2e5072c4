"""The `trtforge` command. Each installed component registers its subcommands through the
`trtforge.commands` entry-point group, so an image has exactly the subcommands of what it installs
(the runtime image has no `operator`, no `cluster`).

An entry point names a `register(subparsers)` function that adds its parser and sets `func` on it.
Subcommand modules keep their top-level imports light; heavy work is imported inside handlers. When
the command line names a subcommand, only that subcommand's module is imported (`trtforge serve`'s
cold start pays for no other component's parser). A product subcommand (:func:`product_commands`)
is found in the product distributions' own metadata, without a scan of every installed distribution.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trtforge import __version__
from trtforge.logs import configure_logging

ENTRY_POINT_GROUP = "trtforge.commands"
# The product's distributions, the runtime first (its cold start is the one that counts). A command
# line naming one of their subcommands finds it in these distributions' own entry points: scanning
# every installed distribution (`entry_points(group=...)`) takes 30-40 ms before `trtforge serve` could
# begin its cold start (docs/design.md, "Runtime cold start"). Anything else is looked up in all of
# them, so an image still has exactly the subcommands of what it installs.
PRODUCT_DISTRIBUTIONS = ("trtforge-runtime", "trtforge", "trtforge-builder", "trtforge-operator")


@functools.cache
def product_commands() -> dict[str, str]:
    """Subcommand -> `module:register`, as the installed product distributions declare them in
    ENTRY_POINT_GROUP (read from each one's own metadata; a distribution not installed has none)."""
    from importlib.metadata import PackageNotFoundError, distribution

    out: dict[str, str] = {}
    for name in PRODUCT_DISTRIBUTIONS:
        try:
            entries = distribution(name).entry_points
        except PackageNotFoundError:
            continue
        out.update({e.name: e.value for e in entries if e.group == ENTRY_POINT_GROUP})
    return out


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


def product_registrar(
    command: str | None, commands: Mapping[str, str] | None = None
) -> Callable[[Any], None] | None:
    """The `register` function of product subcommand `command` (of `commands`, default the installed
    product's), imported; None when it is not one (an error inside its module is raised)."""
    target = (product_commands() if commands is None else commands).get(command or "")
    if target is None:
        return None
    module, _, attr = target.partition(":")
    register: Callable[[Any], None] = getattr(importlib.import_module(module), attr)
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
