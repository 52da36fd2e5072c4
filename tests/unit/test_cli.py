"""The `trtforge` command: subcommands from entry points, and only the named one's module imported."""

from __future__ import annotations

import argparse

from trtforge.cli import build_parser, command_of


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    sub = next(a for a in parser._actions if a.dest == "command")
    assert isinstance(sub.choices, dict)
    return set(sub.choices)


def test_the_subcommand_is_the_first_word_that_is_not_an_option() -> None:
    assert command_of(["serve", "--store", "x"]) == "serve"
    assert command_of(["--log-level", "DEBUG", "--log-format", "json", "serve"]) == "serve"
    assert command_of(["--log-level=DEBUG", "gpu"]) == "gpu"
    assert command_of(["--version"]) is None
    assert command_of([]) is None


def test_a_named_subcommand_gets_only_its_parser_others_get_all() -> None:
    everything = _commands(build_parser())
    assert {"serve", "gpu"} <= everything
    assert _commands(build_parser("serve")) == {"serve"}
    assert _commands(build_parser("no-such-command")) == everything  # argparse lists the choices
    assert _commands(build_parser(None)) == everything
