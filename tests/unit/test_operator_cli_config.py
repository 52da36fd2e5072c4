"""The `operator` and `broker` commands read their config the same way: one flag, and a bad file is
reported naming the command and the file, with no traceback."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from trtforge_operator.cli_config import add_config_argument, load_or_report


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_config_argument(p)
    return p.parse_args(argv)


def test_a_bad_file_is_reported_with_the_command_and_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "operator.yaml"
    bad.write_text("store: [unclosed\n")
    assert load_or_report(parse("--config", str(bad)), "broker") is None
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"trtforge broker: operator config {bad}: not valid YAML")


def test_a_good_file_is_the_config(tmp_path: Path) -> None:
    good = tmp_path / "operator.yaml"
    good.write_text("operator_namespace: trtforge-test\n")
    cfg = load_or_report(parse("--config", str(good)), "operator")
    assert cfg is not None and cfg.operator_namespace == "trtforge-test"


@pytest.mark.parametrize("module", ["trtforge_operator.cli", "trtforge_operator.broker.cli"])
def test_both_commands_take_the_flag(module: str) -> None:
    import importlib

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    importlib.import_module(module).register(sub)
    name = "operator" if module == "trtforge_operator.cli" else "broker"
    assert parser.parse_args([name, "--config", "x.yaml"]).config == "x.yaml"
