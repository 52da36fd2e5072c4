"""The operator config file of the `operator` and `broker` commands: their `--config` flag and its
loading, with one clear line for a bad file (docs/development.md, Conventions: CLI, Errors)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trtforge_operator.config import OperatorConfig


def add_config_argument(parser: Any) -> None:
    parser.add_argument(
        "--config", default=None, help="operator config YAML (else $TRTFORGE_OPERATOR_CONFIG)"
    )


def load_or_report(args: argparse.Namespace, command: str) -> OperatorConfig | None:
    """The config `--config` names (else the environment's), or None after printing why not."""
    from trtforge_operator.config import ConfigError, load_config

    try:
        return load_config(args.config)
    except ConfigError as e:
        print(f"trtforge {command}: {e}")
        return None
