"""The `trtforge` command: subcommands from entry points, and only the named one's module imported."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from trtforge.cli import (
    ENTRY_POINT_GROUP,
    build_parser,
    command_of,
    product_commands,
    product_registrar,
)


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


# the product's packages (the test bed's, dev/, is outside the product and not among them)
PRODUCT_PYPROJECTS = ("pyproject.toml", "operator", "runtime_image", "builder_job")


def _declared(project: Path) -> dict[str, str]:
    data = tomllib.loads(project.read_text())
    return dict(data["project"].get("entry-points", {}).get(ENTRY_POINT_GROUP, {}))


def test_the_product_commands_are_what_the_product_packages_declare() -> None:
    root = Path(__file__).resolve().parents[2]
    declared: dict[str, str] = {}
    for where in PRODUCT_PYPROJECTS:
        path = root / where if where.endswith(".toml") else root / where / "pyproject.toml"
        declared.update(_declared(path))
    assert declared == product_commands()
    assert {"serve", "gpu", "operator", "build"} <= set(declared)
    assert not set(_declared(root / "dev" / "pyproject.toml")) & set(product_commands())


# `entry_points()` and `distributions()` read every installed distribution's metadata.
NO_SCAN = (
    "import importlib.metadata as md, sys\n"
    "def refuse(*a, **k): raise AssertionError('scanned every distribution')\n"
    "md.entry_points = md.distributions = refuse\n"
    "from trtforge.cli import build_parser\n"
    "p = build_parser({command!r})\n"
    "print(sorted(p._subparsers._group_actions[0].choices))\n"
)


def test_a_product_command_is_found_without_scanning_every_distribution() -> None:
    for command in ("serve", "build", "gpu"):
        code = NO_SCAN.format(command=command)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == repr([command])
    # a command that is not the product's is found through the entry points, which scan them all
    code = NO_SCAN.format(command="cluster")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0 and "scanned every distribution" in out.stderr


def test_a_named_product_command_imports_no_other_component() -> None:
    code = (
        "import sys; from trtforge.cli import build_parser; build_parser('serve'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('trtforge_operator', 'trtforge_builder', 'trtforge_dev')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_command_that_is_not_the_products_is_left_to_the_entry_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert product_registrar("cluster") is None
    assert _commands(build_parser("cluster")) == {"cluster"}  # the installed entry point's
    # an import error inside a product command's module is raised, not taken for "not a command"
    (tmp_path / "trtforge_broken_cmd.py").write_text("import trtforge_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="trtforge_no_such_dependency"):
        product_registrar("serve", {"serve": "trtforge_broken_cmd:register"})
    assert product_registrar("no-such-command") is None
    assert product_registrar(None) is None
