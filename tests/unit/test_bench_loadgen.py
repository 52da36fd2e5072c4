"""benchmarks.loadgen's throughput estimates of a closed loop from one window: ``window_share``
(the throughput), unbiased whatever the window's edges and the latencies' spread, and
``stream_rate`` (reported beside it), which uneven latencies bias up."""

from __future__ import annotations

import random

import pytest

from benchmarks.loadgen import stream_rate, window_share

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


def test_a_request_counts_for_its_part_inside_the_window() -> None:
    assert window_share(1.0, 2.0, 0.0, 10.0) == 1.0
    assert window_share(-1.0, 1.0, 0.0, 10.0) == pytest.approx(0.5)  # sent in the warm-up
    assert window_share(9.0, 13.0, 0.0, 10.0) == pytest.approx(0.25)  # answered after the window
    assert window_share(-1.0, 11.0, 0.0, 10.0) == pytest.approx(10 / 12)  # longer than the window
    assert window_share(-3.0, -1.0, 0.0, 10.0) == 0.0
    assert window_share(10.5, 11.0, 0.0, 10.0) == 0.0
    assert window_share(4.0, 4.0, 0.0, 10.0) == 1.0  # no measurable time, inside
    assert window_share(11.0, 11.0, 0.0, 10.0) == 0.0


@pytest.mark.parametrize("phase", [0.0, 0.1, 1.3, 2.4])
def test_a_bursty_server_reads_its_rate_by_shares_wherever_the_window_falls(phase: float) -> None:
    # As above: 64 workers, two instances, each answering a batch of 32 every 2.5 s (25.6/s).
    shares = 0.0
    for i in range(64):
        t = phase % 2.5 + (i % 2) * 1.25 - 5.0
        while t < WINDOW:
            shares += window_share(t, t + 2.5, 0.0, WINDOW)
            t += 2.5
    assert shares / WINDOW == pytest.approx(25.6)


def _uneven_windows(windows: int, workers: int, window: float) -> tuple[float, float, float]:
    """Closed-loop workers whose requests take 0.4 s or 2.6 s (3 to 2), as a server that serves its
    streams unevenly: the true rate, and the mean over `windows` windows of the shares' estimate and
    of the summed stream rates. Each window starts 20 s into its workers' loops."""
    rng = random.Random(16)
    mean = 0.6 * 0.4 + 0.4 * 2.6
    by_shares = by_streams = 0.0
    for _ in range(windows):
        shares, streams = 0.0, 0.0
        for _ in range(workers):
            t, answers = -20.0 - rng.uniform(0.0, 2.6), []
            while t < window:
                t1 = t + (0.4 if rng.random() < 0.6 else 2.6)
                shares += window_share(t, t1, 0.0, window)
                if 0.0 <= t1 <= window:
                    answers.append(t1)
                t = t1
            streams += stream_rate(len(answers), answers[0], answers[-1], window) if answers else 0.0
        by_shares += shares / window / windows
        by_streams += streams / windows
    return workers / mean, by_shares, by_streams


def test_uneven_latencies_bias_the_stream_rates_up_and_not_the_shares() -> None:
    # 32 workers, a 14.6 s window: ResNet-50's c=32 point on 2 cores. The latencies' spread
    # (mean 1.28 s, deviation 1.08 s) puts the stream rates ~7% above the rate (module docstring).
    rate, by_shares, by_streams = _uneven_windows(200, 32, 14.6)
    assert by_shares == pytest.approx(rate, rel=0.01)
    assert by_streams > 1.04 * rate
