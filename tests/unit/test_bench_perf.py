"""How a perf_analyzer report becomes a serving point, and the command that asks for one (pure
functions; the reports are perf_analyzer 2.40's own ``-f`` output, against trtforge serve and Triton)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.perf import Windows, command, parse_csv

# trtforge serve has no statistics extension: client-side columns only.
TRTFORGE_CSV = (
    "Concurrency,Inferences/Second,Client Send,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency\n"
    "1,54.0237,284,0,16901,32526,38046,69612\n"
)
# Triton reports its queue and compute times beside the client's.
TRITON_CSV = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency\n"
    "8,47.8251,145,19993,67423,278,80485,515,0,168872,244221,257765,268577\n"
)


def test_a_report_without_server_statistics_gives_the_clients_numbers_in_milliseconds() -> None:
    (p,) = parse_csv(TRTFORGE_CSV)
    assert (p.concurrency, p.throughput) == (1, 54.02)
    assert (p.p50_ms, p.p90_ms, p.p95_ms, p.p99_ms) == (16.901, 32.526, 38.046, 69.612)
    assert p.avg_ms is None and p.server_queue_ms is None and p.server_compute_ms is None


def test_a_report_with_server_statistics_adds_queue_and_compute() -> None:
    (p,) = parse_csv(
        TRITON_CSV + "\nServer Metrics\nsomething,else\n"
    )  # a block after the table is not a point
    assert (p.concurrency, p.throughput, p.p99_ms) == (8, 47.83, 268.577)
    assert p.server_queue_ms == 67.423
    assert p.server_compute_ms == pytest.approx(0.278 + 80.485 + 0.515)


def test_a_report_without_the_rate_or_latency_columns_is_refused() -> None:
    with pytest.raises(ValueError, match="not a perf_analyzer concurrency report"):
        parse_csv("Request Rate,Inferences/Second,p50 latency\n10,9.9,100\n")
    with pytest.raises(ValueError, match="not a perf_analyzer concurrency report"):
        parse_csv("")


def test_the_command_is_one_concurrency_with_the_windows_rules() -> None:
    cmd = command(
        "127.0.0.1:8000", "http", "resnet50", 32, Windows(7500, 15, 6), Path("r.csv"), Path("in.json")
    )
    assert cmd[1:] == [
        *("-m", "resnet50", "-u", "127.0.0.1:8000", "-i", "http", "-b", "1"),
        "--concurrency-range=32:32",
        "--measurement-interval=7500",
        "--stability-percentage=15",
        "--max-trials=6",
        "--input-data=in.json",
        *("-f", "r.csv"),
    ]


def test_json_tensors_are_asked_for_over_http_only_and_a_bad_protocol_is_refused() -> None:
    def tensors(protocol: str) -> list[str]:
        cmd = command("h:1", protocol, "m", 1, Windows(), Path("r"), Path("d"), json_tensors=True)
        return [f for f in cmd if "tensor-format" in f]

    assert tensors("http") == ["--input-tensor-format=json", "--output-tensor-format=json"]
    assert tensors("grpc") == []
    with pytest.raises(ValueError, match="protocol 'json': expected one of"):
        command("h:1", "json", "m", 1, Windows(), Path("r"), Path("d"))
