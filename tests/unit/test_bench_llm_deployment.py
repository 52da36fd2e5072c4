"""The pure helpers of benchmarks/llm_deployment.py: reading the pod's llama-server command line and
turning it into the direct server's."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.llm_deployment import (
    direct_argv,
    flag_value,
    parse_counters,
    prompt_seed,
    ratios,
    render,
    server_settings,
    server_work,
    side_order,
    tokens_per_cpu_second,
)

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


def _row(side: str, c: int, tps: float, ttft: float) -> dict[str, object]:
    return {"side": side, "concurrency": c, "output_tokens_per_s": tps, "ttft_ms_p50": ttft,
            "ttft_ms_p90": ttft, "itl_ms_p50": 10.0, "server_cpu_s": 4.0,
            "completed_requests": 8.0}  # fmt: skip


def test_ratios_are_the_deployment_over_direct_at_each_concurrency() -> None:
    rows = [_row("direct", 1, 20.0, 100.0), _row("deployment", 1, 19.0, 105.0)]
    assert ratios(rows, [1]) == [
        {"concurrency": 1, "tokens_per_s_ratio": 0.95, "ttft_p50_ratio": 1.05, "itl_p50_ratio": 1.0,
         "server_ms_per_token_ratio": None}
    ]  # fmt: skip


def test_the_results_block_names_the_starts_the_settings_and_the_ratios() -> None:
    res = {
        "config": {"settings": server_settings(POD), "server_cpus": "0", "client_cpus": "1",
                   "input_tokens": 32, "output_tokens": 16, "loadavg_1m_at_start": 3.0,
                   "loadavg_1m_at_end": 4.0},
        "startup": {"cold": {"engine_ready_s": 300.0, "endpoint_ready_s": 310.0, "first_token_s": 312.5},
                    "redeploy": {"engine_ready_s": 0.4, "endpoint_ready_s": 9.0, "first_token_s": 10.0}},
        "results": [_row("direct", 1, 20.0, 100.0), _row("deployment", 1, 19.0, 105.0)],
        "ratios": ratios([_row("direct", 1, 20.0, 100.0), _row("deployment", 1, 19.0, 105.0)], [1]),
    }  # fmt: skip
    text = render(res)
    assert "cold (empty store) 312.5 s (engine Ready at 300.0 s, endpoint ready at 310.0 s)" in text
    assert "redeploy (engine Ready) 10.0 s (endpoint ready at 9.0 s)" in text
    assert "checkpoint in the store" not in text  # not measured: not claimed
    assert "2 thread(s), batch 512, context 2048, 4 slots" in text
    assert "tokens/s 0.95x and TTFT p50 1.05x at c = 1" in text
    assert "one round" in text and "the supervisor beside them" in text
    assert "| 1 | 0     | deployment | 19.0     | 105.0       |" in text
    assert "| 32.0             |" in text.splitlines()[-1]  # 8 requests x 16 tokens / 4 CPU s


def test_tokens_per_cpu_second_is_absent_without_cpu_time() -> None:
    assert tokens_per_cpu_second({"completed_requests": 8.0, "server_cpu_s": 0.0}, 16) is None


def test_two_rounds_put_each_concurrency_in_abba_order() -> None:
    for i in range(3):
        first, second = side_order(0, i), side_order(1, i)
        assert sorted(first) == ["deployment", "direct"]
        assert second == first[::-1]  # A B, then B A
    assert side_order(0, 0) != side_order(0, 1)  # and the first side swaps between concurrencies


def _round(rnd: int, side: str, tps: float, ttft: float) -> dict[str, object]:
    return {**_row(side, 4, tps, ttft), "round": rnd}


def test_ratios_over_rounds_are_of_the_medians_and_each_round_is_kept() -> None:
    rows = [
        _round(0, "direct", 60.0, 100.0), _round(0, "deployment", 48.0, 150.0),
        _round(1, "deployment", 59.0, 101.0), _round(1, "direct", 61.0, 99.0),
        _round(2, "direct", 58.0, 102.0), _round(2, "deployment", 57.0, 103.0),
    ]  # fmt: skip
    got = ratios(rows, [4])[0]
    assert got["tokens_per_s_ratio"] == round(57.0 / 60.0, 2)  # one slow round does not decide it
    assert got["ttft_p50_ratio"] == round(103.0 / 100.0, 2)
    assert got["tokens_per_s_ratio_by_round"] == [0.8, round(59 / 61, 2), round(57 / 58, 2)]


def test_server_counters_give_its_own_decode_time_per_token() -> None:
    text = """# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 100
llamacpp:tokens_predicted_seconds_total 1.5
llamacpp:prompt_seconds_total 0.5
llamacpp:n_decode_total 90
llamacpp:requests_processing 0
"""
    before = parse_counters(text)
    after = {"tokens": 164.0, "decode_s": 2.46, "prompt_s": 0.9, "decodes": 130.0}
    assert before == {"tokens": 100.0, "decode_s": 1.5, "prompt_s": 0.5, "decodes": 90.0}
    assert server_work(before, after) == {
        "server_ms_per_token": 15.0, "server_prompt_s": 0.4, "server_decodes": 40
    }  # fmt: skip
    assert server_work({}, after)["server_ms_per_token"] is None  # a server without --metrics


def test_every_point_gets_fresh_prompts() -> None:
    seeds = [prompt_seed(r, i) for r in range(4) for i in range(3)]
    assert len(set(seeds)) == len(seeds)  # no point replays prompts a server has cached
