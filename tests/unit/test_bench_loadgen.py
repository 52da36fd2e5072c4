"""benchmarks.loadgen.stream_rate: a closed-loop worker's answer rate, whatever the window's edges."""

from __future__ import annotations

import pytest

from benchmarks.loadgen import stream_rate

WINDOW = 10.0


def _answers(phase: float, period: float) -> list[float]:
    """The times inside [0, WINDOW] of a stream answered every `period` s, once at `phase`."""
    out, t = [], phase % period
    while t <= WINDOW:
        out.append(t)
        t += period
    return out


def _rate(times: list[float]) -> float:
    return stream_rate(len(times), times[0] if times else 0.0, times[-1] if times else 0.0, WINDOW)


def test_a_steady_stream_is_its_answer_rate() -> None:
    assert _rate(_answers(0.05, 0.1)) == pytest.approx(10.0)


@pytest.mark.parametrize("phase", [0.0, 0.1, 1.3, 2.4])
def test_a_bursty_server_reads_the_same_wherever_the_window_falls(phase: float) -> None:
    # Two instances, each answering a batch of 32 every 2.5 s: 25.6 answers/s. Counted over the
    # window, the same server reads 25.6, 28.8 or 32 depending on where the edges fall.
    streams = [_answers(phase + (i % 2) * 1.25, 2.5) for i in range(64)]
    assert sum(_rate(s) for s in streams) == pytest.approx(25.6)


def test_a_window_of_whole_batches_over_counts_and_the_stream_rate_does_not() -> None:
    streams = [_answers(0.0, 2.5) for _ in range(64)]  # answers at 0, 2.5, 5, 7.5 and 10
    assert sum(len(s) for s in streams) / WINDOW == pytest.approx(32.0)
    assert sum(_rate(s) for s in streams) == pytest.approx(25.6)


def test_fewer_than_two_answers_fall_back_to_answers_over_the_window() -> None:
    assert stream_rate(1, 3.0, 3.0, WINDOW) == pytest.approx(0.1)
    assert stream_rate(0, 0.0, 0.0, WINDOW) == 0.0
    assert stream_rate(3, 1.0, 1.0, WINDOW) == pytest.approx(0.3)  # no span to divide by
