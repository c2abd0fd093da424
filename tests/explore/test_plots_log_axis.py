"""The notebook's log axis (:func:`explore.plots.log_axis`): a few plain labels whose
boxes never overlap, over any range, on a wide figure or a narrow one."""

from __future__ import annotations

import math

import numpy as np
import pytest

from explore.plots import MOST_TICKS, log_axis, log_ticks

matplotlib = pytest.importorskip("matplotlib", reason="the notebook's plots need "
                                 "matplotlib (pip install -e '.[notebook]')")
matplotlib.use("Agg")
plt = pytest.importorskip("matplotlib.pyplot")

RANGES = [(0.05, 0.6), (0.2, 4.0), (0.3, 6.0), (1.2, 2.4), (2.0, 40.0), (0.55, 3.0),
          (0.3, 0.315), (1e-4, 1.05e-4), (0.8, 1.6), (0.01, 1e3), (1.0, 1e9)]


def labels(lo: float, hi: float, width: float, log: bool = True) -> list[tuple[str, object]]:
    """The labels drawn inside the view of an x axis over ``[lo, hi]``, with their
    boxes on the canvas."""
    fig, ax = plt.subplots(figsize=(width, 3))
    try:
        ax.scatter(np.geomspace(lo, hi, 20), np.linspace(0, 1, 20))
        if log:
            log_axis(ax, "x")
        else:
            ax.set_xscale("log")
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        a, b = ax.get_xlim()
        return [(t.get_text(), t.get_window_extent(renderer))
                for t in ax.get_xticklabels(which="both")
                if t.get_text() and a <= t.get_position()[0] <= b]
    finally:
        plt.close(fig)


def overlapping(drawn: list[tuple[str, object]]) -> list[tuple[str, str]]:
    return [(a, b) for i, (a, box) in enumerate(drawn) for b, other in drawn[i + 1:]
            if box.overlaps(other)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("lo, hi", RANGES)
def test_log_axis_labels_are_few_and_do_not_overlap(lo: float, hi: float) -> None:
    for width in (7, 4):
        drawn = labels(lo, hi, width)
        assert 2 <= len(drawn) <= MOST_TICKS, drawn
        assert not overlapping(drawn), (width, [t for t, _ in drawn])
        for text, _ in drawn:  # plain numbers, not 3×10⁻¹ in mathtext
            assert lo * (1 - 1e-9) <= float(text) <= hi * (1 + 1e-9)


def test_matplotlibs_own_log_axis_overlaps_where_ours_does_not() -> None:
    """The case the notebook met: a range of a decade or so labels its minor ticks."""
    assert overlapping(labels(0.2, 4.0, 7, log=False))
    assert not overlapping(labels(0.2, 4.0, 7))


@pytest.mark.parametrize("lo, hi", [*RANGES, (5.0, 5.0001), (3e-7, 2e-7)])
def test_log_ticks_lie_in_the_range_in_order(lo: float, hi: float) -> None:
    ticks = log_ticks(lo, hi)
    assert 2 <= len(ticks) <= MOST_TICKS
    assert ticks == sorted(ticks) and len(set(ticks)) == len(ticks)
    low, high = sorted((lo, hi))
    assert all(low * (1 - 1e-9) <= t <= high * (1 + 1e-9) for t in ticks)
    # over a wide range, powers of ten only
    if math.log10(high / low) >= 2:
        assert all(math.log10(t).is_integer() for t in ticks)


def test_log_axis_takes_x_or_y() -> None:
    fig, ax = plt.subplots()
    try:
        log_axis(ax, "y")
        assert ax.get_yscale() == "log"
        with pytest.raises(ValueError, match="'x' or 'y'"):
            log_axis(ax, "z")
    finally:
        plt.close(fig)
