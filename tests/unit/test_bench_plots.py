"""What the serving plot draws as the ceiling (a pure function of the result file)."""

from __future__ import annotations

from benchmarks.plots import window_ceilings


def test_the_plot_takes_every_windows_ceiling_and_none_from_older_results() -> None:
    model = {
        "ceiling": {"best": {"images_per_s": 286.7}},
        "servers": {
            "trtforge": {
                "points": [{"concurrency": 8, "ceiling": 268.6}, {"concurrency": 32, "ceiling": 296.6}]
            },
            "triton": {"points": [{"concurrency": 8, "ceiling": 281.0}]},
        },
    }
    assert sorted(window_ceilings(model)) == [268.6, 281.0, 296.6]
    older = {"ceiling": model["ceiling"], "servers": {"trtforge": {"points": [{"concurrency": 8}]}}}
    assert window_ceilings(older) == []
