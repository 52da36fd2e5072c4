"""The `trtforge` command: subcommands from entry points, and only the named one's module imported."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from trtforge.cli import ENTRY_POINT_GROUP, PRODUCT_COMMANDS, build_parser, command_of, product_registrar


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
    assert declared == PRODUCT_COMMANDS
    assert not set(_declared(root / "dev" / "pyproject.toml")) & set(PRODUCT_COMMANDS)


def test_a_product_command_is_found_without_reading_distribution_metadata() -> None:
    code = (
        "import sys; from trtforge.cli import build_parser; p = build_parser('serve'); "
        "print('importlib.metadata' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    # and a command that is not the product's is still found through the entry points
    code = code.replace("'serve'", "'cluster'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_a_product_command_whose_package_is_not_installed_is_left_to_the_entry_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(PRODUCT_COMMANDS, "serve", "trtforge_not_installed.cli:register")
    assert product_registrar("serve") is None
    assert _commands(build_parser("serve")) == {"serve"}  # the installed entry point's
    # an import error inside an installed command's module is not taken for "not installed"
    (tmp_path / "trtforge_broken_cmd.py").write_text("import trtforge_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(PRODUCT_COMMANDS, "serve", "trtforge_broken_cmd:register")
    with pytest.raises(ModuleNotFoundError, match="trtforge_no_such_dependency"):
        product_registrar("serve")
    assert product_registrar("no-such-command") is None
    assert product_registrar(None) is None
