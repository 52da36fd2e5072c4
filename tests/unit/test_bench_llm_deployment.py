"""The pure helpers of benchmarks/llm_deployment.py: reading the pod's llama-server command line and
turning it into the direct server's."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.llm_deployment import direct_argv, flag_value, server_settings

POD = [
    "/opt/llama/bin/llama-server", "-m", "/cache/ck/model.gguf", "--host", "10.0.0.7", "--port", "8080",
    "--metrics", "-c", "2048", "-np", "4", "--no-webui", "-a", "chat", "-t", "2", "-b", "512",
    "-ub", "256", "--threads-batch=2",
]  # fmt: skip


def test_the_settings_are_read_in_short_long_and_equals_forms() -> None:
    assert server_settings(POD) == {
        "threads": 2, "threads_batch": 2, "ctx": 2048, "parallel": 4, "batch": 512, "ubatch": 256,
    }  # fmt: skip
    assert server_settings(["llama-server", "-m", "x"])["threads"] is None


def test_the_last_occurrence_of_a_flag_wins() -> None:
    assert flag_value(["s", "-t", "1", "--threads", "3"], ("-t", "--threads")) == "3"
    assert flag_value(["s", "-t"], ("-t",)) is None  # no value after it


def test_the_direct_command_changes_only_the_binary_model_host_and_port() -> None:
    got = direct_argv(POD, "/host/llama-server", Path("/tmp/served.gguf"), "127.0.0.1", 9001)
    want = list(POD)
    want[0], want[2], want[4], want[6] = "/host/llama-server", "/tmp/served.gguf", "127.0.0.1", "9001"
    assert got == want


def test_equals_forms_are_replaced_and_a_missing_host_or_port_is_added() -> None:
    got = direct_argv(["s", "--model=/c/m.gguf", "-t", "1"], "b", Path("/m"), "127.0.0.1", 5)
    assert got == ["b", "--model", "/m", "-t", "1", "--host", "127.0.0.1", "--port", "5"]


def test_a_command_without_a_model_is_refused() -> None:
    with pytest.raises(ValueError, match="names no model"):
        direct_argv(["llama-server", "--port", "1"], "b", Path("/m"), "127.0.0.1", 5)
